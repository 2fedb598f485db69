//! What the real cluster must show, as assertions shared by `tests/tests/kube_cluster.rs` and
//! `cargo xtask lab kube`: each names what it waited for and shows the cluster when it fails.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use ipam_core::Cidr;
use serde_json::Value;

use super::{KubeCluster, in_namespace};
use crate::{
    failover::Sample,
    http::{http_get, http_get_or_why},
};

pub const SYSTEM: &str = "ipam-system";
const WEB_PORT: u16 = 80;

/// Installs the project as a user does: `kubectl apply -k` of an overlay on
/// deploy/overlays/example (the image this run built, the nodes' uplink `eth0`), and the
/// cluster's gossip key as a Secret made with kubectl.
pub fn install(cluster: &KubeCluster) {
    // The lab's nodes' uplink, and the announcers' exclusions docs/service-ips.md describes
    // (off by default), so that cordon, drain and a NotReady Node move a Service's IP.
    let edit = |config: &str| {
        let ours = config.replace(
            "uplinks = [\"bond0\"]",
            "uplinks = [\"eth0\"]\n    [node.announce]\n    exclude_not_ready = true\n    \
             exclude_cordoned = true",
        );
        assert_ne!(
            ours, config,
            "deploy/overlays/example/config.yaml names no bond0 uplink"
        );
        ours
    };
    install_overlay(cluster, "example", Some(&edit));
}

/// Installs the project with `kubectl apply -k` of an overlay on deploy/overlays/`name`: the
/// image this run built in place of the one `name` names, and `edit` applied to `name`'s
/// config.yaml patch where given; then the cluster's gossip key as a Secret made with kubectl.
pub fn install_overlay(cluster: &KubeCluster, name: &str, edit: Option<&dyn Fn(&str) -> String>) {
    let base = crate::deploy::overlay(name);
    let overlay = cluster.dir.0.join(format!("overlay-{name}"));
    std::fs::create_dir_all(&overlay).expect("the overlay folder");
    let patches = match edit {
        Some(edit) => {
            let config = std::fs::read_to_string(base.join("config.yaml"))
                .unwrap_or_else(|e| panic!("deploy/overlays/{name}/config.yaml: {e}"));
            std::fs::write(overlay.join("config.yaml"), edit(&config))
                .expect("write the overlay's config");
            "patches:\n  - path: config.yaml\n"
        }
        None => "",
    };
    let named =
        crate::deploy::documents(&base.join("kustomization.yaml"))[0]["images"][0]["newName"]
            .as_str()
            .unwrap_or_else(|| panic!("deploy/overlays/{name}/kustomization.yaml names no image"))
            .to_owned();
    let image = super::images::project_image();
    let (image_name, tag) = image.rsplit_once(':').expect("the image has a tag");
    // kustomize takes a base by a relative path only.
    let base = relative(
        &std::fs::canonicalize(&overlay).expect("the overlay folder"),
        &std::fs::canonicalize(&base).unwrap_or_else(|e| panic!("deploy/overlays/{name}: {e}")),
    );
    std::fs::write(
        overlay.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - \
             {}\nimages:\n  - name: {named}\n    newName: {image_name}\n    \
             newTag: \"{tag}\"\n{patches}",
            base.display()
        ),
    )
    .expect("write the overlay");
    cluster.kubectl_ok(&["apply", "-k", &overlay.display().to_string()]);
    let key: [u8; 32] = rand::random();
    let key = base64(&key);
    cluster.kubectl_ok(&in_namespace(
        SYSTEM,
        &[
            "create",
            "secret",
            "generic",
            "ipam-gossip",
            &format!("--from-literal=key={key}"),
        ],
    ));
}

