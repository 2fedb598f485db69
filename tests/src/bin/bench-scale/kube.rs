//! The Kubernetes half: the cluster on the Kubernetes store at 1,000 nodes and 10,000
//! LoadBalancer Services, against a real kube-apiserver when `KUBEBUILDER_ASSETS` names one
//! (deploy/'s CRDs, RBAC and admission policy applied; each client with its own identity), the
//! in-process stand-in otherwise (said in the output).
//!
//! Who runs:
//! - a real `ipamd --role operator`, on the host, with the operator's service account;
//! - `IPAM_BENCH_SCALE_KUBE_AGENTS` (10 by default) real `ipamd --role agent` processes, each
//!   in its own network namespace on one bridge, gossiping, at deploy/'s timings,
//!   with tokens bound to a pod on their node; each reaches the API through a relay that counts
//!   its bytes;
//! - the other nodes simulated (`IPAM_BENCH_SCALE_KUBE_NODES`, 1,000 nodes in all): each a
//!   Node object, its node record (`NodeIpam`, as the agent registers it) and its lease renewed
//!   every 10 s by the agent's own code (`LeaseRenewal::renew`, what `liveness::lease` runs).
//!   A simulated node opens no watch and does not gossip (its record lists no address, so the
//!   real agents' gossip does not count it): the watches and the gossip are measured on the
//!   real agents, whose costs do not depend on how many of the others are real.
//!
//! Measured:
//! - `kube_blocks_s`: every node record written at once; seconds until each holds a block;
//! - at rest with no Service, then with 10,000: the API server's requests per second by
//!   client, verb and resource (its audit log, or the stand-in's count), and each real agent's
//!   bytes to and from the API (the relay), CPU and RSS; the operator's CPU and RSS;
//! - `lb_assign_s`: the Services created first with no LB pool (they wait, as in the seed's
//!   crash loop, but nothing crashes), then the pool: seconds until all of them hold an IP.
//!   Each IP is one status write to the API server; `api_write_limit_s` is how long the same
//!   server took to take as many writes from the bench (the Services' creation, 32 in
//!   flight), the floor under `lb_assign_s` on this machine;
//! - `agent_mb_for_services`: what one agent received while the Services arrived.

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use futures_util::StreamExt as _;
use ipam_core::{
    lb::resources::{LbIpBlock, LbIpPool, Service},
    resources::{NodeIpam, node_lease_name},
    store::{Resource as _, Store as _, TypedStore as _, WatchEvent, decode, lease::LeaseRenewal},
};
use ipam_kube::{KubeStore, test_api::TestApi};
use ipam_tests::{
    TempFile,
    cluster::nodes_holding_blocks,
    daemon::Daemon,
    failover::{segment_pool, uplink_policy},
    kube_api::{AgentNode, DEPLOY_TIMINGS, Who, kubeconfig_for, start_api},
    netns::{Netns, veth},
    relay::Traffic,
};

use crate::procfs::{cpu_pct, cpu_ticks, mean, rss_mb};

/// The pod pool: /24 blocks of a /9 (32,768 nodes), clear of the nodes' segment.
const POD_POOL: &str = "[[ipam.pool]]\nname = \"default\"\n\
    ipv4 = { cidrs = [\"10.128.0.0/9\"], maskSize = 24 }\n";
/// The LB pool, inside the nodes' segment (10.77.0.0/16): 16,384 addresses.
const LB_CIDR: &str = "10.77.128.0/18";
/// The agents' lease renewal at a deployment's defaults (`[cluster] node_renew_ms`).
const RENEW: Duration = Duration::from_secs(10);
const LEASE: Duration = Duration::from_secs(15);
/// Requests in flight while the bench writes its objects.
const IN_FLIGHT: usize = 32;
/// Tasks renewing the simulated nodes' leases, each a share of the nodes in turn.
const RENEWERS: usize = 8;

/// The half's figures.
pub(crate) struct KubeFigures {
    api: &'static str,
    nodes: usize,
    services: usize,
    agents: usize,
    blocks_s: f64,
    services_created_per_s: f64,
    assign_s: f64,
    agent_mb_for_services: f64,
    empty: Rest,
    full: Rest,
}

