//! `cargo xtask bench kube-failover`: the seed's failover on a real Kubernetes cluster
//! (tests/src/kube), measured twice in one run: with the operators taking a dead node's pods
//! out of their Services on the agents' reports (`[dead_nodes]`, the default), then with that
//! off, which leaves it to Kubernetes' node lifecycle controller (what kube-proxy alone gives).
//! Each half is `IPAM_BENCH_LOSSES` power losses (3 unless set) of the node answering for the
//! Service's IP while a client outside the cluster requests every 50 ms, a new connection
//! each; then `kubectl rollout restart daemonset ipam-agent` with the client running. Pods of
//! live nodes set not ready are counted after every step. `IPAM_LAB_KUBE_PROXY_MIN_SYNC`
//! (`100ms`, say) sets kube-proxy's `minSyncPeriod` on every node instead of its 1 s default.
//!
//! Needs the Kubernetes binaries in `KUBEBUILDER_ASSETS` and the project's image (`cargo xtask
//! bench kube-failover` builds it); without them it says why and exits with 2.

use ipam_tests::kube::{
    Assets, KubeCluster, ProxyMode,
    checks::Loss,
    scenario::{self, SEED_ERRORS_STOP_S, SEED_FAILED_PCT, SEED_FAILOVER_S},
};

fn main() {
    let assets = Assets::find_or_exit("bench kube-failover");
    let losses: usize = std::env::var("IPAM_BENCH_LOSSES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(3);
    let started = std::time::Instant::now();
    let say = |step: &str| println!("[{:6.1} s] {step}", started.elapsed().as_secs_f64());
    let mut cluster = KubeCluster::start(assets, 3, ProxyMode::Iptables, &say);
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        measure(&mut cluster, losses, &say)
    }));
    let (with, without, figures) = match outcome {
        Ok(measured) => measured,
        Err(panic) => {
            let kept = cluster.keep_logs();
            eprintln!(
                "bench kube-failover: failed; the logs are kept in {}",
                kept.display()
            );
            std::panic::resume_unwind(panic);
        }
    };
    let median = |losses: &[Loss], f: fn(&Loss) -> f64| {
        let mut v: Vec<f64> = losses.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let spread = |losses: &[Loss], f: fn(&Loss) -> f64| {
        let v: Vec<String> = losses.iter().map(|l| format!("{:.2}", f(l))).collect();
        v.join(", ")
    };
    for (what, set) in [("with", &with), ("without", &without)] {
        println!(
            "{what} the dead nodes' pods set not ready: answered again after {} s; errors stop \
             after {} s; failed {} %",
            spread(set, |l| l.failover_s),
            spread(set, |l| l.errors_stop_s),
            spread(set, |l| l.failed_pct),
        );
    }
    let (rollout_failed, rollout_total, moves) = figures.rollout.unwrap_or_default();
    println!(
        "failover_s={:.2} errors_stop_s={:.2} failed_requests_pct={:.1} \
         errors_stop_s_without={:.2} failed_requests_pct_without={:.1} \
         rollout_failed_requests={rollout_failed} rollout_requests={rollout_total} \
         rollout_ip_moves={moves} false_not_ready_pods={} losses={losses} \
         seed_failover_s={SEED_FAILOVER_S} seed_errors_stop_s={SEED_ERRORS_STOP_S} \
         seed_failed_requests_pct={SEED_FAILED_PCT} kube_proxy_min_sync_period={}",
        median(&with, |l| l.failover_s),
        median(&with, |l| l.errors_stop_s),
        median(&with, |l| l.failed_pct),
        median(&without, |l| l.errors_stop_s),
        median(&without, |l| l.failed_pct),
        figures.false_not_ready.len(),
        ipam_tests::kube::proxy_min_sync_period().unwrap_or_else(|| "1s".into()),
    );
}

/// The losses with the marking on, the rollout, then the losses with it off.
fn measure(
    cluster: &mut KubeCluster,
    losses: usize,
    say: &dyn Fn(&str),
) -> (Vec<Loss>, Vec<Loss>, scenario::Figures) {
    let ip = scenario::failover_setup(cluster, say);
    let mut figures = scenario::Figures::default();
    let mut halves = Vec::new();
    for on in [true, false] {
        if !on {
            scenario::set_mark_pods_not_ready(cluster, false);
            say("[dead_nodes] mark_pods_not_ready = false; the operators restarted");
        }
        let mut measured = Vec::new();
        for n in 1..=losses {
            let (loss, owner) = scenario::power_loss(cluster, ip);
            let dead = cluster.nodes[owner].name.clone();
            figures.check_not_ready(cluster, Some(&dead), &format!("in power loss {n}"));
            say(&format!(
                "{} power loss {n}/{losses}: answered again after {:.2} s, errors stop after \
                 {:.2} s, {:.1} % failed; {}",
                if on { "with" } else { "without" },
                loss.failover_s,
                loss.errors_stop_s,
                loss.failed_pct,
                scenario::second_half(&loss)
            ));
            measured.push(loss);
            scenario::power_back(cluster, owner);
        }
        halves.push(measured);
        if on {
            figures.rollout = Some(scenario::rollout_restart(cluster, ip));
            figures.check_not_ready(cluster, None, "after the agents' rollout");
            let (failed, total, moves) = figures.rollout.unwrap_or_default();
            say(&format!(
                "kubectl rollout restart daemonset ipam-agent: {failed} of {total} requests \
                 failed, the IP moved {moves} times"
            ));
        }
    }
    let without = halves.pop().unwrap_or_default();
    let with = halves.pop().unwrap_or_default();
    (with, without, figures)
}
