//! The run on a real cluster, step by step, shared by `cargo xtask lab kube` (which prints
//! every step and the figures) and `tests/tests/kube_cluster.rs` (one power loss): install the
//! project, pods over the nodes, the runtime's DEL and GC, a killed agent, a LoadBalancer
//! Service reached through kube-proxy, the seed's power losses and a rolling restart of the
//! agents with the client running.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    time::{Duration, Instant},
};

use super::{
    KubeCluster,
    checks::{self, ClientLoad, Loss, SYSTEM},
    in_namespace,
};

/// The seed's figures (a real cluster, Cilium's L2 announcements, 5 power losses), printed
/// beside ours.
pub const SEED_FAILOVER_S: &str = "17.8-22.2";
pub const SEED_ERRORS_STOP_S: &str = "43.5-54";
pub const SEED_FAILED_PCT: &str = "18-33";

/// The web Deployment the checks run (30 pods, 10 per node).
const WEB: &str = "web";
const REPLICAS: usize = 30;
/// The pool of deploy/overlays/example, and its families (v4 and v6).
const POOL: &str = "default";
const FAMILIES: usize = 2;
/// How long the client is watched after a power loss: past the node lifecycle controller's
/// grace period (kube-controller-manager's default), when Kubernetes takes the dead node's
/// pods out of the Services' endpoints.
const LOSS_WINDOW: Duration = Duration::from_secs(75);

/// What the run measured.
#[derive(Debug, Default)]
pub struct Figures {
    pub losses: Vec<Loss>,
    /// (failed requests, requests, times the IP moved) during `kubectl rollout restart` of
    /// the agents.
    pub rollout: Option<(usize, usize, usize)>,
    /// (failed requests, requests) during `kubectl drain` of the node answering.
    pub drain: Option<(usize, usize)>,
    /// Per power loss, the dead node's pods set not ready on the agents' reports.
    pub set_not_ready: Vec<usize>,
    /// Pods set not ready on the agents' reports although their node was not the one that
    /// lost power (after a killed agent, the losses, the rollout, the drain, a stopped
    /// kubelet): each `namespace/name on node`, and when.
    pub false_not_ready: Vec<String>,
}

impl Figures {
    /// Notes the pods set not ready on the agents' reports that are not on `dead`; how many
    /// are on `dead`.
    pub fn check_not_ready(
        &mut self,
        cluster: &KubeCluster,
        dead: Option<&str>,
        when: &str,
    ) -> usize {
        let mut on_dead = 0;
        for (pod, node) in checks::pods_set_not_ready_by_peers(cluster) {
            if Some(node.as_str()) == dead {
                on_dead += 1;
            } else {
                self.false_not_ready
                    .push(format!("{pod} on {node}, {when}"));
            }
        }
        on_dead
    }
}

