//! The failover rig shared by `cargo xtask lab failover` and `cargo xtask bench failover`: a
//! cluster (etcd, an operator, three agents) and a client on one segment, a LoadBalancer service
//! with a backend on every node (a TCP server answering with its node's name), the client
//! requesting every 50 ms, and the node answering for the service IP losing power (agent
//! SIGKILLed, link cut). Records every request and every gratuitous ARP the client sees.

use std::{
    collections::BTreeMap,
    io::{Read as _, Write as _},
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use ipam_core::{
    lb::resources::{
        IpFamilyPolicy, L2AnnouncementPolicy, L2PolicySpec, LbIpBlock, LbIpPool, LbIpPoolSpec,
        LbIpPoolStatus, Protocol, Service, ServicePort, ServiceSpec, ServiceStatus, ServiceType,
    },
    meta::Selector,
};
use ipam_daemon::net::frames::ARP_REPLY;

use crate::{
    arp_watch::{ArpSample, ArpWatch},
    cluster::{Cluster, wait_until},
    netns::Netns,
    resolve::Resolver,
};

/// Where a gossiping rig's agents serve their metrics, each in its node's namespace.
pub const AGENT_METRICS_PORT: u16 = 9965;
pub const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 100);
const PORT: u16 = 8080;
const PERIOD: Duration = Duration::from_millis(50);
const REQUEST_TIMEOUT: Duration = Duration::from_millis(200);

/// The LB pool inside the segment (around the client's address).
pub fn segment_pool() -> LbIpPool {
    let range = |start: &str, stop: &str| LbIpBlock {
        cidr: None,
        start: Some(start.into()),
        stop: Some(stop.into()),
    };
    LbIpPool {
        labels: Default::default(),
        spec: LbIpPoolSpec {
            blocks: vec![
                range("10.77.0.10", "10.77.0.99"),
                range("10.77.0.101", "10.77.0.250"),
            ],
            service_selector: Selector::default(),
            allow_first_last_ips: false,
            auto_assign: true,
            avoid_buggy_ips: false,
            namespaces: Vec::new(),
            priority: None,
            disabled: false,
            namespace_selector: Default::default(),
        },
        status: LbIpPoolStatus::default(),
    }
}

/// Announce on every node's uplink.
pub fn uplink_policy() -> L2AnnouncementPolicy {
    L2AnnouncementPolicy {
        spec: L2PolicySpec {
            node_selector: Selector::default(),
            service_selector: Selector::default(),
            ip_pools: Vec::new(),
            ip_pool_selector: Selector::default(),
            interfaces: vec!["up[0-9]+".into()],
            load_balancer_ips: true,
            external_ips: false,
        },
    }
}

/// A LoadBalancer service on TCP `port`.
pub fn lb_service(port: u16) -> Service {
    Service {
        spec: ServiceSpec {
            service_type: ServiceType::LoadBalancer,
            labels: Default::default(),
            ports: vec![ServicePort {
                port,
                protocol: Protocol::TCP,
            }],
            load_balancer_class: None,
            requested_ips: vec![],
            sharing_key: None,
            ip_families: vec![],
            ip_family_policy: IpFamilyPolicy::SingleStack,
            external_ips: vec![],
            external_traffic_policy: Default::default(),
            selector: Default::default(),
            conflict: None,
            sharing_cross_namespace: Vec::new(),
            pool: None,
            namespace_labels: Default::default(),
        },
        status: ServiceStatus::default(),
    }
}

/// One request of the client.
#[derive(Debug, Clone)]
pub struct Sample {
    /// When it was sent, from the start of the run.
    pub at: Duration,
    /// The node that answered, or `None` when it failed.
    pub node: Option<String>,
}

/// What befalls the node answering for the service IP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// A power loss: the agent SIGKILLed and the node's link cut.
    PowerOff,
    /// The agent SIGKILLed; the link stays up, and the responders answer until their liveness
    /// timeout runs out.
    Kill,
    /// The agent stopped cleanly (SIGTERM).
    Stop,
    /// The node cut off from the other nodes; the client and the store still reach it.
    CutOff,
    /// The node's outgoing gossip dropped: it still hears the other nodes, they no longer
    /// hear it (a one-way cut).
    Muted,
}