/// One window at rest.
struct Rest {
    seconds: f64,
    /// (client, verb, resource) -> requests per second.
    requests: BTreeMap<(String, String, String), f64>,
    agent_rx_bytes_per_s: f64,
    agent_tx_bytes_per_s: f64,
    agent_cpu_pct: f64,
    agent_rss_mb: f64,
    operator_cpu_pct: f64,
    operator_rss_mb: f64,
}

impl Rest {
    fn requests_per_s(&self, client: Option<&str>) -> f64 {
        self.requests
            .iter()
            .filter(|((c, _, _), _)| client.is_none_or(|want| c == want))
            .map(|(_, n)| n)
            // Not `sum`: the sum of no f64 is -0.0, printed "-0.000".
            .fold(0.0, |total, n| total + n)
    }
}

impl KubeFigures {
    pub(crate) fn keys(&self) -> String {
        let (e, f) = (&self.empty, &self.full);
        format!(
            "kube_api={} kube_nodes={} kube_services={} kube_blocks_s={:.2} lb_assign_s={:.2} \
             api_write_limit_s={:.2} services_created_per_s={:.0} operator_rss_mb={:.1} \
             operator_cpu_pct_at_rest={:.2} \
             api_requests_per_s_at_rest={:.2} api_requests_per_s_at_rest_no_services={:.2} \
             agent_requests_per_s_at_rest={:.3} agent_rx_bytes_per_s_at_rest={:.0} \
             agent_rx_bytes_per_s_at_rest_no_services={:.0} agent_mb_for_services={:.1} \
             agent_rss_mb_kube={:.1} agent_cpu_pct_kube={:.2}",
            self.api,
            self.nodes,
            self.services,
            self.blocks_s,
            self.assign_s,
            self.services as f64 / self.services_created_per_s,
            self.services_created_per_s,
            f.operator_rss_mb,
            f.operator_cpu_pct,
            f.requests_per_s(None),
            e.requests_per_s(None),
            f.requests_per_s(Some("agent")) / self.agents as f64,
            f.agent_rx_bytes_per_s,
            e.agent_rx_bytes_per_s,
            self.agent_mb_for_services,
            f.agent_rss_mb,
            f.agent_cpu_pct,
        )
    }
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).map_or(default, |v| {
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}: a number"))
    })
}

/// The whole half, at rest for `rest` in each window.
pub(crate) fn run(rest: Duration) -> KubeFigures {
    let nodes = env_or("IPAM_BENCH_SCALE_KUBE_NODES", 1000);
    let services = env_or("IPAM_BENCH_SCALE_SERVICES", 10_000);
    let agents = env_or("IPAM_BENCH_SCALE_KUBE_AGENTS", 10);
    assert!(
        agents <= nodes && agents <= 250,
        "up to 250 real agents, and no more than the nodes"
    );
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(measure(nodes, services, agents, rest))
}

/// The real agents: their nodes, namespaces and processes.
struct RealAgents {
    nodes: Vec<AgentNode>,
    daemons: Vec<Daemon>,
    _fabric: Netns,
    _key: TempFile,
    _configs: Vec<TempFile>,
}

impl RealAgents {
    async fn start(api: &TestApi, names: &[String]) -> Self {
        let fabric = Netns::new("ksf");
        fabric.add_bridge("br0");
        let key = TempFile::new("kube-scale-gossip", "key");
        std::fs::write(&key.0, ipam_tests::cluster::random_key_hex()).expect("write the key");
        let mut nodes = Vec::new();
        let mut configs = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let node = AgentNode::new(api, &format!("ks{i}"), name).await;
            veth(&node.ns, "up0", &fabric, &format!("ksp{i}"));
            fabric.add_port(&format!("ksp{i}"), "br0");
            let address = format!("10.77.0.{}", i + 1);
            node.ns.add_address("up0", &format!("{address}/16"));
            let ipam =
                format!("mode = \"cluster-pool\"\nnode_name = \"{name}\"\nuplinks = [\"up0\"]");
            configs.push(node.config_timed(&ipam, &address, &key.0, DEPLOY_TIMINGS));
            nodes.push(node);
        }
        let daemons = nodes
            .iter()
            .zip(&configs)
            .map(|(node, config)| node.start(config))
            .collect();
        Self {
            nodes,
            daemons,
            _fabric: fabric,
            _key: key,
            _configs: configs,
        }
    }

    fn traffic(&self) -> Vec<Arc<Traffic>> {
        self.nodes.iter().map(|n| n.traffic.clone()).collect()
    }

    fn pids(&self) -> Vec<i32> {
        self.daemons.iter().map(Daemon::pid).collect()
    }
}