pub fn run(cluster: &mut KubeCluster, losses: usize, say: &dyn Fn(&str)) -> Figures {
    say("install: kubectl apply -k (deploy/overlays/example, uplink eth0), the gossip Secret");
    checks::install(cluster);
    checks::wait_ready(cluster, Duration::from_secs(240));
    say("every node Ready, an agent on every node, both operators Ready");
    checks::no_forbidden_in_logs(cluster);
    say("no log of the project's pods has a Forbidden answer");

    checks::deploy_web(cluster, "default", WEB, REPLICAS);
    let pods = checks::pod_addresses(cluster, "default", &format!("app={WEB}"));
    checks::assert_addresses_from_node_blocks(cluster, &pods, POOL, FAMILIES);
    say(&format!(
        "{REPLICAS} pods Running, each with a v4 and a v6 address from its node's blocks"
    ));
    checks::assert_pods_reach_across_nodes(cluster, "default", &pods);
    say("pods reach each other across nodes (v4 and v6, from inside the pods)");
    checks::assert_no_leaked_address(cluster);

    // The kubelet's DEL: deleted pods' addresses go back; their replacements get addresses.
    let doomed: Vec<&str> = pods.iter().take(6).map(|p| p.name.as_str()).collect();
    let mut args = vec!["delete", "pod", "--wait=true"];
    args.extend(&doomed);
    cluster.kubectl_ok(&in_namespace("default", &args));
    checks::wait_running(cluster, "default", &format!("app={WEB}"), REPLICAS);
    checks::assert_no_leaked_address(cluster);
    say("6 pods deleted: their addresses freed (CNI DEL), their replacements addressed");

    // A kubelet and containerd restart: the runtime's CHECK and GC leave nothing behind.
    cluster.restart_runtime(0);
    checks::wait_ready(cluster, Duration::from_secs(120));
    checks::wait_running(cluster, "default", &format!("app={WEB}"), REPLICAS);
    checks::assert_no_leaked_address(cluster);
    say(&format!(
        "{}'s kubelet and containerd restarted: no address leaked",
        cluster.nodes[0].name
    ));

    let mut figures = Figures::default();
    kill_an_agent(cluster, 1);
    figures.check_not_ready(cluster, None, "after an agent was killed");
    say(&format!(
        "an agent container killed: the kubelet restarted it, no address moved, pods reach; \
         pods wrongly set not ready: {}",
        figures.false_not_ready.len()
    ));

    let ip = checks::expose(cluster, "default", WEB, WEB, false);
    let pods_now = checks::pod_addresses(cluster, "default", &format!("app={WEB}"));
    let answer = cluster.wait_for(
        Duration::from_secs(30),
        &format!("the client's answer from {ip}"),
        |c| checks::client_get(c, ip),
    );
    say(&format!(
        "Service {WEB}: LoadBalancer IP {ip}, the client outside the cluster reached a pod on \
         {answer} through kube-proxy"
    ));

    let answered = checks::assert_cluster_ip_answers(cluster, "default", WEB, &pods_now, 9);
    say(&format!(
        "Service {WEB}'s ClusterIP answered 9 of 9 requests from a pod of each node (kube-proxy's \
         DNAT, to pods of the same node and of others): answering nodes {answered:?}"
    ));

    power_losses(cluster, ip, losses, &mut figures, say);

    figures.rollout = Some(rollout_restart(cluster, ip));
    figures.check_not_ready(cluster, None, "after the agents' rollout");
    if let Some((failed, total, moves)) = figures.rollout {
        say(&format!(
            "kubectl rollout restart daemonset ipam-agent: {failed} of {total} requests failed, \
             the IP moved {moves} times"
        ));
    }
    tenant_pool(cluster);
    say(&format!(
        "namespace {TENANT} annotated with pool {TENANT}: its pods' addresses are from the \
         node's blocks of {TENANT}, and they reach pods of the default pool"
    ));

    let (failed, total, moved_after) = drain(cluster, ip);
    say(&format!(
        "kubectl drain of the node answering for {ip}: the IP answered elsewhere after \
         {moved_after:.2} s, {failed} of {total} requests failed; uncordoned, every pod Running"
    ));
    figures.drain = Some((failed, total));
    figures.check_not_ready(cluster, None, "after the drain");

    let moved_after = kubelet_stopped(cluster, ip);
    figures.check_not_ready(cluster, None, "after a kubelet was stopped");
    say(&format!(
        "the kubelet of the node answering for {ip} stopped: {ip} answered elsewhere \
         {moved_after:.1} s later, once the Node was NotReady; the kubelet back, the node Ready"
    ));

    let (first, second) = local_follows_endpoints(cluster);
    say(&format!(
        "Service {SOLO} (externalTrafficPolicy Local, one pod): answered by its pod's node \
         {first}; the pod moved to {second}, and so did the IP (EndpointSlices from the \
         controller manager)"
    ));

    a_live_node_cut_from_the_gossip(cluster, 2, &mut figures);
    say(&format!(
        "{} cut from the gossip, its kubelet's port rejected, then dropped: pods wrongly set \
         not ready: {}",
        cluster.nodes[2].name,
        figures.false_not_ready.len()
    ));
    figures
}

