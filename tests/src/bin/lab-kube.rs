//! `cargo xtask lab kube`: the project on a real Kubernetes cluster (tests/src/kube), twice.
//! First as the cluster's pod network: the control plane and three nodes with their own
//! containerd, kubelet and kube-proxy, the project installed with `kubectl apply -k`, then every
//! check of tests/src/kube/scenario.rs, the seed's power losses (`IPAM_LAB_KUBE_LOSSES`, 5
//! unless set) and a rolling restart of the agents. Then on a fresh cluster as the add-on beside
//! another CNI (tests/src/kube/add_on.rs; `IPAM_LAB_KUBE_ADD_ON_LOSSES` power losses, 1 unless
//! set). `IPAM_LAB_KUBE_RUNS=add-on` (or `main`) runs one of the two. Each step is printed as it
//! passes, the figures beside the seed's at the end. Needs the
//! Kubernetes binaries in `KUBEBUILDER_ASSETS`: without them it says how to get them and exits
//! with 2. Everything is removed at the end, also on failure (the logs are kept on failure).

use ipam_tests::kube::{
    Assets, KubeCluster, ProxyMode, add_on,
    checks::Loss,
    scenario::{self, Figures, SEED_ERRORS_STOP_S, SEED_FAILED_PCT, SEED_FAILOVER_S},
};

fn main() {
    let losses = count_from_env("IPAM_LAB_KUBE_LOSSES", 5);
    let add_on_losses = count_from_env("IPAM_LAB_KUBE_ADD_ON_LOSSES", 1);
    let started = std::time::Instant::now();
    let say = |step: &str| println!("[{:6.1} s] {step}", started.elapsed().as_secs_f64());
    let assets = Assets::find_or_exit("lab kube");
    say(&format!(
        "Kubernetes lab: binaries from {}; three nodes, a client outside the cluster",
        assets.0.display()
    ));
    let runs = std::env::var("IPAM_LAB_KUBE_RUNS").unwrap_or_else(|_| "main,add-on".into());
    let runs: Vec<&str> = runs.split(',').map(str::trim).collect();
    if let Some(unknown) = runs.iter().find(|r| !["main", "add-on"].contains(r)) {
        eprintln!("lab kube: IPAM_LAB_KUBE_RUNS names {unknown:?}; it takes main, add-on or both");
        std::process::exit(2);
    }
    let figures = if runs.contains(&"main") {
        on_a_fresh_cluster(assets, &say, |c| scenario::run(c, losses, &say))
    } else {
        Figures::default()
    };
    let add_on_figures = if runs.contains(&"add-on") {
        say("the add-on mode beside another CNI, on a fresh cluster");
        on_a_fresh_cluster(Assets::find_or_exit("lab kube"), &say, |c| {
            add_on::run(c, add_on_losses, &say)
        })
    } else {
        Figures::default()
    };

    let wrongly: Vec<&String> = figures
        .false_not_ready
        .iter()
        .chain(&add_on_figures.false_not_ready)
        .collect();
    // The last line's keys: those of the runs that ran.
    let mut keys = Vec::new();
    if runs.contains(&"main") {
        let (failover, fo_lo, fo_hi) = median_range(&figures.losses, |l| l.failover_s);
        let (stop, st_lo, st_hi) = median_range(&figures.losses, |l| l.errors_stop_s);
        let (failed, fa_lo, fa_hi) = median_range(&figures.losses, |l| l.failed_pct);
        println!(
            "\n{} power losses: answered again after {failover:.2} s ({fo_lo:.2}-{fo_hi:.2}; \
             seed {SEED_FAILOVER_S}), errors stop after {stop:.2} s ({st_lo:.2}-{st_hi:.2}; seed \
             {SEED_ERRORS_STOP_S}), {failed:.1} % of requests failed ({fa_lo:.1}-{fa_hi:.1}; \
             seed {SEED_FAILED_PCT})",
            figures.losses.len()
        );
        let set_not_ready: usize = figures.set_not_ready.iter().sum();
        println!(
            "the dead nodes' pods set not ready on the agents' reports: {set_not_ready} over {} \
             losses",
            figures.losses.len()
        );
        let (rollout_failed, rollout_total, moves) = figures.rollout.unwrap_or_default();
        keys.push(format!(
            "failover_s={failover:.2} errors_stop_s={stop:.2} failed_requests_pct={failed:.1} \
             rollout_failed_requests={rollout_failed} rollout_requests={rollout_total} \
             rollout_ip_moves={moves}"
        ));
    }
    if runs.contains(&"add-on") {
        let (failover, ..) = median_range(&add_on_figures.losses, |l| l.failover_s);
        let (stop, ..) = median_range(&add_on_figures.losses, |l| l.errors_stop_s);
        let (failed, ..) = median_range(&add_on_figures.losses, |l| l.failed_pct);
        println!(
            "the add-on mode beside another CNI, {} power losses: answered again after \
             {failover:.2} s, errors stop after {stop:.2} s, {failed:.1} % of requests failed \
             (medians)",
            add_on_figures.losses.len()
        );
        keys.push(format!(
            "add_on_failover_s={failover:.2} add_on_errors_stop_s={stop:.2} \
             add_on_failed_requests_pct={failed:.1}"
        ));
    }
    println!(
        "pods wrongly set not ready: {}{}",
        wrongly.len(),
        wrongly
            .iter()
            .map(|p| format!("\n  {p}"))
            .collect::<String>()
    );
    println!(
        "{} false_not_ready_pods={} seed_failover_s={SEED_FAILOVER_S} \
         seed_errors_stop_s={SEED_ERRORS_STOP_S} seed_failed_requests_pct={SEED_FAILED_PCT}",
        keys.join(" "),
        wrongly.len()
    );
    if !wrongly.is_empty() {
        eprintln!("lab kube: failed: pods of live nodes were set not ready");
        std::process::exit(1);
    }
}

/// A count from the environment variable `name`, else `default`.
fn count_from_env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

/// `run` on a cluster of three nodes made for it and removed after it, also on failure (its
/// logs kept then).
fn on_a_fresh_cluster(
    assets: Assets,
    say: &dyn Fn(&str),
    run: impl FnOnce(&mut KubeCluster) -> Figures,
) -> Figures {
    let mut cluster = KubeCluster::start(assets, 3, ProxyMode::Iptables, say);
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&mut cluster))) {
        Ok(figures) => figures,
        Err(panic) => {
            let kept = cluster.keep_logs();
            eprintln!("lab kube: failed; the logs are kept in {}", kept.display());
            std::panic::resume_unwind(panic);
        }
    }
}

/// The median, lowest and highest of `figure` over `losses` (NaN with none).
fn median_range(losses: &[Loss], figure: impl Fn(&Loss) -> f64) -> (f64, f64, f64) {
    let mut v: Vec<f64> = losses.iter().map(figure).collect();
    v.sort_by(f64::total_cmp);
    match (v.first(), v.last()) {
        (Some(lo), Some(hi)) => (v[v.len() / 2], *lo, *hi),
        _ => (f64::NAN, f64::NAN, f64::NAN),
    }
}