async fn measure(nodes: usize, services: usize, agents: usize, rest: Duration) -> KubeFigures {
    println!("\n== Kubernetes store: {nodes} nodes ({agents} real agents), {services} Services");
    let api = start_api("bench scale (Kubernetes store)").await;
    let api_name = match api {
        TestApi::Real(_) => "real",
        TestApi::StandIn(_) => "stand-in",
    };
    let store = KubeStore::new(api.client().await, "ipam-system");
    let real_names: Vec<String> = (0..agents).map(|i| format!("scale-real-{i:03}")).collect();
    let simulated: Vec<String> = (agents..nodes)
        .map(|i| format!("scale-sim-{i:04}"))
        .collect();

    create_nodes(&api, real_names.iter().chain(&simulated)).await;
    store
        .create_typed("uplinks", &uplink_policy())
        .await
        .expect("create the L2 announcement policy");

    let operator_kubeconfig = kubeconfig_for(&api, Who::Operator).await;
    let operator_config = TempFile::new("kube-scale-operator", "toml");
    std::fs::write(
        &operator_config.0,
        format!(
            "[store]\nkind = \"kubernetes\"\n[store.kubernetes]\nnamespace = \"ipam-system\"\n\n\
             [ipam]\nmode = \"cluster-pool\"\n{POD_POOL}"
        ),
    )
    .expect("write the operator's configuration");
    let operator = Daemon::start_on_host(
        &operator_config.0,
        &["--role", "operator"],
        &[("KUBECONFIG", &operator_kubeconfig.0)],
    );

    // Cold start: the real agents launched and the simulated nodes' records written at once.
    let started = Instant::now();
    let real = RealAgents::start(&api, &real_names).await;
    register(&store, &simulated).await;
    let _renewals = renew_leases(&store, &simulated);
    let logs = || {
        std::iter::once(&operator)
            .chain(&real.daemons)
            .map(|d| tail(&d.log_text()))
            .collect::<Vec<_>>()
            .join("\n--\n")
    };
    let blocks_s = wait_for_blocks(&store, nodes, started, logs).await;
    println!("every one of {nodes} nodes holds a block after {blocks_s:.2} s");
    tokio::time::sleep(Duration::from_secs(10)).await;

    let empty = at_rest(&api, &real, &operator, rest).await;
    print_rest("no Service", &empty);

    api.create_namespace("scale", serde_json::json!({})).await;
    let before_services: Vec<u64> = real.traffic().iter().map(|t| t.received()).collect();
    let created_at = Instant::now();
    create_services(&api, services).await;
    let services_created_per_s = services as f64 / created_at.elapsed().as_secs_f64();
    println!(
        "{services} LoadBalancer Services created in {:.1} s ({services_created_per_s:.0}/s), \
         before any LB pool",
        created_at.elapsed().as_secs_f64()
    );
    let pool_at = Instant::now();
    store
        .create_typed("scale", &scale_pool())
        .await
        .expect("create the LB pool");
    let assign_s = wait_for_ips(&store, services, pool_at, &operator).await;
    println!("every Service holds an IP {assign_s:.2} s after the pool was created");
    tokio::time::sleep(Duration::from_secs(15)).await;
    let agent_mb_for_services = mean(
        &real
            .traffic()
            .iter()
            .zip(&before_services)
            .map(|(t, before)| (t.received() - before) as f64 / 1e6)
            .collect::<Vec<_>>(),
    );

    let full = at_rest(&api, &real, &operator, rest).await;
    print_rest(&format!("{services} Services"), &full);
    drop(real);
    KubeFigures {
        api: api_name,
        nodes,
        services,
        agents,
        blocks_s,
        services_created_per_s,
        assign_s,
        agent_mb_for_services,
        empty,
        full,
    }
}

/// The Node objects, as the kubelets register them.
async fn create_nodes<'a>(api: &TestApi, names: impl Iterator<Item = &'a String>) {
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(api.client().await);
    let creates = names.map(|name| {
        let nodes = nodes.clone();
        async move {
            let node = serde_json::from_value(serde_json::json!({
                "metadata": { "name": name, "labels": { "kubernetes.io/hostname": name } },
            }))
            .expect("a Node");
            nodes
                .create(&kube::api::PostParams::default(), &node)
                .await
                .unwrap_or_else(|e| panic!("create Node {name}: {e}"));
        }
    });
    futures_util::stream::iter(creates)
        .buffer_unordered(IN_FLIGHT)
        .collect::<Vec<()>>()
        .await;
}