/// `losses` power losses of the node answering for `ip`, each measured into `figures` and
/// said, then the node's return with its pods ready again.
pub fn power_losses(
    cluster: &mut KubeCluster,
    ip: IpAddr,
    losses: usize,
    figures: &mut Figures,
    say: &dyn Fn(&str),
) {
    for n in 1..=losses {
        let (loss, owner) = power_loss(cluster, ip);
        let dead = cluster.nodes[owner].name.clone();
        let on_dead = figures.check_not_ready(cluster, Some(&dead), &format!("in power loss {n}"));
        say(&format!(
            "power loss {n}/{losses}: answered again after {:.2} s, errors stop after {:.2} s, \
             {:.1} % of requests failed in the {} s after; {on_dead} pods of {dead} set not \
             ready on the agents' reports; {}",
            loss.failover_s,
            loss.errors_stop_s,
            loss.failed_pct,
            LOSS_WINDOW.as_secs(),
            second_half(&loss)
        ));
        // The agents delete the connections sent to the dead pods that never got an answer:
        // none is left for a client reusing its port to follow there.
        if let Some(stale) = loss.stale_conntrack {
            assert_eq!(
                stale, 0,
                "power loss {n}: the node answering for {ip} still holds {stale} connections \
                 to it in SYN_SENT at the end of the window (sent to {dead}'s pods, which never \
                 answered); the agents' sweep (liveness::dead_flows) should have deleted them"
            );
        }
        figures.losses.push(loss);
        figures.set_not_ready.push(on_dead);
        power_back(cluster, owner);
        cluster.wait_for(
            Duration::from_secs(60),
            &format!("{dead}'s kubelet to make its pods ready again after its return"),
            |c| {
                checks::pods_set_not_ready_by_peers(c)
                    .is_empty()
                    .then_some(())
            },
        );
        say(&format!(
            "{dead} back: its pods made anew and ready again, and reached from the other nodes' \
             pods"
        ));
    }
}

/// The second half of a loss in words: when the EndpointSlices dropped the dead node's
/// endpoints, how many requests failed after the IP answered again, and when those after the
/// endpoints were dropped failed (what kube-proxy and the rest cost beyond the EndpointSlices).
pub fn second_half(loss: &Loss) -> String {
    let out_at = loss.endpoints_out_s.unwrap_or(f64::INFINITY);
    let endpoints = match loss.endpoints_out_s {
        Some(s) => format!("its endpoints not ready after {s:.2} s"),
        None => format!(
            "its endpoints still ready after {} s",
            LOSS_WINDOW.as_secs()
        ),
    };
    let after_out: Vec<f64> = loss
        .late_failures_s
        .iter()
        .copied()
        .filter(|s| *s > out_at)
        .collect();
    // Each with why it failed (connect timed out: no SYN-ACK, the connection went to a pod
    // that is gone or the node dropped it; read timed out: a live pod was slow).
    let cause = |at: f64| {
        loss.late_failure_causes
            .iter()
            .find(|(sent, _)| (sent - at).abs() < 0.001)
            .map_or("", |(_, why)| why.as_str())
    };
    let shown: Vec<String> = after_out
        .iter()
        .take(40)
        .map(|s| format!("{s:.2} ({})", cause(*s)))
        .collect();
    let more = after_out.len().saturating_sub(shown.len());
    let conntrack = match loss.stale_conntrack {
        Some(n) => format!("; {n} conntrack entries for the IP still in SYN_SENT at the end"),
        None => String::new(),
    };
    format!(
        "{endpoints}; {} requests failed after the IP answered again, {} of them after the \
         endpoints were out, at [{}]{} s{conntrack}",
        loss.late_failures_s.len(),
        after_out.len(),
        shown.join(", "),
        if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        }
    )
}

/// What `cargo xtask bench kube-failover` measures on: the project installed, the web pods
/// Running, and their LoadBalancer Service answering the client; its IP.
pub fn failover_setup(cluster: &KubeCluster, say: &dyn Fn(&str)) -> IpAddr {
    checks::install(cluster);
    checks::wait_ready(cluster, Duration::from_secs(240));
    checks::deploy_web(cluster, "default", WEB, REPLICAS);
    let ip = checks::expose(cluster, "default", WEB, WEB, false);
    cluster.wait_for(
        Duration::from_secs(30),
        &format!("the client's answer from {ip}"),
        |c| checks::client_get(c, ip),
    );
    say(&format!(
        "installed; {REPLICAS} web pods Running; Service {WEB} answers the client on {ip}"
    ));
    ip
}