impl Fault {
    pub fn describe(self) -> &'static str {
        match self {
            Self::PowerOff => "loses power (agent SIGKILLed, link cut)",
            Self::Kill => "agent SIGKILLed (link up)",
            Self::Stop => "agent stopped (SIGTERM)",
            Self::CutOff => "cut off from the other nodes (client and store still reach it)",
            Self::Muted => "muted: its gossip no longer leaves it (it still hears the others)",
        }
    }
}

/// One fault, as the client lived it.
#[derive(Debug, Clone)]
pub struct KillRun {
    pub fault: Fault,
    pub victim: String,
    pub killed_at: Duration,
    pub samples: Vec<Sample>,
    /// (when, node) of every gratuitous ARP for the service IP the client saw.
    pub gratuitous: Vec<(Duration, String)>,
    /// Every ARP request the client sent for the service IP in the meantime, with its answers.
    pub arp: Vec<ArpSample>,
}

impl KillRun {
    pub fn last_success_before(&self) -> Option<&Sample> {
        self.samples
            .iter()
            .rev()
            .find(|s| s.at < self.killed_at && s.node.is_some())
    }

    pub fn first_failure(&self) -> Option<&Sample> {
        self.samples
            .iter()
            .find(|s| s.at >= self.killed_at && s.node.is_none())
    }

    pub fn first_success_after(&self) -> Option<&Sample> {
        self.samples
            .iter()
            .find(|s| s.at >= self.killed_at && s.node.is_some())
    }

    pub fn first_gratuitous_after(&self) -> Option<&(Duration, String)> {
        self.gratuitous
            .iter()
            .find(|(at, node)| *at >= self.killed_at && *node != self.victim)
    }

    /// Seconds from the power loss to the first request answered again.
    pub fn failover_s(&self) -> Option<f64> {
        self.first_success_after()
            .map(|s| (s.at - self.killed_at).as_secs_f64())
    }

    /// (failed, total) requests in the window around the kill.
    pub fn failed_in(&self, before: Duration, after: Duration) -> (usize, usize) {
        let from = self.killed_at.saturating_sub(before);
        let to = self.killed_at + after;
        let window: Vec<&Sample> = self
            .samples
            .iter()
            .filter(|s| s.at >= from && s.at <= to)
            .collect();
        (
            window.iter().filter(|s| s.node.is_none()).count(),
            window.len(),
        )
    }

    /// The timeline, as the seed printed it.
    pub fn timeline(&self) -> String {
        let rel =
            |d: Duration| format!("{:+7.3} s", d.as_secs_f64() - self.killed_at.as_secs_f64());
        let mut out = Vec::new();
        if let Some(s) = self.last_success_before() {
            out.push(format!(
                "{}  last success (answered by {})",
                rel(s.at),
                s.node.as_deref().unwrap_or("?")
            ));
        }
        out.push(format!(
            "{}  {}: {}",
            rel(self.killed_at),
            self.victim,
            self.fault.describe()
        ));
        if let Some(s) = self.first_failure() {
            out.push(format!("{}  first failed request", rel(s.at)));
        }
        if let Some((at, node)) = self.first_gratuitous_after() {
            out.push(format!(
                "{}  first gratuitous ARP seen by the client, from {node}",
                rel(*at)
            ));
        }
        if let Some(s) = self.first_success_after() {
            out.push(format!(
                "{}  first success again (answered by {})",
                rel(s.at),
                s.node.as_deref().unwrap_or("?")
            ));
        }
        let (failed, total) = self.failed_in(Duration::from_secs(5), Duration::from_secs(30));
        out.push(format!(
            "failed requests: {failed} of {total} from 5 s before to 30 s after the power loss"
        ));
        out.join("\n")
    }