/// The path that leads from the folder `from` to `to`, both absolute.
fn relative(from: &std::path::Path, to: &std::path::Path) -> std::path::PathBuf {
    let (from, to): (Vec<_>, Vec<_>) = (from.components().collect(), to.components().collect());
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut path: std::path::PathBuf = from[common..].iter().map(|_| "..").collect();
    path.extend(&to[common..]);
    path
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Every node Ready, an agent Ready on every node, both operator replicas Ready.
pub fn wait_ready(cluster: &KubeCluster, timeout: Duration) {
    let nodes = cluster.nodes.len();
    cluster.wait_for(timeout, "every node Ready", |c| {
        (ready_nodes(c).len() == nodes).then_some(())
    });
    cluster.wait_for(timeout, "an agent Ready on every node", |c| {
        let ds = c.get_json(&in_namespace(SYSTEM, &["daemonset", "ipam-agent"]));
        (ds["status"]["numberReady"].as_u64() == Some(nodes as u64)).then_some(())
    });
    cluster.wait_for(timeout, "both operator replicas Ready", |c| {
        let d = c.get_json(&in_namespace(SYSTEM, &["deployment", "ipam-operator"]));
        (d["status"]["readyReplicas"].as_u64() == d["spec"]["replicas"].as_u64()).then_some(())
    });
}

pub fn ready_nodes(cluster: &KubeCluster) -> BTreeSet<String> {
    cluster.get_json(&["nodes"])["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| condition(n, "Ready") == Some(true))
        .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_owned))
        .collect()
}

fn condition(object: &Value, kind: &str) -> Option<bool> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
        .map(|c| c["status"] == "True")
}