/// Turns the taking of dead nodes' pods out of their Services on or off (`[dead_nodes]
/// mark_pods_not_ready` in the operators' and the agents' configuration: the operators' marking
/// and the agents' deletion of unanswered connections) and restarts both to read it.
pub fn set_mark_pods_not_ready(cluster: &KubeCluster, on: bool) {
    let mut config = cluster.get_json(&in_namespace(SYSTEM, &["configmap", "ipam-config"]));
    for key in ["operator.toml", "agent.toml"] {
        let toml = config["data"][key]
            .as_str()
            .unwrap_or_else(|| panic!("{key} in the ConfigMap"))
            .to_owned();
        let kept: String = match toml.find("\n[dead_nodes]\n") {
            Some(at) => toml[..at + 1].to_owned(),
            None => toml,
        };
        config["data"][key] = format!("{kept}\n[dead_nodes]\nmark_pods_not_ready = {on}\n").into();
    }
    let file = cluster.dir.0.join("operator-config.json");
    std::fs::write(&file, config.to_string()).expect("write the ConfigMap");
    cluster.kubectl_ok(&["replace", "-f", &file.display().to_string()]);
    cluster.kubectl_ok(&in_namespace(
        SYSTEM,
        &["rollout", "restart", "daemonset", "ipam-agent"],
    ));
    cluster.kubectl_ok(&in_namespace(
        SYSTEM,
        &[
            "rollout",
            "status",
            "daemonset",
            "ipam-agent",
            "--timeout=300s",
        ],
    ));
    cluster.kubectl_ok(&in_namespace(
        SYSTEM,
        &["rollout", "restart", "deployment", "ipam-operator"],
    ));
    cluster.kubectl_ok(&in_namespace(
        SYSTEM,
        &[
            "rollout",
            "status",
            "deployment",
            "ipam-operator",
            "--timeout=180s",
        ],
    ));
}

/// The tenant pool of the multi-pool check.
const TENANT: &str = "tenant";
/// The one-pod Deployment behind the `Local` Service.
const SOLO: &str = "solo";

