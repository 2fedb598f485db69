//! `ipamd --role operator` and `ipamctl` on the Kubernetes store, found through a kubeconfig
//! as on a real cluster. No Kubernetes API server is packaged for the machines these tests run
//! on: the API is the in-process stand-in of `ipam_kube::testing` (resourceVersions, 409s, the
//! status subresource, watches, 410 Gone), listening on loopback.

use std::time::{Duration, Instant};

use ipam_core::{
    resources::{NodeIpam, PodIpPool},
    store::{TypedStore as _, lease::Lease},
};
use ipam_kube::{KubeStore, testing::StandIn};
use ipam_tests::{TempFile, daemon::Daemon, workspace_binary};

const POOLS: &str = "[[ipam.pool]]\nname = \"default\"\n\
    ipv4 = { cidrs = [\"10.243.0.0/24\"], maskSize = 26 }\n";

fn kubeconfig(api: &StandIn) -> TempFile {
    let file = TempFile::new("kubeconfig", "yaml");
    std::fs::write(
        &file.0,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: stand-in\n  cluster:\n    server: \
             http://{}\nusers:\n- name: test\n  user: {{}}\ncontexts:\n- name: stand-in\n  \
             context:\n    cluster: stand-in\n    user: test\ncurrent-context: stand-in\n",
            api.address
        ),
    )
    .expect("write the kubeconfig");
    file
}

async fn wait_for<T>(
    what: &str,
    mut probe: impl AsyncFnMut() -> Option<T>,
    log: impl Fn() -> String,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; log:\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_and_ipamctl_work_on_the_kubernetes_api() {
    let api = StandIn::start()
        .await
        .expect("start the stand-in API server");
    let kubeconfig = kubeconfig(&api);
    let config = TempFile::new("kube-operator", "toml");
    std::fs::write(
        &config.0,
        format!(
            "[store]\nkind = \"kubernetes\"\n[store.kubernetes]\nnamespace = \"ipam-system\"\n\n\
             [cluster]\nnode_lease_ms = 1500\nnode_grace_ms = 600000\noperator_lease_ms = 3000\n\n\
             [ipam]\nmode = \"cluster-pool\"\n{POOLS}"
        ),
    )
    .expect("write the operator configuration");
    let operator = Daemon::start_on_host(
        &config.0,
        &["--role", "operator"],
        &[("KUBECONFIG", &kubeconfig.0)],
    );
    let store = KubeStore::new(api.client(), "ipam-system");
    let log = || operator.log_text();

    // The operator leads through a coordination.k8s.io Lease and writes the configured pool.
    let holder = wait_for(
        "the operator's lease",
        async || {
            store
                .get_typed::<Lease>("ipam-operator")
                .await
                .ok()
                .flatten()
                .map(|l| l.value.holder)
                .filter(|h| !h.is_empty())
        },
        log,
    )
    .await;
    assert!(!holder.is_empty());
    // A node's agent creates its record; the operator gives it a block through /status.
    store
        .create_typed("worker-1", &NodeIpam::default())
        .await
        .unwrap();
    let block = wait_for(
        "a block for worker-1",
        async || {
            let n = store.get_typed::<NodeIpam>("worker-1").await.ok()??;
            n.value.status.allocated.first().map(|b| b.cidr.to_string())
        },
        log,
    )
    .await;
    assert_eq!(block, "10.243.0.0/26");
    let pool = wait_for(
        "the pool's usage",
        async || {
            let p = store.get_typed::<PodIpPool>("default").await.ok()??;
            (p.value.status.usage.first()?.used_blocks == 1).then_some(p)
        },
        log,
    )
    .await;
    assert!(
        pool.value.status.conditions.iter().all(|c| c.status),
        "{pool:?}"
    );

    // ipamctl reads the same store through the kubeconfig, and says what it read.
    let out = std::process::Command::new(workspace_binary("ipamctl"))
        .args(["pools", "--config"])
        .arg(&config.0)
        .env("KUBECONFIG", &kubeconfig.0)
        .output()
        .expect("run ipamctl");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("[#####...............] 1/4 blocks")
            && text.contains("worker-1: 10.243.0.0/26")
            && text.contains("the Kubernetes API (namespace ipam-system)"),
        "{text}"
    );
    operator.kill();
}
