//! A store watch in trouble while get, list and writes work (no `watch` right on a kind, a
//! proxy or store member that cuts watch streams): the operator must go on deciding from what
//! the store holds, not from a copy that stopped changing. What a user sees: new Services
//! still get IPs; a live node keeps its pod CIDR block.
//!
//! - On Kubernetes (a real kube-apiserver when `KUBEBUILDER_ASSETS` names one, the stand-in
//!   otherwise), `ipamd --role operator` runs with the `watch` right on Services taken away
//!   from its ClusterRole.
//! - On real etcd, the operator's controllers run in this process over an etcd store whose
//!   watches of node leases and Services fail at once after their first list (a wrapper: etcd
//!   has no right that allows a range read and refuses a watch of it), behind the daemon's
//!   own shared watches.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use ipam_config::{ClusterSettings, PoolConfig};
use ipam_core::{
    lb::resources::{LbIpPool, Service},
    pod::pool::IpamMode,
    resources::{NodeIpam, node_lease_name},
    store::{
        RawObject, Resource as _, Revision, Store, StoreError, TypedStore as _, Watch, WatchEvent,
        lease::Lease,
    },
};
use ipam_daemon::{
    cluster::{
        events::Events,
        operator::{self, Leader, OperatorSettings, PodIpamSettings},
        shared_watch::SharedWatches,
    },
    metrics::{KindLabel, Observed},
};
use ipam_etcd::{
    EtcdStore,
    testing::{EtcdCluster, unique_prefix},
};
use ipam_tests::{
    TempFile,
    daemon::Daemon,
    http::http_get_path,
    kube_api::{Who, kubeconfig_for, start_api},
    workspace_binary,
};

type Feed = tokio::sync::mpsc::Sender<Result<WatchEvent, StoreError>>;

/// Real etcd, with the watches of `cut` kinds failing at once after their first list, as
/// behind a proxy that cuts every watch stream: the watch reports the error once and never
/// delivers again. Gets, lists and writes go to etcd.
#[derive(Clone)]
struct CutWatches {
    etcd: Arc<EtcdStore>,
    cut: &'static [&'static str],
    /// The cut watches' feeds, kept open: a store's watch that retries in vain.
    cut_feeds: Arc<Mutex<Vec<Feed>>>,
}

/// `CutWatches` with its watches served by the daemon's shared watches, as `ClusterStore`
/// serves them over the configured store.
#[derive(Clone)]
struct Shared {
    store: CutWatches,
    hub: Arc<SharedWatches>,
}

/// Everything to `$inner`, but for `watch`.
macro_rules! delegate {
    ($inner:ident) => {
        async fn get(&self, kind: &str, name: &str) -> Result<Option<RawObject>, StoreError> {
            self.$inner.get(kind, name).await
        }
        async fn list(&self, kind: &str) -> Result<Vec<RawObject>, StoreError> {
            self.$inner.list(kind).await
        }
        async fn create(
            &self,
            kind: &str,
            name: &str,
            value: Vec<u8>,
        ) -> Result<Revision, StoreError> {
            self.$inner.create(kind, name, value).await
        }
        async fn update(
            &self,
            kind: &str,
            name: &str,
            value: Vec<u8>,
            expected: &Revision,
        ) -> Result<Revision, StoreError> {
            self.$inner.update(kind, name, value, expected).await
        }
        async fn update_status(
            &self,
            kind: &str,
            name: &str,
            value: Vec<u8>,
            expected: &Revision,
        ) -> Result<Revision, StoreError> {
            self.$inner.update_status(kind, name, value, expected).await
        }
        async fn delete(
            &self,
            kind: &str,
            name: &str,
            expected: Option<&Revision>,
        ) -> Result<(), StoreError> {
            self.$inner.delete(kind, name, expected).await
        }
    };
}

impl Store for CutWatches {
    delegate!(etcd);

    async fn watch(&self, kind: &str) -> Result<Watch, StoreError> {
        let watch = self.etcd.watch(kind).await?;
        if !self.cut.contains(&kind) {
            return Ok(watch);
        }
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tx.try_send(Err(StoreError::Backend {
            location: "etcd".into(),
            source: format!("the watch stream of {kind} was cut (by the test)").into(),
        }))
        .expect("room for the error");
        self.cut_feeds.lock().unwrap().push(tx);
        Ok(Watch::new(watch.initial, watch.revision, rx))
    }
}

impl Store for Shared {
    delegate!(store);

    async fn watch(&self, kind: &str) -> Result<Watch, StoreError> {
        self.hub.watch(&self.store, kind).await
    }
}

fn millis_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