/// A PodIPPool `tenant` (v4 and v6) and a namespace annotated with it: its pods get their
/// addresses from the blocks their nodes hold of `tenant`, and reach the default pool's pods.
fn tenant_pool(cluster: &KubeCluster) {
    cluster.apply(&format!(
        "apiVersion: ipam-ebpf.io/v1alpha1
kind: PodIPPool
metadata: {{name: {TENANT}}}
spec:
  ipv4: {{cidrs: [10.210.0.0/16], maskSize: 26}}
  ipv6: {{cidrs: [\"fd00:210::/104\"], maskSize: 120}}
---
apiVersion: v1
kind: Namespace
metadata:
  name: {TENANT}
  annotations: {{ipam-ebpf.io/ip-pool: {TENANT}}}
"
    ));
    let replicas = cluster.nodes.len();
    checks::deploy_web(cluster, TENANT, WEB, replicas);
    let tenants = checks::pod_addresses(cluster, TENANT, &format!("app={WEB}"));
    checks::assert_addresses_from_node_blocks(cluster, &tenants, TENANT, FAMILIES);
    checks::assert_pods_reach_across_nodes(cluster, TENANT, &tenants);
    // Between pools: a tenant pod asks a default pod on another node.
    let defaults = checks::pod_addresses(cluster, "default", &format!("app={WEB}"));
    let from = &tenants[0];
    let to = defaults
        .iter()
        .find(|p| p.node != from.node)
        .expect("a default pod on another node");
    checks::assert_reaches(cluster, TENANT, from, to);
    checks::assert_no_leaked_address(cluster);
}

/// `kubectl drain` of the node answering for `ip`, with the client running: (failed, total,
/// seconds until the IP answered from another node); then uncordoned, and every pod Running.
fn drain(cluster: &KubeCluster, ip: IpAddr) -> (usize, usize, f64) {
    let owner = cluster.wait_for(
        Duration::from_secs(30),
        &format!("the node answering for {ip}"),
        |c| checks::announcer(c, ip),
    );
    let node = cluster.nodes[owner].name.clone();
    let load = ClientLoad::start(cluster, ip);
    std::thread::sleep(Duration::from_secs(2));
    let started = Instant::now();
    cluster.kubectl_ok(&[
        "drain",
        &node,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--timeout=120s",
    ]);
    let moved_after = moved_from(cluster, ip, owner, started, "the drain");
    checks::wait_running(cluster, "default", &format!("app={WEB}"), REPLICAS);
    // The evicted pods' addresses went back (the kubelet's CNI DEL on eviction).
    checks::assert_no_leaked_address(cluster);
    let samples = load.stop();
    cluster.kubectl_ok(&["uncordon", &node]);
    // Uncordoned, the node may answer again and takes the IP back (rendezvous hashing over the
    // same nodes as before the drain): wait for it, so the next step starts from a settled
    // owner rather than one about to hand the IP back.
    cluster.wait_for(
        Duration::from_secs(60),
        &format!("{ip} answered by {node} again once uncordoned"),
        |c| (checks::announcer(c, ip) == Some(owner)).then_some(()),
    );
    let failed = samples.iter().filter(|s| s.node.is_none()).count();
    (failed, samples.len(), moved_after)
}

/// Seconds from `since` until the client finds `ip` answered by a node other than `owner`.
fn moved_from(cluster: &KubeCluster, ip: IpAddr, owner: usize, since: Instant, what: &str) -> f64 {
    cluster.wait_for(
        Duration::from_secs(120),
        &format!(
            "{ip} to be answered by another node than {} after {what}",
            cluster.nodes[owner].name
        ),
        |c| {
            checks::announcer(c, ip)
                .filter(|now| *now != owner)
                .map(|_| since.elapsed().as_secs_f64())
        },
    )
}

/// The kubelet of the node answering for `ip` stops (its agent and pods run on): once the node
/// lifecycle controller marks the Node NotReady, the IP moves (`exclude_not_ready`). Returns the
/// seconds from the stop until it did; then the kubelet starts again.
fn kubelet_stopped(cluster: &mut KubeCluster, ip: IpAddr) -> f64 {
    let owner = cluster.wait_for(
        Duration::from_secs(30),
        &format!("the node answering for {ip}"),
        |c| checks::announcer(c, ip),
    );
    let started = Instant::now();
    cluster.stop_kubelet(owner);
    let moved_after = moved_from(cluster, ip, owner, started, "its kubelet stopped");
    assert!(
        !checks::ready_nodes(cluster).contains(&cluster.nodes[owner].name),
        "{ip} moved from {} while its Node was still Ready: only NotReady may move it",
        cluster.nodes[owner].name
    );
    cluster.start_kubelet(owner);
    checks::wait_ready(cluster, Duration::from_secs(120));
    moved_after
}

/// A one-pod Deployment behind a `Local` Service: the node of its pod answers for the IP (the
/// controller manager's EndpointSlices name it); the pod moved to another node, the IP follows.
/// Returns the two nodes.
fn local_follows_endpoints(cluster: &KubeCluster) -> (String, String) {
    checks::deploy_web(cluster, "default", SOLO, 1);
    let ip = checks::expose(cluster, "default", SOLO, SOLO, true);
    let pod_node = |c: &KubeCluster| {
        checks::pod_addresses(c, "default", &format!("app={SOLO}"))
            .into_iter()
            .next()
            .map(|p| p.node)
    };
    let first = pod_node(cluster).expect("the solo pod");
    let answered_by = |c: &KubeCluster, node: &str| {
        c.wait_for(
            Duration::from_secs(60),
            &format!("{ip} (Local) to be answered by {node}, its endpoint's node"),
            |c| {
                checks::announcer(c, ip)
                    .filter(|i| c.nodes[*i].name == node)
                    .map(|_| ())
            },
        );
    };
    answered_by(cluster, &first);
    let second = cluster
        .nodes
        .iter()
        .map(|n| n.name.clone())
        .find(|n| *n != first)
        .expect("another node");
    cluster.kubectl_ok(&[
        "patch",
        "deployment",
        SOLO,
        "-n",
        "default",
        "-p",
        &format!(
            "{{\"spec\":{{\"template\":{{\"spec\":{{\"nodeSelector\":\
             {{\"kubernetes.io/hostname\":\"{second}\"}}}}}}}}}}"
        ),
    ]);
    cluster.wait_for(
        Duration::from_secs(120),
        &format!("pod {SOLO} Running on {second} alone"),
        |c| {
            let pods = checks::pod_addresses(c, "default", &format!("app={SOLO}"));
            (pods.len() == 1 && pods[0].node == second && !pods[0].ips.is_empty()).then_some(())
        },
    );
    checks::wait_running(cluster, "default", &format!("app={SOLO}"), 1);
    answered_by(cluster, &second);
    (first, second)
}

/// Kills node `i`'s agent container (SIGKILL through containerd): the kubelet restarts it;
/// every pod keeps its address, and pods still reach each other.
fn kill_an_agent(cluster: &KubeCluster, i: usize) {
    let node = &cluster.nodes[i];
    let agent = checks::pods(cluster, SYSTEM, "app.kubernetes.io/name=ipam-agent")
        .into_iter()
        .find(|p| p["spec"]["nodeName"] == node.name.as_str())
        .expect("an agent pod on the node");
    let name = agent["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let status = |c: &KubeCluster| {
        let pod = c.get_json(&in_namespace(SYSTEM, &["pod", &name]));
        pod["status"]["containerStatuses"]
            .as_array()
            .and_then(|s| s.iter().find(|s| s["name"] == "agent").cloned())
            .unwrap_or_default()
    };
    let before = status(cluster);
    let restarts = before["restartCount"].as_u64().unwrap_or(0);
    let id = before["containerID"]
        .as_str()
        .and_then(|id| id.strip_prefix("containerd://"))
        .expect("the agent's container id")
        .to_owned();
    let addresses = |c: &KubeCluster| -> BTreeMap<String, Vec<IpAddr>> {
        checks::pod_addresses(c, "default", &format!("app={WEB}"))
            .into_iter()
            .map(|p| (p.name, p.ips))
            .collect()
    };
    let addresses_before = addresses(cluster);
    node.run(
        "ctr",
        &[
            "--address",
            super::node::CONTAINERD_SOCKET,
            "-n",
            "k8s.io",
            "tasks",
            "kill",
            "-s",
            "SIGKILL",
            &id,
        ],
    );
    cluster.wait_for(
        Duration::from_secs(120),
        &format!("the kubelet to restart agent {name}, and it to be Ready"),
        |c| {
            let now = status(c);
            (now["restartCount"].as_u64().unwrap_or(0) > restarts && now["ready"] == true)
                .then_some(())
        },
    );
    assert_eq!(
        addresses(cluster),
        addresses_before,
        "a pod's address changed when agent {name} was killed"
    );
    let pods = checks::pod_addresses(cluster, "default", &format!("app={WEB}"));
    checks::assert_pods_reach_across_nodes(cluster, "default", &pods);
    checks::assert_no_leaked_address(cluster);
}

/// The node answering for `ip` loses power while the client requests every 50 ms: the figures,
/// and the node that lost power.
pub fn power_loss(cluster: &mut KubeCluster, ip: IpAddr) -> (Loss, usize) {
    let owner = cluster.wait_for(
        Duration::from_secs(30),
        &format!("the node answering for {ip}"),
        |c| checks::announcer(c, ip),
    );
    let load = ClientLoad::start(cluster, ip);
    std::thread::sleep(Duration::from_secs(3));
    let lost_at = load.start.elapsed();
    let lost = Instant::now();
    cluster.power_off(owner);
    let dead = cluster.nodes[owner].name.clone();
    let until = lost + LOSS_WINDOW;
    let mut endpoints_out_s = None;
    while Instant::now() < until {
        if endpoints_out_s.is_none()
            && checks::ready_endpoints_on(cluster, "default", WEB, &dead) == Some(false)
        {
            endpoints_out_s = Some(lost.elapsed().as_secs_f64());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let (failures, neighbour) = (load.failures.clone(), load.neighbour.clone());
    let samples = load.stop();
    let neighbour = neighbour.lock().unwrap();
    let mut loss = checks::loss_figures(&samples, lost_at, LOSS_WINDOW);
    loss.endpoints_out_s = endpoints_out_s;
    loss.late_failure_causes = failures
        .lock()
        .unwrap()
        .iter()
        .filter_map(|(sent, why)| {
            let after = sent.checked_sub(lost_at)?.as_secs_f64();
            // With the client's neighbour entry for the IP when it was sent.
            let entry = ClientLoad::neighbour_at(&neighbour, *sent);
            (after > loss.failover_s).then(|| (after, format!("{why}; neighbour: {entry}")))
        })
        .collect();
    let now = cluster.wait_for(
        Duration::from_secs(30),
        &format!("another node answering for {ip}"),
        |c| checks::announcer(c, ip),
    );
    assert_ne!(
        now, owner,
        "{ip} is still resolved to {}, which lost power",
        cluster.nodes[owner].name
    );
    loss.stale_conntrack = checks::syn_sent_entries(cluster, now, ip);
    (loss, owner)
}

/// Node `owner` comes back from its power loss, and the cluster is whole again: every pod of
/// it made anew by its kubelet, and reached from the other nodes' pods.
pub fn power_back(cluster: &mut KubeCluster, owner: usize) {
    // The pods' containers before the node is back: a reboot makes every one of them anew,
    // with new addresses, and until the kubelet has done so the API still shows the old.
    let before = web_containers_on(cluster, owner);
    cluster.power_on(owner);
    checks::wait_ready(cluster, Duration::from_secs(240));
    let node = cluster.nodes[owner].name.clone();
    cluster.wait_for(
        Duration::from_secs(240),
        &format!("every {WEB} pod on {node} started again after its return"),
        |c| {
            let now = web_containers_on(c, owner);
            now.iter()
                .all(|(id, ready)| *ready && !before.contains_key(id))
                .then_some(())
        },
    );
    checks::wait_running(cluster, "default", &format!("app={WEB}"), REPLICAS);
    // The node back: its pods (new sandboxes, the datapath made afresh) are reached again.
    let pods = checks::pod_addresses(cluster, "default", &format!("app={WEB}"));
    checks::assert_pods_reach_across_nodes(cluster, "default", &pods);
}

/// The web pods' containers on node `i`: container ID -> ready.
fn web_containers_on(cluster: &KubeCluster, i: usize) -> BTreeMap<String, bool> {
    let node = cluster.nodes[i].name.as_str();
    checks::pods(cluster, "default", &format!("app={WEB}"))
        .iter()
        .filter(|p| p["spec"]["nodeName"] == node && p["metadata"]["deletionTimestamp"].is_null())
        .map(|p| {
            let status = &p["status"]["containerStatuses"][0];
            (
                status["containerID"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                status["ready"] == true,
            )
        })
        .collect()
}

/// `kubectl rollout restart daemonset ipam-agent` with the client running: (failed, total,
/// IP moves seen by the client's neighbour table).
pub fn rollout_restart(cluster: &KubeCluster, ip: IpAddr) -> (usize, usize, usize) {
    let load = ClientLoad::start(cluster, ip);
    let mut owners = vec![checks::announcer(cluster, ip)];
    cluster.kubectl_ok(&in_namespace(
        SYSTEM,
        &["rollout", "restart", "daemonset", "ipam-agent"],
    ));
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let done = cluster
            .kubectl(&in_namespace(
                SYSTEM,
                &[
                    "rollout",
                    "status",
                    "daemonset",
                    "ipam-agent",
                    "--timeout=1s",
                ],
            ))
            .status
            .success();
        let owner = checks::announcer(cluster, ip);
        if owner != *owners.last().unwrap() {
            owners.push(owner);
        }
        if done {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the agents' rollout did not finish in 300 s\n{}",
            cluster.describe()
        );
    }
    std::thread::sleep(Duration::from_secs(3));
    let samples = load.stop();
    let failed = samples.iter().filter(|s| s.node.is_none()).count();
    (failed, samples.len(), owners.len() - 1)
}

/// A live node cut from the gossip both ways, its kubelet's port rejected by its firewall with
/// ICMP "administratively prohibited", then dropped (Kubernetes documents 10250 as reachable
/// from the control plane only): its peers declare it dead in the gossip, and the second
/// signal (`liveness::dead_peers`) must find it alive or fail closed. Every pod set not ready
/// meanwhile is noted in `figures` (none is expected). Watched each second: the kubelet may
/// restore a pod's readiness soon after.
fn a_live_node_cut_from_the_gossip(cluster: &KubeCluster, i: usize, figures: &mut Figures) {
    let node = &cluster.nodes[i];
    let iptables = |action: &str, rule: &[&str]| {
        let mut args = vec![action];
        args.extend_from_slice(rule);
        node.run("iptables", &args);
    };
    let gossip =
        ["INPUT", "OUTPUT"].map(|chain| [chain, "-p", "udp", "--dport", GOSSIP_PORT, "-j", "DROP"]);
    let kubelet = |how: &[&'static str]| {
        [
            &["INPUT", "-p", "tcp", "--dport", KUBELET_PORT, "-j"][..],
            how,
        ]
        .concat()
    };
    let rejected = kubelet(&["REJECT", "--reject-with", "icmp-admin-prohibited"]);
    let dropped = kubelet(&["DROP"]);
    // The peers say each time the gossip declared the node dead and they did not report it.
    let needle = format!(
        "not reporting {} dead: the gossip declared it dead",
        node.name
    );
    let refusals = || -> usize {
        checks::pods(cluster, SYSTEM, "")
            .iter()
            .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
            .map(|pod| {
                cluster
                    .kubectl_ok(&in_namespace(SYSTEM, &["logs", &pod, "--all-containers"]))
                    .matches(&needle)
                    .count()
            })
            .sum()
    };
    let refusals_before = refusals();
    let mut marked = BTreeSet::new();
    let mut watch_for = |how_long: Duration, what: &str| {
        let until = Instant::now() + how_long;
        while Instant::now() < until {
            for (pod, on) in checks::pods_set_not_ready_by_peers(cluster) {
                marked.insert(format!("{pod} on {on}, {} {what}", node.name));
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    };
    iptables("-I", &rejected);
    for rule in &gossip {
        iptables("-I", rule);
    }
    watch_for(
        CUT_OFF_FOR,
        "cut from the gossip, its kubelet's port rejected",
    );
    iptables("-D", &rejected);
    iptables("-I", &dropped);
    watch_for(
        CUT_OFF_FOR,
        "cut from the gossip, its kubelet's port dropped",
    );
    iptables("-D", &dropped);
    for rule in &gossip {
        iptables("-D", rule);
    }
    let refused = refusals().saturating_sub(refusals_before);
    assert!(
        refused > 0,
        "no peer of {} said the gossip declared it dead while it was cut off: the cut did not \
         take, and the step checked nothing",
        node.name
    );
    figures.false_not_ready.extend(marked);
}

/// How long a live node stays cut from the gossip in each half of
/// [`a_live_node_cut_from_the_gossip`]: past the peers' declaring it dead (under a second), a
/// recheck of its kubelet's port and the operator's pass.
const CUT_OFF_FOR: Duration = Duration::from_secs(12);
/// The gossip's port, as deploy/overlays/example sets it.
const GOSSIP_PORT: &str = "7946";
/// The kubelet's port the agents probe.
const KUBELET_PORT: &str = "10250";