/// The simulated nodes' records, as an agent registers its node (no address: out of the
/// gossip).
async fn register(store: &KubeStore, names: &[String]) {
    let creates = names.iter().map(|name| async move {
        store
            .create_typed(name, &NodeIpam::default())
            .await
            .unwrap_or_else(|e| panic!("register node {name}: {e}"))
    });
    futures_util::stream::iter(creates)
        .buffer_unordered(IN_FLIGHT)
        .collect::<Vec<_>>()
        .await;
}

/// Renews every simulated node's lease every `RENEW`, spread evenly over the interval, with the
/// agent's own renewal; stops when the returned handles drop.
fn renew_leases(store: &KubeStore, names: &[String]) -> Vec<AbortOnDrop> {
    let share = names.len().div_ceil(RENEWERS).max(1);
    names
        .chunks(share)
        .map(|chunk| {
            let store = store.clone();
            let mut renewals: Vec<LeaseRenewal> = chunk
                .iter()
                .map(|n| LeaseRenewal::new(&node_lease_name(n), n, LEASE))
                .collect();
            AbortOnDrop(tokio::spawn(async move {
                let mut tick = tokio::time::interval(RENEW / renewals.len() as u32);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                for i in (0..renewals.len()).cycle() {
                    tick.tick().await;
                    if let Err(e) = renewals[i].renew(&store).await {
                        eprintln!("a simulated node's lease renewal failed: {e}");
                    }
                }
            }))
        })
        .collect()
}