    /// Writes the timeline with every request (`<name>.log`) and the plot (`<name>.svg`) to
    /// `<target>/lab/`, beside the profile folder the running binary was built into (also when
    /// CARGO_TARGET_DIR moves it); returns both paths.
    pub fn write_lab_files(&self, name: &str, timeline: &str) -> (PathBuf, PathBuf) {
        let exe = std::env::current_exe().expect("the lab's own path");
        let dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("the lab runs from <target>/<profile>/")
            .join("lab");
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let (log, plot) = (
            dir.join(format!("{name}.log")),
            dir.join(format!("{name}.svg")),
        );
        let samples: Vec<String> = self
            .samples
            .iter()
            .map(|s| {
                format!(
                    "{:.3} {}",
                    s.at.as_secs_f64(),
                    s.node.as_deref().unwrap_or("FAILED")
                )
            })
            .collect();
        std::fs::write(
            &log,
            format!(
                "{timeline}\n\nrequests (seconds from start, answering node):\n{}\n",
                samples.join("\n")
            ),
        )
        .expect("write the log");
        self.write_svg(&plot).expect("write the plot");
        (log, plot)
    }

    /// A plot of the requests over time: one row per answering node and one for failures.
    pub fn write_svg(&self, path: &Path) -> std::io::Result<()> {
        let mut rows: Vec<String> = self
            .samples
            .iter()
            .filter_map(|s| s.node.clone())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        rows.push("failed".into());
        let end = self.samples.last().map_or(1.0, |s| s.at.as_secs_f64());
        let (w, h, left, top, row_h) = (960.0, 90.0 + rows.len() as f64 * 40.0, 110.0, 30.0, 40.0);
        let x = |t: f64| left + (t / end) * (w - left - 20.0);
        let colours = ["#1b9e77", "#7570b3", "#e6ab02", "#66a61e"];
        let mut svg = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
             <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
             <text x=\"{left}\" y=\"18\">requests every 50 ms to the service IP; each dot one request, by the node that answered</text>\n"
        );
        for (i, row) in rows.iter().enumerate() {
            let y = top + i as f64 * row_h + row_h / 2.0;
            svg.push_str(&format!("<text x=\"8\" y=\"{}\">{row}</text>\n", y + 4.0));
            svg.push_str(&format!(
                "<line x1=\"{left}\" x2=\"{}\" y1=\"{y}\" y2=\"{y}\" stroke=\"#ddd\"/>\n",
                w - 20.0
            ));
        }
        for s in &self.samples {
            let (row, colour) = match &s.node {
                Some(n) => {
                    let i = rows.iter().position(|r| r == n).unwrap_or(0);
                    (i, colours[i % colours.len()])
                }
                None => (rows.len() - 1, "#d95f02"),
            };
            let y = top + row as f64 * row_h + row_h / 2.0;
            svg.push_str(&format!(
                "<circle cx=\"{:.1}\" cy=\"{y}\" r=\"2.5\" fill=\"{colour}\"/>\n",
                x(s.at.as_secs_f64())
            ));
        }
        let kill = x(self.killed_at.as_secs_f64());
        let bottom = top + rows.len() as f64 * row_h;
        svg.push_str(&format!(
            "<line x1=\"{kill}\" x2=\"{kill}\" y1=\"{top}\" y2=\"{bottom}\" stroke=\"red\"/>\n\
             <text x=\"{}\" y=\"{}\" fill=\"red\">{} loses power</text>\n",
            kill + 4.0,
            bottom + 14.0,
            self.victim
        ));
        if let Some((at, node)) = self.first_gratuitous_after() {
            let g = x(at.as_secs_f64());
            svg.push_str(&format!(
                "<line x1=\"{g}\" x2=\"{g}\" y1=\"{top}\" y2=\"{bottom}\" stroke=\"blue\" stroke-dasharray=\"4\"/>\n\
                 <text x=\"{}\" y=\"{}\" fill=\"blue\">gratuitous ARP from {node}</text>\n",
                g + 4.0,
                bottom + 28.0
            ));
        }
        svg.push_str(&format!(
            "<text x=\"{left}\" y=\"{}\">0 s</text><text x=\"{}\" y=\"{}\">{end:.1} s</text>\n</svg>\n",
            h - 6.0,
            w - 60.0,
            h - 6.0
        ));
        std::fs::write(path, svg)
    }
}