/// No log of the project's pods says an API request was forbidden: the RBAC of deploy/ grants
/// what the code asks for on a real API server.
pub fn no_forbidden_in_logs(cluster: &KubeCluster) {
    for pod in pods(cluster, SYSTEM, "") {
        let name = pod["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let log = cluster.kubectl_ok(&in_namespace(SYSTEM, &["logs", &name, "--all-containers"]));
        let forbidden: Vec<&str> = log.lines().filter(|l| l.contains("orbidden")).collect();
        assert!(
            forbidden.is_empty(),
            "pod {SYSTEM}/{name} was refused by the API server:\n{}",
            forbidden.join("\n")
        );
    }
}

/// The pods of `namespace` (with a label selector, or all).
pub fn pods(cluster: &KubeCluster, namespace: &str, selector: &str) -> Vec<Value> {
    let mut args = vec!["pods", "-n", namespace];
    if !selector.is_empty() {
        args.extend(["-l", selector]);
    }
    cluster.get_json(&args)["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// The pods of every namespace that the operator set not ready on the agents' reports of a
/// dead node ([dead_nodes]): `(namespace/name, node)`.
pub fn pods_set_not_ready_by_peers(cluster: &KubeCluster) -> Vec<(String, String)> {
    cluster.get_json(&["pods", "-A"])["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| {
            p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| {
                    c["type"] == "Ready"
                        && c["status"] == "False"
                        && c["reason"] == ipam_kube::pod_readiness::NOT_READY_REASON
                })
        })
        .map(|p| {
            let meta = &p["metadata"];
            (
                format!(
                    "{}/{}",
                    meta["namespace"].as_str().unwrap_or_default(),
                    meta["name"].as_str().unwrap_or_default()
                ),
                p["spec"]["nodeName"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect()
}

/// A Deployment `name` of `replicas` web pods in `namespace` (each answering with its node's
/// name), spread over the nodes; waits until every pod runs with an address.
pub fn deploy_web(cluster: &KubeCluster, namespace: &str, name: &str, replicas: usize) {
    cluster.apply(&format!(
        "apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      topologySpreadConstraints:
        - {{maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: ScheduleAnyway,
            labelSelector: {{matchLabels: {{app: {name}}}}}}}
      # busybox httpd runs as PID 1 and ignores SIGTERM: without this every deleted pod
      # waits out the default 30 s.
      terminationGracePeriodSeconds: 2
      containers:
        - name: web
          image: {image}
          imagePullPolicy: Never
          ports: [{{containerPort: {WEB_PORT}}}]
          env:
            - name: NODE_NAME
              valueFrom: {{fieldRef: {{fieldPath: spec.nodeName}}}}
          readinessProbe:
            tcpSocket: {{port: {WEB_PORT}}}
            periodSeconds: 2
",
        image = super::images::WEB
    ));
    wait_running(cluster, namespace, &format!("app={name}"), replicas);
}

/// Waits until `count` pods match `selector`, all Running and Ready with their addresses.
pub fn wait_running(cluster: &KubeCluster, namespace: &str, selector: &str, count: usize) {
    cluster.wait_for(
        Duration::from_secs(240),
        &format!("{count} pods {selector} in {namespace} Running and Ready"),
        |c| {
            let all = pods(c, namespace, selector);
            let live: Vec<&Value> = all
                .iter()
                .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
                .collect();
            (live.len() == count
                && live.iter().all(|p| {
                    p["status"]["phase"] == "Running"
                        && condition(p, "Ready") == Some(true)
                        && p["status"]["podIP"].is_string()
                }))
            .then_some(())
        },
    );
}

/// A pod: its name, node and addresses.
#[derive(Debug, Clone)]
pub struct PodAddresses {
    pub name: String,
    pub node: String,
    pub ips: Vec<IpAddr>,
}

pub fn pod_addresses(cluster: &KubeCluster, namespace: &str, selector: &str) -> Vec<PodAddresses> {
    pods(cluster, namespace, selector)
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .map(|p| PodAddresses {
            name: p["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            node: p["spec"]["nodeName"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            ips: pod_ips(p),
        })
        .collect()
}

/// A pod's addresses, from its status (`podIPs`).
fn pod_ips<T: FromIterator<IpAddr>>(pod: &Value) -> T {
    pod["status"]["podIPs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a["ip"].as_str()?.parse().ok())
        .collect()
}

/// The blocks each node holds, from its NodeIPAM record's status.
pub fn node_blocks(cluster: &KubeCluster) -> BTreeMap<String, Vec<(String, Cidr)>> {
    cluster.get_json(&["nodeipams"])["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|n| {
            let blocks = n["status"]["allocated"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|b| {
                    Some((
                        b["pool"].as_str()?.to_owned(),
                        b["cidr"].as_str()?.parse().ok()?,
                    ))
                })
                .collect();
            (
                n["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                blocks,
            )
        })
        .collect()
}

/// Every pod has one address per family in `families`, each in a block its node holds of
/// `pool`; no address twice.
pub fn assert_addresses_from_node_blocks(
    cluster: &KubeCluster,
    pods: &[PodAddresses],
    pool: &str,
    families: usize,
) {
    let blocks = node_blocks(cluster);
    let mut seen = BTreeSet::new();
    for pod in pods {
        assert_eq!(
            pod.ips.len(),
            families,
            "pod {} on {} has addresses {:?}",
            pod.name,
            pod.node,
            pod.ips
        );
        let held: Vec<&Cidr> = blocks
            .get(&pod.node)
            .into_iter()
            .flatten()
            .filter(|(p, _)| p == pool)
            .map(|(_, c)| c)
            .collect();
        for ip in &pod.ips {
            assert!(
                held.iter().any(|c| c.contains(*ip)),
                "pod {}'s address {ip} is in no block of pool {pool} node {} holds ({held:?})",
                pod.name,
                pod.node
            );
            assert!(seen.insert(*ip), "address {ip} is given twice");
        }
    }
}

/// From one pod on every node, every other node's pods answer over the pod network (v4, and
/// v6 where the pods have it): the request runs in the pod (`kubectl exec`, busybox nc).
pub fn assert_pods_reach_across_nodes(
    cluster: &KubeCluster,
    namespace: &str,
    pods: &[PodAddresses],
) {
    let mut by_node: BTreeMap<&str, &PodAddresses> = BTreeMap::new();
    for pod in pods {
        by_node.entry(pod.node.as_str()).or_insert(pod);
    }
    for from in by_node.values() {
        for to in by_node.values().filter(|to| to.node != from.node) {
            assert_reaches(cluster, namespace, from, to);
        }
    }
}

/// Pod `from` (of `namespace`) reaches pod `to` at each of its addresses: the answer names
/// `to`'s node. The request runs in the pod (`kubectl exec`, busybox nc), each try bounded;
/// tries go on for 20 s, so routes that follow a node's return get the moment they need.
pub fn assert_reaches(
    cluster: &KubeCluster,
    namespace: &str,
    from: &PodAddresses,
    to: &PodAddresses,
) {
    for ip in &to.ips {
        let ask = |c: &KubeCluster| {
            let out = c.kubectl_within(
                Duration::from_secs(10),
                &in_namespace(
                    namespace,
                    &[
                        "exec",
                        &from.name,
                        "--",
                        "sh",
                        "-c",
                        &format!(
                            "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | timeout 5 nc -w 3 {ip} \
                             {WEB_PORT} | tail -n 1"
                        ),
                    ],
                ),
            );
            (
                String::from_utf8_lossy(&out.stdout).trim().to_owned(),
                format!(
                    "{}: {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            )
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        let (mut answer, mut how) = ask(cluster);
        while answer != to.node && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(500));
            (answer, how) = ask(cluster);
        }
        // How the last try ended tells a failed `kubectl exec` from a request that went
        // unanswered.
        assert_eq!(
            answer, to.node,
            "pod {} on {} asked {} on {} at {ip} for 20 s; the last try's kubectl exec: {how}",
            from.name, from.node, to.name, to.node
        );
    }
}

/// From one pod of each node, Service `service`'s ClusterIP answers every one of `tries`
/// requests (kube-proxy spreads them over the pods of every node, the asking pod's own
/// included): the answering nodes, per asking node. The requests run in the pod, each bounded.
pub fn assert_cluster_ip_answers(
    cluster: &KubeCluster,
    namespace: &str,
    service: &str,
    pods: &[PodAddresses],
    tries: usize,
) -> BTreeMap<String, BTreeSet<String>> {
    let service_json = cluster.get_json(&in_namespace(namespace, &["service", service]));
    let cluster_ip = service_json["spec"]["clusterIP"]
        .as_str()
        .unwrap_or_else(|| panic!("Service {namespace}/{service} has no clusterIP: {service_json}"))
        .to_owned();
    let mut by_node: BTreeMap<&str, &PodAddresses> = BTreeMap::new();
    for pod in pods {
        by_node.entry(pod.node.as_str()).or_insert(pod);
    }
    let mut answered = BTreeMap::new();
    for from in by_node.values() {
        let script = format!(
            "for i in $(seq {tries}); do printf 'GET / HTTP/1.0\\r\\n\\r\\n' | timeout 5 nc -w 3 \
             {cluster_ip} {WEB_PORT} | tail -n 1; echo; done"
        );
        let out = cluster.kubectl_within(
            Duration::from_secs(10 + 6 * tries as u64),
            &in_namespace(namespace, &["exec", &from.name, "--", "sh", "-c", &script]),
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let answers: Vec<&str> = stdout
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        assert_eq!(
            answers.len(),
            tries,
            "pod {} on {} asked ClusterIP {cluster_ip} of {namespace}/{service} {tries} times \
             and got {answers:?}: {}",
            from.name,
            from.node,
            String::from_utf8_lossy(&out.stderr)
        );
        answered.insert(
            from.node.clone(),
            answers.into_iter().map(str::to_owned).collect(),
        );
    }
    answered
}

/// What node `node`'s agent holds, from the status and endpoint table it publishes under its
/// state folder: (addresses per pod, allocations in all, its own infrastructure addresses: router, health).
pub fn node_allocations(
    cluster: &KubeCluster,
    node: usize,
) -> (BTreeMap<String, BTreeSet<IpAddr>>, u64, usize) {
    let state = cluster.nodes[node].dir.join("ipam/node");
    let read = |file: &str| -> Value {
        std::fs::read_to_string(state.join(file))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(Value::Null)
    };
    let endpoints = read("endpoints.json")
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            (
                e["pod"].as_str().unwrap_or_default().to_owned(),
                e["ips"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|ip| ip.as_str()?.parse().ok())
                    .collect(),
            )
        })
        .collect();
    let status = read("status.json");
    (
        endpoints,
        status["allocations"].as_u64().unwrap_or(0),
        // Addresses, not purposes: a router has one of each family.
        status["infra"]
            .as_object()
            .into_iter()
            .flat_map(|purposes| purposes.values())
            .filter_map(Value::as_object)
            .map(serde_json::Map::len)
            .sum(),
    )
}

/// Every node's agent holds exactly the addresses of the pods Kubernetes runs there (of the
/// pod network), and nothing else but its own infrastructure addresses: nothing leaked by a
/// deleted pod, a restarted kubelet or containerd.
pub fn assert_no_leaked_address(cluster: &KubeCluster) {
    cluster.wait_for(
        Duration::from_secs(120),
        "every node's allocations to match the pods running there",
        |c| {
            let pods = all_pod_network_pods(c);
            (0..c.nodes.len())
                .all(|i| {
                    let (endpoints, allocations, infra) = node_allocations(c, i);
                    let expected: BTreeMap<String, BTreeSet<IpAddr>> = pods
                        .iter()
                        .filter(|(_, (node, _))| *node == c.nodes[i].name)
                        .map(|(name, (_, ips))| (name.clone(), ips.clone()))
                        .collect();
                    let addresses: usize = endpoints.values().map(BTreeSet::len).sum();
                    endpoints == expected && allocations == (addresses + infra) as u64
                })
                .then_some(())
        },
    );
}

/// Every pod of the pod network (not host network) that has addresses: namespace/name ->
/// (node, addresses).
fn all_pod_network_pods(cluster: &KubeCluster) -> BTreeMap<String, (String, BTreeSet<IpAddr>)> {
    cluster.get_json(&["pods", "-A"])["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["spec"]["hostNetwork"] != true)
        .filter(|p| p["status"]["podIP"].is_string())
        .map(|p| {
            (
                format!(
                    "{}/{}",
                    p["metadata"]["namespace"].as_str().unwrap_or_default(),
                    p["metadata"]["name"].as_str().unwrap_or_default()
                ),
                (
                    p["spec"]["nodeName"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    pod_ips(p),
                ),
            )
        })
        .collect()
}

/// A LoadBalancer pool on the segment (10.77.0.192/28), an L2 policy on every node's `eth0`,
/// and Service `name` of type LoadBalancer in front of the pods `app=<selector>`; returns its
/// IP once assigned.
pub fn expose(
    cluster: &KubeCluster,
    namespace: &str,
    name: &str,
    selector: &str,
    local: bool,
) -> IpAddr {
    cluster.apply(&format!(
        "apiVersion: ipam-ebpf.io/v1alpha1
kind: LoadBalancerIPPool
metadata: {{name: lab}}
spec:
  blocks: [{{cidr: 10.77.0.192/28}}]
---
apiVersion: ipam-ebpf.io/v1alpha1
kind: L2AnnouncementPolicy
metadata: {{name: lab}}
spec:
  interfaces: [eth0]
---
apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  type: LoadBalancer
  externalTrafficPolicy: {policy}
  selector: {{app: {selector}}}
  ports: [{{port: {WEB_PORT}, targetPort: {WEB_PORT}}}]
",
        policy = if local { "Local" } else { "Cluster" }
    ));
    cluster.wait_for(
        Duration::from_secs(60),
        &format!("Service {namespace}/{name}'s LoadBalancer IP"),
        |c| {
            let s = c.get_json(&in_namespace(namespace, &["service", name]));
            s["status"]["loadBalancer"]["ingress"][0]["ip"]
                .as_str()?
                .parse()
                .ok()
        },
    )
}

/// The client, outside the cluster, asks `ip`: the body of the answer.
pub fn client_get(cluster: &KubeCluster, ip: IpAddr) -> Option<String> {
    cluster
        .client
        .run(move || http_get(SocketAddr::new(ip, WEB_PORT), Duration::from_millis(500)))
}

/// The node whose MAC the client resolves `ip` to (after asking it once).
pub fn announcer(cluster: &KubeCluster, ip: IpAddr) -> Option<usize> {
    client_get(cluster, ip)?;
    let neigh = super::output_of(
        crate::netns::command_in(&cluster.client.path(), "ip").args([
            "neigh",
            "show",
            &ip.to_string(),
        ]),
    )?;
    let mac = neigh
        .split_whitespace()
        .skip_while(|w| *w != "lladdr")
        .nth(1)?
        .to_owned();
    cluster.nodes.iter().position(|n| {
        let m = n.ns.mac("eth0");
        let text = m
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":");
        text == mac
    })
}

/// The client requesting `ip` every 50 ms (a new connection each, 200 ms timeout), as the
/// seed's lab did, until stopped.
pub struct ClientLoad {
    pub start: Instant,
    done: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<Sample>>>,
    /// Each failed request: when it was sent (from `start`) and why it failed.
    pub failures: Arc<Mutex<Vec<(Duration, String)>>>,
    /// The client's neighbour entry for the IP each time it changed (read every 100 ms): when
    /// (from `start`), and its state and MAC as `ip neigh` shows them.
    pub neighbour: Arc<Mutex<Vec<(Duration, String)>>>,
    watcher: Option<std::thread::JoinHandle<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ClientLoad {
    pub fn start(cluster: &KubeCluster, ip: IpAddr) -> Self {
        let start = Instant::now();
        let done = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (done, samples, failures) = (done.clone(), samples.clone(), failures.clone());
            cluster.client.spawn(move || {
                crate::failover::requests_with(start, &done, &samples, move || {
                    let sent = start.elapsed();
                    let answer =
                        http_get_or_why(SocketAddr::new(ip, WEB_PORT), Duration::from_millis(200));
                    answer
                        .map_err(|why| failures.lock().unwrap().push((sent, why)))
                        .ok()
                });
            })
        };
        let neighbour = Arc::new(Mutex::new(Vec::new()));
        let watcher = {
            let (done, neighbour) = (done.clone(), neighbour.clone());
            let client = cluster.client.path();
            std::thread::spawn(move || {
                while !done.load(Ordering::SeqCst) {
                    let entry = super::output_of(crate::netns::command_in(&client, "ip").args([
                        "neigh",
                        "show",
                        &ip.to_string(),
                    ]))
                    .unwrap_or_default();
                    let entry = entry.trim().to_owned();
                    let mut seen = neighbour.lock().unwrap();
                    if seen.last().is_none_or(|(_, last)| *last != entry) {
                        seen.push((start.elapsed(), entry));
                    }
                    drop(seen);
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        };
        Self {
            start,
            done,
            samples,
            failures,
            neighbour,
            watcher: Some(watcher),
            thread: Some(thread),
        }
    }

    pub fn stop(mut self) -> Vec<Sample> {
        self.done.store(true, Ordering::SeqCst);
        for t in [self.thread.take(), self.watcher.take()]
            .into_iter()
            .flatten()
        {
            let _ = t.join();
        }
        std::mem::take(&mut *self.samples.lock().unwrap())
    }

    /// The client's neighbour entry for the IP at `at` (from `start`), as last read before.
    pub fn neighbour_at(neighbour: &[(Duration, String)], at: Duration) -> String {
        neighbour
            .iter()
            .take_while(|(when, _)| *when <= at)
            .last()
            .map_or_else(String::new, |(_, entry)| entry.clone())
    }
}

/// One power loss as the client lived it: (seconds until a request was answered again,
/// seconds until the last failed request, failed share in the minute after the loss).
#[derive(Debug, Clone, Default)]
pub struct Loss {
    pub failover_s: f64,
    pub errors_stop_s: f64,
    pub failed_pct: f64,
    /// When the requests that failed after the IP answered again were sent (seconds after the
    /// loss): what the second half of the failover cost.
    pub late_failures_s: Vec<f64>,
    /// Seconds until the Service's EndpointSlices showed none of the dead node's endpoints
    /// ready (as kube-proxy reads them), if within the window.
    pub endpoints_out_s: Option<f64>,
    /// The node answering's conntrack entries for the IP still in SYN_SENT at the end of the
    /// window (connections that never got an answer, sent to pods that are gone), if read.
    pub stale_conntrack: Option<usize>,
    /// The requests that failed after the IP answered again: when they were sent (seconds
    /// after the loss) and why they failed.
    pub late_failure_causes: Vec<(f64, String)>,
}

/// Reads a loss off the samples of a run where the power went at `lost_at`.
pub fn loss_figures(samples: &[Sample], lost_at: Duration, window: Duration) -> Loss {
    let after: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.at >= lost_at && s.at <= lost_at + window)
        .collect();
    let failover_s = answered_again_after(&after, lost_at, window);
    let errors_stop_s = after
        .iter()
        .rev()
        .find(|s| s.node.is_none())
        .map_or(0.0, |s| (s.at - lost_at).as_secs_f64());
    let failed = after.iter().filter(|s| s.node.is_none()).count();
    let late_failures_s = after
        .iter()
        .map(|s| (s.at - lost_at).as_secs_f64())
        .zip(after.iter().map(|s| s.node.is_none()))
        .filter(|(at, failed)| *failed && *at > failover_s)
        .map(|(at, _)| at)
        .collect();
    Loss {
        failover_s,
        errors_stop_s,
        failed_pct: 100.0 * failed as f64 / after.len().max(1) as f64,
        late_failures_s,
        endpoints_out_s: None,
        stale_conntrack: None,
        late_failure_causes: Vec::new(),
    }
}

/// Seconds from `lost_at` until the IP answered again: the end of the longest run of requests
/// without an answer. Not the first answer after the first failure: the node's own pods die a
/// moment before its link does, so a request sent to one of them fails while the next, sent
/// to another node's pod through the node still linked, is answered. Failures of that kind
/// come between answers; while the IP answers nowhere, nothing is answered. 0 when nothing
/// failed; the whole window when nothing was answered after a failure.
fn answered_again_after(after: &[&Sample], lost_at: Duration, window: Duration) -> f64 {
    let mut last_answer = lost_at;
    let mut failed_since = false;
    let mut longest = Duration::ZERO;
    let mut answered_again = 0.0;
    for sample in after {
        if sample.node.is_none() {
            failed_since = true;
            continue;
        }
        let span = sample.at - last_answer;
        if failed_since && span > longest {
            longest = span;
            answered_again = (sample.at - lost_at).as_secs_f64();
        }
        last_answer = sample.at;
        failed_since = false;
    }
    if failed_since && lost_at + window - last_answer > longest {
        answered_again = window.as_secs_f64();
    }
    answered_again
}

/// Whether any endpoint of Service `service`'s EndpointSlices on `node` is ready, as kube-proxy
/// reads them (`None` when they cannot be read).
pub fn ready_endpoints_on(
    cluster: &KubeCluster,
    namespace: &str,
    service: &str,
    node: &str,
) -> Option<bool> {
    let selector = format!("kubernetes.io/service-name={service}");
    let out = cluster.kubectl(&in_namespace(
        namespace,
        &["get", "endpointslices", "-l", &selector, "-o", "json"],
    ));
    let slices: Value = serde_json::from_slice(&out.stdout).ok()?;
    Some(
        slices["items"]
            .as_array()?
            .iter()
            .flat_map(|s| s["endpoints"].as_array().cloned().unwrap_or_default())
            .any(|e| e["nodeName"] == node && e["conditions"]["ready"] != false),
    )
}

/// Node `i`'s conntrack entries for TCP to `ip` still in SYN_SENT (`conntrack -L` in its
/// namespace; `None` when it cannot be read).
pub fn syn_sent_entries(cluster: &KubeCluster, i: usize, ip: IpAddr) -> Option<usize> {
    let out = cluster.nodes[i]
        .command("conntrack")
        .args([
            "-L",
            "-p",
            "tcp",
            "--orig-dst",
            &ip.to_string(),
            "--state",
            "SYN_SENT",
        ])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).lines().count())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Requests every 50 ms from 0; `failed` lists the indices that failed.
    fn samples(count: u64, failed: &[u64]) -> Vec<Sample> {
        (0..count)
            .map(|i| Sample {
                at: Duration::from_millis(50 * i),
                node: (!failed.contains(&i)).then(|| "node-2".to_owned()),
            })
            .collect()
    }

    #[test]
    fn the_ip_answers_again_where_the_longest_silence_ends() {
        let window = Duration::from_secs(5);
        // A dead pod's failure at once, an answer through the still-linked node, then the IP
        // answers nowhere from 0.10 s to 1.00 s, then dead pods' failures among answers.
        let mut failed = vec![0];
        failed.extend(2..20);
        failed.extend([25, 28]);
        let loss = loss_figures(&samples(100, &failed), Duration::ZERO, window);
        assert_eq!(loss.failover_s, 1.0);
        assert_eq!(loss.errors_stop_s, 1.4);
        assert_eq!(loss.late_failures_s, [1.25, 1.4]);

        assert_eq!(
            loss_figures(&samples(100, &[]), Duration::ZERO, window).failover_s,
            0.0
        );
        let never = loss_figures(&samples(100, &[60, 61, 62]), Duration::ZERO, window);
        assert_eq!(never.failover_s, 3.15);
        let to_the_end: Vec<u64> = (90..100).collect();
        let silent = loss_figures(&samples(100, &to_the_end), Duration::ZERO, window);
        assert_eq!(silent.failover_s, 5.0);
    }
}