async fn wait_until<T>(
    what: &str,
    within: Duration,
    mut probe: impl AsyncFnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// With the node leases' and Services' watches cut on etcd, a node that keeps renewing its
/// lease keeps its block past several grace periods, and a Service made after the cut gets
/// an IP. Before the fix the shared watch swallowed the error: the lease copy froze (the node
/// looked unrenewed and its block went back to the pool after one grace period) and the
/// Service copy froze (LB-IPAM skipped every pass: no IP).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_watches_cut_on_etcd_live_nodes_keep_blocks_and_services_get_ips() {
    let etcd = EtcdCluster::start(1).expect("an etcd member (is etcd-server installed?)");
    let raw = EtcdStore::connect(etcd.config(&unique_prefix("watch-cut")))
        .await
        .expect("connect to etcd");
    let store = Shared {
        store: CutWatches {
            etcd: Arc::new(raw),
            cut: &[Lease::KIND, Service::KIND],
            cut_feeds: Arc::default(),
        },
        hub: Arc::new(SharedWatches::new("etcd (the test's)".into())),
    };
    let observed = Observed::default();
    store.hub.count_in(&observed);

    // A live node: its record, and its lease renewed every 300 ms (as an agent renews it).
    store
        .create_typed("n1", &NodeIpam::default())
        .await
        .unwrap();
    let lease_name = node_lease_name("n1");
    let lease = |renewed: u64| Lease {
        holder: "n1".into(),
        duration_ms: 1500,
        renew_time_ms: renewed,
        transitions: 0,
    };
    store
        .create_typed(&lease_name, &lease(millis_now()))
        .await
        .unwrap();
    let renewer = {
        let store = store.clone();
        let lease_name = lease_name.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(300)).await;
                if let Ok(Some(current)) = store.get_typed::<Lease>(&lease_name).await {
                    let _ = store
                        .update_typed(&lease_name, &lease(millis_now()), &current.revision)
                        .await;
                }
            }
        })
    };

    let grace = Duration::from_millis(3000);
    let pools: Vec<PoolConfig> = vec![
        serde_json::from_value(serde_json::json!({
            "name": "default",
            "ipv4": { "cidrs": ["10.243.0.0/24"], "maskSize": 26 },
        }))
        .expect("a pool"),
    ];
    let settings = OperatorSettings {
        pod_ipam: Some(PodIpamSettings {
            mode: IpamMode::ClusterPool,
            pools: pools.clone(),
        }),
        cluster: ClusterSettings {
            node_lease_ms: 1500,
            node_renew_ms: 500,
            node_grace_ms: grace.as_millis() as u64,
            operator_lease_ms: 3000,
            resync_ms: 30_000,
            identity: Some("operator-under-test".into()),
        },
        elect: true,
    };
    let (_pools_tx, pools_rx) = tokio::sync::watch::channel(pools);
    let (leader_tx, _leader_rx) = tokio::sync::watch::channel(Leader::default());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let running = tokio::spawn(operator::run(
        store.clone(),
        settings,
        pools_rx,
        leader_tx,
        stop_rx,
        observed.clone(),
        Events::None,
    ));

    let block_of_n1 = async || {
        let record = store.get_typed::<NodeIpam>("n1").await.ok()??;
        record.value.status.allocated.first().map(|b| b.cidr)
    };
    let block = wait_until("n1's block", Duration::from_secs(20), block_of_n1).await;

    // A pool, then a Service made after the Services' watch was cut.
    let pool: LbIpPool = serde_json::from_value(serde_json::json!({
        "spec": { "blocks": [{ "cidr": "10.88.0.0/29" }] },
    }))
    .unwrap();
    store.create_typed("lb", &pool).await.unwrap();
    let service: Service = serde_json::from_value(serde_json::json!({
        "spec": { "type": "LoadBalancer", "ports": [{ "port": 80, "protocol": "TCP" }] },
    }))
    .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    store.create_typed("web", &service).await.unwrap();
    // Over three grace periods from the node's first block, the live node keeps it; within
    // that time and up to 30 s, the Service gets an IP. Both are looked at before either is
    // judged, so a failure says what a user saw of each.
    let since = Instant::now();
    let mut lost_after = None;
    let mut ip = None;
    while since.elapsed() < 3 * grace || (ip.is_none() && since.elapsed() < Duration::from_secs(30))
    {
        if lost_after.is_none() && since.elapsed() < 3 * grace && block_of_n1().await != Some(block)
        {
            lost_after = Some(since.elapsed());
        }
        if ip.is_none()
            && let Ok(Some(web)) = store.get_typed::<Service>("web").await
        {
            ip = web.value.status.ingress.first().copied();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        lost_after.is_none() && ip.is_some(),
        "n1 renews its lease, yet lost its block {block} after {lost_after:?} (None: kept it); \
         Service web made after the cut got IP {ip:?} within 30 s (None: no IP)"
    );
    let ip = ip.unwrap();
    assert!(ip.to_string().starts_with("10.88.0."), "{ip}");

    // Whoever watches says which kinds' copies are stale.
    for kind in [Lease::KIND, Service::KIND] {
        let label = KindLabel { kind: kind.into() };
        assert_eq!(
            observed
                .metrics
                .store_watch_stale
                .get_or_create(&label)
                .get(),
            1,
            "{kind} counts stale"
        );
        assert!(
            observed
                .metrics
                .store_watch_errors
                .get_or_create(&label)
                .get()
                >= 1
        );
    }
    let label = KindLabel {
        kind: NodeIpam::KIND.into(),
    };
    assert_eq!(
        observed
            .metrics
            .store_watch_stale
            .get_or_create(&label)
            .get(),
        0,
        "a kind whose watch works is not stale"
    );

    renewer.abort();
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(10), running).await;
}