/// A task aborted when this drops.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Seconds from `since` until `nodes` node records hold a block.
async fn wait_for_blocks(
    store: &KubeStore,
    nodes: usize,
    since: Instant,
    logs: impl Fn() -> String,
) -> f64 {
    loop {
        let served = nodes_holding_blocks(store, "").await;
        if served >= nodes {
            return since.elapsed().as_secs_f64();
        }
        assert!(
            since.elapsed() < Duration::from_secs(120),
            "only {served} of {nodes} nodes hold a block after 2 minutes; the logs:\n{}",
            logs()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// `count` Services of type LoadBalancer in namespace `scale`, as users create them.
async fn create_services(api: &TestApi, count: usize) {
    let services: kube::Api<k8s_openapi::api::core::v1::Service> =
        kube::Api::namespaced(api.client().await, "scale");
    let creates = (0..count).map(|i| {
        let services = services.clone();
        async move {
            let name = format!("svc-{i:05}");
            // No node ports: 10,000 LoadBalancer Services would exhaust their range.
            let service = serde_json::from_value(serde_json::json!({
                "metadata": { "name": name, "namespace": "scale" },
                "spec": { "type": "LoadBalancer", "allocateLoadBalancerNodePorts": false,
                          "ports": [{ "port": 80, "protocol": "TCP" }] },
            }))
            .expect("a Service");
            services
                .create(&kube::api::PostParams::default(), &service)
                .await
                .unwrap_or_else(|e| panic!("create Service scale/{name}: {e}"));
        }
    });
    futures_util::stream::iter(creates)
        .buffer_unordered(IN_FLIGHT)
        .collect::<Vec<()>>()
        .await;
}

/// The LB pool every Service takes its IP from.
fn scale_pool() -> LbIpPool {
    let mut pool = segment_pool();
    pool.spec.blocks = vec![LbIpBlock {
        cidr: Some(LB_CIDR.into()),
        start: None,
        stop: None,
    }];
    pool
}

/// Seconds from `since` until `count` Services hold an IP, followed by a watch.
async fn wait_for_ips(store: &KubeStore, count: usize, since: Instant, operator: &Daemon) -> f64 {
    let mut watch = store
        .watch(Service::KIND)
        .await
        .expect("watch the Services");
    let mut assigned = BTreeMap::new();
    let take = |assigned: &mut BTreeMap<String, bool>, o: &ipam_core::store::RawObject| {
        if let Ok(s) = decode::<Service>(o) {
            assigned.insert(s.name, !s.value.status.ingress.is_empty());
        }
    };
    for o in &watch.initial {
        take(&mut assigned, o);
    }
    loop {
        let holding = assigned.values().filter(|a| **a).count();
        if holding >= count {
            return since.elapsed().as_secs_f64();
        }
        let next = tokio::time::timeout(Duration::from_secs(120), watch.next()).await;
        match next {
            Ok(Ok(WatchEvent::Put(o))) => take(&mut assigned, &o),
            Ok(Ok(WatchEvent::Resync { objects, .. })) => {
                assigned.clear();
                for o in &objects {
                    take(&mut assigned, o);
                }
            }
            Ok(Ok(WatchEvent::Deleted { .. }) | Err(_)) => {}
            Err(_) => panic!(
                "no Service changed for 2 minutes with {holding} of {count} holding an IP; the \
                 operator's log:\n{}",
                tail(&operator.log_text())
            ),
        }
    }
}

/// What the clients ask of the API server and what the processes cost, over `window`.
async fn at_rest(api: &TestApi, real: &RealAgents, operator: &Daemon, window: Duration) -> Rest {
    let traffic = real.traffic();
    let mut pids = real.pids();
    pids.push(operator.pid());
    let mark = api.request_mark();
    let received_before: Vec<u64> = traffic.iter().map(|t| t.received()).collect();
    let sent_before: Vec<u64> = traffic.iter().map(|t| t.sent()).collect();
    let ticks_before = cpu_ticks(&pids);
    let started = Instant::now();
    tokio::time::sleep(window).await;
    let seconds = started.elapsed().as_secs_f64();
    let cpu = cpu_pct(&ticks_before, &cpu_ticks(&pids), seconds);
    let counts = api.request_counts_since(&mark);
    let mut requests: BTreeMap<(String, String, String), f64> = BTreeMap::new();
    for (served, n) in counts {
        let key = (client(&served.user), served.verb, served.resource);
        *requests.entry(key).or_default() += n as f64 / seconds;
    }
    // Each agent's bytes per second one way, from `before` to now, averaged over the agents.
    let rate = |now: fn(&Traffic) -> u64, before: &[u64]| {
        let rates: Vec<f64> = traffic
            .iter()
            .zip(before)
            .map(|(t, was)| (now(t) - was) as f64 / seconds)
            .collect();
        mean(&rates)
    };
    let agents = real.daemons.len();
    Rest {
        seconds,
        requests,
        agent_rx_bytes_per_s: rate(Traffic::received, &received_before),
        agent_tx_bytes_per_s: rate(Traffic::sent, &sent_before),
        agent_cpu_pct: mean(&cpu[..agents]),
        agent_rss_mb: mean(&real.pids().into_iter().map(rss_mb).collect::<Vec<_>>()),
        operator_cpu_pct: cpu[agents],
        operator_rss_mb: rss_mb(operator.pid()),
    }
}

/// Who made a request, as the bench groups them: the operator, the real agents, or the bench
/// itself (the simulated nodes' renewals, its own watch).
fn client(user: &str) -> String {
    if user.contains("ipam-operator") || user == "operator" {
        "operator".into()
    } else if user.contains("ipam-agent") || user == "agent" {
        "agent".into()
    } else {
        "bench".into()
    }
}

fn print_rest(what: &str, rest: &Rest) {
    println!(
        "at rest with {what} for {:.0} s: {:.2} requests/s to the API server ({:.2} by the \
         operator, {:.2} by the real agents, {:.2} by the bench's simulated nodes); per real \
         agent: {:.0} B/s received, {:.0} B/s sent, CPU {:.2} %, RSS {:.1} MB; operator: CPU \
         {:.2} %, RSS {:.1} MB",
        rest.seconds,
        rest.requests_per_s(None),
        rest.requests_per_s(Some("operator")),
        rest.requests_per_s(Some("agent")),
        rest.requests_per_s(Some("bench")),
        rest.agent_rx_bytes_per_s,
        rest.agent_tx_bytes_per_s,
        rest.agent_cpu_pct,
        rest.agent_rss_mb,
        rest.operator_cpu_pct,
        rest.operator_rss_mb,
    );
    for ((client, verb, resource), n) in &rest.requests {
        println!("  {client:>8} {verb:>6} {resource:<32} {n:>8.3}/s");
    }
}

/// The last lines of a log, for a failure's message.
fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}
