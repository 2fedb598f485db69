//! `cargo xtask lab kube`: the project on a real Kubernetes cluster (tests/src/kube): the
//! control plane and three nodes with their own containerd, kubelet and kube-proxy, the project
//! installed with `kubectl apply -k`, then every check of tests/src/kube/scenario.rs, the
//! seed's power losses (`IPAM_LAB_KUBE_LOSSES`, 5 unless set) and a rolling restart of the
//! agents, each printed as it passes, with the figures beside the seed's at the end. Needs the
//! Kubernetes binaries in `KUBEBUILDER_ASSETS`: without them it says how to get them and exits
//! with 2. Everything is removed at the end, also on failure (the logs are kept on failure).

use ipam_tests::kube::{
    Assets, KubeCluster, ProxyMode,
    scenario::{self, SEED_ERRORS_STOP_S, SEED_FAILED_PCT, SEED_FAILOVER_S},
};

fn main() {
    let assets = Assets::find_or_exit("lab kube");
    let losses = std::env::var("IPAM_LAB_KUBE_LOSSES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(5);
    let started = std::time::Instant::now();
    let say = |step: &str| println!("[{:6.1} s] {step}", started.elapsed().as_secs_f64());
    say(&format!(
        "Kubernetes lab: binaries from {}; three nodes, a client outside the cluster",
        assets.0.display()
    ));
    let mut cluster = KubeCluster::start(assets, 3, ProxyMode::Iptables, &say);
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        scenario::run(&mut cluster, losses, &say)
    }));
    let figures = match outcome {
        Ok(figures) => figures,
        Err(panic) => {
            let kept = cluster.keep_logs();
            eprintln!("lab kube: failed; the logs are kept in {}", kept.display());
            std::panic::resume_unwind(panic);
        }
    };
    let range = |f: &dyn Fn(&scenario::Figures) -> Vec<f64>| {
        let mut v = f(&figures);
        v.sort_by(f64::total_cmp);
        match (v.first(), v.last()) {
            (Some(lo), Some(hi)) => (v[v.len() / 2], *lo, *hi),
            _ => (f64::NAN, f64::NAN, f64::NAN),
        }
    };
    let (failover, fo_lo, fo_hi) = range(&|f| f.losses.iter().map(|l| l.failover_s).collect());
    let (stop, st_lo, st_hi) = range(&|f| f.losses.iter().map(|l| l.errors_stop_s).collect());
    let (failed, fa_lo, fa_hi) = range(&|f| f.losses.iter().map(|l| l.failed_pct).collect());
    println!(
        "\n{} power losses: answered again after {failover:.2} s ({fo_lo:.2}-{fo_hi:.2}; seed \
         {SEED_FAILOVER_S}), errors stop after {stop:.2} s ({st_lo:.2}-{st_hi:.2}; seed \
         {SEED_ERRORS_STOP_S}), {failed:.1} % of requests failed ({fa_lo:.1}-{fa_hi:.1}; seed \
         {SEED_FAILED_PCT})",
        figures.losses.len()
    );
    let (rollout_failed, rollout_total, moves) = figures.rollout.unwrap_or_default();
    let set_not_ready: usize = figures.set_not_ready.iter().sum();
    println!(
        "the dead nodes' pods set not ready on the agents' reports: {set_not_ready} over {} \
         losses; pods wrongly set not ready: {}{}",
        figures.losses.len(),
        figures.false_not_ready.len(),
        figures
            .false_not_ready
            .iter()
            .map(|p| format!("\n  {p}"))
            .collect::<String>()
    );
    println!(
        "failover_s={failover:.2} errors_stop_s={stop:.2} failed_requests_pct={failed:.1} \
         rollout_failed_requests={rollout_failed} rollout_requests={rollout_total} \
         rollout_ip_moves={moves} false_not_ready_pods={} seed_failover_s={SEED_FAILOVER_S} \
         seed_errors_stop_s={SEED_ERRORS_STOP_S} seed_failed_requests_pct={SEED_FAILED_PCT}",
        figures.false_not_ready.len()
    );
    if !figures.false_not_ready.is_empty() {
        eprintln!("lab kube: failed: pods of live nodes were set not ready");
        std::process::exit(1);
    }
}