/// The operator's configuration for the Kubernetes store in the add-on mode (LB-IPAM only),
/// its metrics at `metrics`.
fn add_on_config(metrics: u16) -> TempFile {
    let config = TempFile::new("kube-operator", "toml");
    std::fs::write(
        &config.0,
        format!(
            "[store]\nkind = \"kubernetes\"\n[store.kubernetes]\nnamespace = \"ipam-system\"\n\n\
             [cluster]\nnode_lease_ms = 1500\nnode_grace_ms = 600000\nnode_renew_ms = 1000\n\
             operator_lease_ms = 3000\n\n[metrics]\nlisten = \"127.0.0.1:{metrics}\"\n"
        ),
    )
    .expect("write the operator configuration");
    config
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// The operator without the `watch` right on Services (list, get and the status patch
/// left): a Service made after it started gets an IP, and the operator says which kind's
/// watch fails and counts it stale. Before the fix its Service copy stayed as first listed
/// and LB-IPAM skipped every pass: the Service never got an IP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_get_ips_when_the_operator_may_not_watch_them() {
    let api = start_api("services_get_ips_when_the_operator_may_not_watch_them").await;
    api.refuse(
        &Who::Operator.user(&api),
        "ipam-operator",
        "",
        "services",
        "watch",
    )
    .await;
    let kubeconfig = kubeconfig_for(&api, Who::Operator).await;
    let admin = kubeconfig_for(&api, Who::Ipamctl).await;
    let port = free_port();
    let config = add_on_config(port);
    let operator = Daemon::start_on_host(
        &config.0,
        &["--role", "operator"],
        &[("KUBECONFIG", &kubeconfig.0)],
    );
    let log = || operator.log_text();

    // The pool, applied with ipamctl as an admin does.
    let manifest = TempFile::new("kube-lb", "yaml");
    std::fs::write(
        &manifest.0,
        "kind: LoadBalancerIPPool\nmetadata:\n  name: lb\nspec:\n  blocks:\n  - cidr: 10.77.5.0/29\n",
    )
    .unwrap();
    let applied = std::process::Command::new(workspace_binary("ipamctl"))
        .args(["apply", "-f"])
        .arg(&manifest.0)
        .arg("--config")
        .arg(&config.0)
        .env("KUBECONFIG", &admin.0)
        .output()
        .expect("run ipamctl apply");
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );

    // The Services' watch has been refused (the operator listed them first): only now the
    // Service is made, so that only a read after the refusal can show it.
    wait_until("the refused watch", Duration::from_secs(20), async || {
        log().contains("forbidden").then_some(())
    })
    .await;
    let services = ipam_tests::kube_api::create_web_service(&api).await;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(40);
    let ingress = loop {
        let ip = services
            .get("web")
            .await
            .ok()
            .and_then(|s| s.status?.load_balancer?.ingress?.first()?.ip.clone());
        if let Some(ip) = ip {
            break ip;
        }
        assert!(
            Instant::now() < deadline,
            "Service web got no IP within 40 s while the operator may not watch Services; \
             log:\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(ingress.starts_with("10.77.5."), "{ingress}");
    println!(
        "the Service got {ingress} {} ms after it was made",
        started.elapsed().as_millis()
    );

    let text = log();
    assert!(
        text.contains("the Service watch on") && text.contains("RBAC `watch`"),
        "the log names the kind and what to check:\n{text}"
    );
    let metrics = http_get_path(
        ([127, 0, 0, 1], port).into(),
        "/metrics",
        Duration::from_secs(2),
    )
    .unwrap_or_else(|e| panic!("the operator's metrics: {e}"));
    assert!(
        metrics.contains("ipam_store_watch_stale{kind=\"Service\"} 1"),
        "{metrics}"
    );
}