/// The cluster, the client and the backends.
pub struct FailoverRig {
    pub cluster: Cluster,
    pub client: Netns,
    pub ip: Ipv4Addr,
    pub macs: BTreeMap<[u8; 6], String>,
    stop: Arc<AtomicBool>,
    servers: Vec<std::thread::JoinHandle<()>>,
}

impl FailoverRig {
    /// Three agents that know who is alive from their leases.
    pub fn start(tag: &str) -> Self {
        Self::start_with(Cluster::start(tag, 1), tag, "")
    }

    /// Three agents that know who is alive from the gossip, each serving its metrics on
    /// [`AGENT_METRICS_PORT`] in its own namespace.
    pub fn start_gossip(tag: &str, node_grace_ms: u64) -> Self {
        let mut c = Cluster::start_with(tag, 1, crate::cluster::POOLS, node_grace_ms);
        c.enable_gossip();
        let metrics = format!("[metrics]\nlisten = \"127.0.0.1:{AGENT_METRICS_PORT}\"\n");
        Self::start_with(c, tag, &metrics)
    }

    fn start_with(mut c: Cluster, tag: &str, extra_config: &str) -> Self {
        for _ in 0..3 {
            c.add_node_with(tag, extra_config);
        }
        Self::around(c, tag)
    }

    /// The rig around a cluster whose agents run already: the segment's pool, the policy, the
    /// Service, a backend on every node and the client.
    pub fn around(c: Cluster, tag: &str) -> Self {
        wait_until(
            Duration::from_secs(30),
            "every agent ready",
            || c.nodes.iter().all(super::cluster::ClusterNode::ready),
            || format!("{:?}", c.blocks()),
        );
        c.put("lb", &segment_pool());
        c.put("uplinks", &uplink_policy());
        c.put("default/echo", &lb_service(PORT));
        let mut ip = None;
        wait_until(
            Duration::from_secs(20),
            "the service's IP",
            || {
                ip = c
                    .list::<Service>()
                    .iter()
                    .find(|s| s.name == "default/echo")
                    .and_then(|s| s.value.status.ingress.first().copied());
                ip.is_some()
            },
            || c.operator_log(0),
        );
        let Some(std::net::IpAddr::V4(ip)) = ip else {
            panic!("the service got no IPv4 address");
        };
        let macs = c.nodes.iter().map(|n| (n.mac(), n.name.clone())).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let servers = c
            .nodes
            .iter()
            .map(|n| {
                let (name, stop) = (n.name.clone(), stop.clone());
                n.ns.spawn(move || serve(Ipv4Addr::UNSPECIFIED.into(), &name, &stop))
            })
            .collect();
        let client = c.add_client(&format!("{tag}c"));
        Self {
            cluster: c,
            client,
            ip,
            macs,
            stop,
            servers,
        }
    }

    /// The node answering ARP for the service IP now.
    pub fn owner(&self) -> Option<String> {
        let ip = self.ip;
        let macs = self
            .client
            .run(move || Resolver::new("eth0").arp_all(CLIENT, ip, Duration::from_millis(300)));
        (macs.len() == 1)
            .then(|| self.macs.get(&macs[0]).cloned())
            .flatten()
    }

    /// Requests for `before`, then the owner loses power, then requests for `after`.
    pub fn kill_owner(&mut self, before: Duration, after: Duration) -> KillRun {
        self.fault_owner(Fault::PowerOff, before, after)
    }

