//! The project on a real Kubernetes cluster (tests/src/kube): a real kube-apiserver, controller
//! manager and scheduler, and on three nodes a real containerd, kubelet and kube-proxy; the
//! project installed from deploy/ with `kubectl apply -k`, then every check of
//! tests/src/kube/scenario.rs with one power loss; then on a fresh cluster the add-on mode
//! beside another CNI (tests/src/kube/add_on.rs), with one power loss. The checks assert what the cluster's users
//! see (pods Running with addresses from their node's blocks, pods reaching each other, a
//! client outside the cluster answered through the LoadBalancer IP, no address held for a pod
//! Kubernetes no longer runs); the timings are `cargo xtask lab kube`'s figures, not asserted.
//!
//! It needs the Kubernetes binaries in `KUBEBUILDER_ASSETS`, which no package registry this
//! project's machines reach carries, and the project's image (`cargo xtask image`); without
//! either it says NOT CHECKED and why, and passes.

use ipam_tests::{
    kube::{Assets, KubeCluster, ProxyMode, add_on, images, scenario},
    not_checked,
};

#[test]
fn the_project_runs_on_a_real_kubernetes_cluster() {
    const WHAT: &str = "the project on a real Kubernetes cluster (kube_cluster)";
    let assets = match Assets::find() {
        Ok(assets) => assets,
        Err(why) => return not_checked(WHAT, &why),
    };
    if let Err(why) = images::project_image_exists() {
        return not_checked(WHAT, &why);
    }
    let started = std::time::Instant::now();
    let say = |step: &str| eprintln!("[{:6.1} s] {step}", started.elapsed().as_secs_f64());
    on_a_fresh_cluster(Assets(assets.0.clone()), &say, |c| {
        scenario::run(c, 1, &say)
    });
    say("the add-on mode, on a fresh cluster");
    on_a_fresh_cluster(assets, &say, |c| add_on::run(c, 1, &say));
}

/// `run` on a cluster of three nodes made for it, and no pod of a live node set not ready on
/// the agents' reports; the cluster removed after, its logs kept on failure.
fn on_a_fresh_cluster(
    assets: Assets,
    say: &dyn Fn(&str),
    run: impl FnOnce(&mut KubeCluster) -> scenario::Figures,
) {
    let mut cluster = KubeCluster::start(assets, 3, ProxyMode::Iptables, say);
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let figures = run(&mut cluster);
        assert!(
            figures.false_not_ready.is_empty(),
            "pods of live nodes were set not ready on the agents' reports: {:?}",
            figures.false_not_ready
        );
        // A rollout of the agents (deploy/'s on_stop = "auto": a restart on a node that stays)
        // moves no IP and fails no request (issue 38; the bench's runs 13 and after).
        if let Some((failed, total, moves)) = figures.rollout {
            assert!(
                failed == 0 && moves == 0,
                "kubectl rollout restart of the agents: {failed} of {total} requests failed, \
                 the IP moved {moves} times"
            );
        }
    }));
    if let Err(panic) = outcome {
        eprintln!("the logs are kept in {}", cluster.keep_logs().display());
        std::panic::resume_unwind(panic);
    }
}