    /// Requests (and ARP requests) for `before`, then `fault` befalls the owner, then requests
    /// for `after`; then the node is brought back and given time to answer again.
    pub fn fault_owner(&mut self, fault: Fault, before: Duration, after: Duration) -> KillRun {
        let start = Instant::now();
        let done = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let gratuitous = Arc::new(Mutex::new(Vec::new()));
        let requester = {
            let (done, samples, ip) = (done.clone(), samples.clone(), self.ip);
            self.client
                .spawn(move || requests(ip.into(), start, &done, &samples))
        };
        let listener = {
            let (done, gratuitous, ip, macs) =
                (done.clone(), gratuitous.clone(), self.ip, self.macs.clone());
            self.client
                .spawn(move || watch_gratuitous(ip, start, &macs, &done, &gratuitous))
        };
        std::thread::sleep(before);
        let victim = self.owner().expect("one node answers for the service IP");
        let index = self
            .cluster
            .nodes
            .iter()
            .position(|n| n.name == victim)
            .expect("the owner is a node");
        let arp = ArpWatch::start(&self.client, CLIENT, self.ip, start);
        self.inflict(fault, index);
        let killed_at = start.elapsed();
        std::thread::sleep(after);
        let arp = arp.stop();
        done.store(true, Ordering::SeqCst);
        requester.join().expect("requester");
        listener.join().expect("listener");
        let run = KillRun {
            fault,
            victim,
            killed_at,
            samples: std::mem::take(&mut samples.lock().unwrap()),
            gratuitous: std::mem::take(&mut gratuitous.lock().unwrap()),
            arp,
        };
        self.repair(fault, index);
        std::thread::sleep(Duration::from_millis(crate::cluster::NODE_LEASE_MS * 2));
        run
    }

    fn inflict(&mut self, fault: Fault, index: usize) {
        let node = &mut self.cluster.nodes[index];
        match fault {
            Fault::PowerOff => node.power_off(),
            Fault::Kill => node.kill(),
            Fault::Stop => node.stop(),
            Fault::CutOff => self.cluster.partition(&[index]),
            Fault::Muted => mute_gossip(node, "-A"),
        }
    }

    /// Power back on, agent restarted, partition healed.
    fn repair(&mut self, fault: Fault, index: usize) {
        match fault {
            Fault::CutOff => self.cluster.heal(&[index]),
            Fault::Muted => mute_gossip(&self.cluster.nodes[index], "-D"),
            Fault::PowerOff => {
                let node = &mut self.cluster.nodes[index];
                node.ns.up(crate::cluster::UPLINK);
                node.start();
            }
            Fault::Kill | Fault::Stop => self.cluster.nodes[index].start(),
        }
    }
}

/// Adds (`-A`) or removes (`-D`) the rule dropping every gossip packet `node` sends.
fn mute_gossip(node: &crate::cluster::ClusterNode, action: &str) {
    let status = node
        .ns
        .command("iptables")
        .args([
            action, "OUTPUT", "-p", "udp", "--dport", "7946", "-j", "DROP",
        ])
        .status()
        .expect("run iptables");
    assert!(
        status.success(),
        "iptables {action} OUTPUT in {}",
        node.name
    );
}

/// What `kills` power losses cost the client: the median time until a request is answered
/// again, and the share of requests that failed from `before` each kill to `after` it.
#[derive(Debug, Clone, Copy)]
pub struct KillFigures {
    pub failover_s: f64,
    pub failed_requests_pct: f64,
}

impl FailoverRig {
    /// `kills` power losses of the owner, one after another (the node comes back between),
    /// each printed as it happens.
    pub fn measure_kills(
        &mut self,
        kills: usize,
        before: Duration,
        after: Duration,
    ) -> KillFigures {
        let mut failovers = Vec::new();
        let (mut failed, mut total) = (0, 0);
        for k in 1..=kills {
            let run = self.kill_owner(before, after);
            let (f, t) = run.failed_in(before, after);
            failed += f;
            total += t;
            let s = run
                .failover_s()
                .expect("requests answered again after the kill");
            println!(
                "kill {k}: {} lost power; answered again after {s:.2} s; {f} of {t} requests failed",
                run.victim
            );
            failovers.push(s);
        }
        KillFigures {
            failover_s: crate::tcp_bench::median(failovers),
            failed_requests_pct: 100.0 * failed as f64 / total.max(1) as f64,
        }
    }

    /// Store writes per second at rest over `window`, counted by the store (a watch on every
    /// key): (by the nodes, per node; by the operator).
    pub fn writes_at_rest(&self, window: Duration) -> (f64, f64) {
        let writes = self
            .cluster
            .count_writes_by(true, || std::thread::sleep(window));
        let operator: u64 = writes
            .iter()
            .filter(|(key, _)| *key == "/Lease/ipam-operator")
            .map(|(_, n)| n)
            .sum();
        let nodes: u64 = writes.values().sum::<u64>() - operator;
        println!("writes at rest in {window:?}, by key: {writes:?}");
        let s = window.as_secs_f64();
        (
            nodes as f64 / self.cluster.nodes.len() as f64 / s,
            operator as f64 / s,
        )
    }
}

impl Drop for FailoverRig {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for s in self.servers.drain(..) {
            let _ = s.join();
        }
    }
}

/// A backend listening on `bind`, port 8080: answers every connection with the node's name.
pub fn serve(bind: IpAddr, node: &str, stop: &AtomicBool) {
    serve_on(
        TcpListener::bind((bind, PORT)).expect("backend listens"),
        node,
        stop,
    );
}

/// A backend on `listener`: answers every connection with the node's name until `stop`.
pub fn serve_on(listener: TcpListener, node: &str, stop: &AtomicBool) {
    listener.set_nonblocking(true).expect("non-blocking");
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((mut conn, _)) => {
                let _ = conn.write_all(node.as_bytes());
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// One request every 50 ms to `ip`, port 8080, each on its own thread (in this namespace) so a
/// slow one does not delay the next, until `done`; the samples end sorted by time.
pub fn requests(ip: IpAddr, start: Instant, done: &AtomicBool, samples: &Arc<Mutex<Vec<Sample>>>) {
    requests_with(start, done, samples, move || request(ip));
}

/// One `fetch` every 50 ms, each on its own thread (in this namespace), until `done`; a
/// sample per fetch with what it answered, sorted by time at the end.
pub fn requests_with(
    start: Instant,
    done: &AtomicBool,
    samples: &Arc<Mutex<Vec<Sample>>>,
    fetch: impl Fn() -> Option<String> + Clone + Send + 'static,
) {
    let mut next = Instant::now();
    let mut inflight = Vec::new();
    while !done.load(Ordering::SeqCst) {
        let samples = samples.clone();
        let fetch = fetch.clone();
        inflight.push(std::thread::spawn(move || {
            let at = start.elapsed();
            let node = fetch();
            samples.lock().unwrap().push(Sample { at, node });
        }));
        next += PERIOD;
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    for t in inflight {
        let _ = t.join();
    }
    samples.lock().unwrap().sort_by_key(|s| s.at);
}

fn request(ip: IpAddr) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&SocketAddr::new(ip, PORT), REQUEST_TIMEOUT).ok()?;
    s.set_read_timeout(Some(REQUEST_TIMEOUT)).ok()?;
    let mut name = String::new();
    s.read_to_string(&mut name).ok()?;
    (!name.is_empty()).then_some(name)
}

/// Records every gratuitous ARP for `ip` (sender and target address both `ip`).
fn watch_gratuitous(
    ip: Ipv4Addr,
    start: Instant,
    macs: &BTreeMap<[u8; 6], String>,
    done: &AtomicBool,
    seen: &Mutex<Vec<(Duration, String)>>,
) {
    let resolver = Resolver::new("eth0");
    while !done.load(Ordering::SeqCst) {
        if let Some(f) = resolver.next_arp(Duration::from_millis(100), |f| {
            f.sender_ip == ip && f.target_ip == ip && (f.op == ARP_REPLY || f.op == 1)
        }) {
            let node = macs
                .get(&f.sender_mac)
                .cloned()
                .unwrap_or_else(|| format!("{:x?}", f.sender_mac));
            seen.lock().unwrap().push((start.elapsed(), node));
        }
    }
}
