//! A cluster on one machine: a fabric namespace holding the L2 segment (a bridge), three real
//! etcd members and the operator replicas; node namespaces on the bridge, each running
//! `ipamd --role agent` with the pod datapath on its uplink; pods wired by `ipam-cni`.
//!
//! Addresses: the segment is 10.77.0.0/24 and fd77::/64 (node i at .i+1 / ::i+1, the fabric
//! and etcd at .254 / ::fe); pods come from 10.240.0.0/16 (/24 blocks) and fd00:240::/104
//! (/120 blocks). A cluster of more nodes than the /24 holds beside its Service IPs and client
//! (`widen_segment`) puts its nodes in 10.77.1.0 and up, the segment a /16, and their IPv6
//! addresses at fd77::1:<i+1>. Everything is the test's own and goes away on drop.

use std::{
    collections::BTreeMap,
    net::Ipv4Addr,
    path::PathBuf,
    time::{Duration, Instant},
};

use ipam_core::{
    Cidr,
    resources::NodeIpam,
    store::{TypedStore, Versioned},
};
use ipam_etcd::{EtcdConfig, EtcdStore, testing::EtcdCluster};
use serde_json::{Value, json};

use crate::{
    BpffsRoot, TempDir, TempFile,
    cni::run_cni,
    daemon::Daemon,
    netns::{Netns, veth},
    workspace_binary,
};

pub const UPLINK: &str = "up0";
const FABRIC_V4: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 254);

/// Timings short enough for tests, in the proportions of the defaults.
pub const NODE_LEASE_MS: u64 = 1500;
pub const NODE_GRACE_MS: u64 = 6000;
pub const OPERATOR_LEASE_MS: u64 = 3000;

pub struct Cluster {
    pub fabric: Netns,
    pub etcd: EtcdCluster,
    pub store: EtcdConfig,
    /// The `[store]` and `[cluster]` sections every daemon of the cluster shares.
    store_section: String,
    pub nodes: Vec<ClusterNode>,
    pub operators: Vec<Option<Daemon>>,
    operator_config: TempFile,
    /// The cluster key of the agents' gossip, once `enable_gossip` was called.
    gossip_key: Option<TempFile>,

    /// Whether the agents and operators run pod IPAM (`[ipam]`), or only Service IPs (the
    /// add-on mode, beside another CNI).
    pod_ipam: bool,
    /// More L2 segments (`add_segment`) every node added later has a port on.
    segments: Vec<Segment>,
    /// Nodes are in 10.77.1.0/16 and up (`widen_segment`).
    wide: bool,
    _dir: TempDir,
}

/// A second L2 segment: a bridge in the fabric, and the interface each node has on it, with
/// node `i` at `<subnet>.<i+1>/24`.
struct Segment {
    bridge: String,
    interface: String,
    subnet: String,
}

pub struct ClusterNode {
    pub name: String,
    pub ns: Netns,
    pub dir: TempDir,
    config: TempFile,
    root: BpffsRoot,
    pub daemon: Option<Daemon>,
    /// The logs of the agents stopped here (through `stop` and `power_off`), oldest first:
    /// a restart test's failure reads what the agent before the running one did.
    earlier_logs: String,
    /// The `ipamd` its agent runs: this workspace's when `None`, another release's otherwise
    /// (`previous_release_ipamd`).
    pub binary: Option<PathBuf>,
}

/// One pod: its namespace, CNI identity and addresses.
pub struct ClusterPod {
    pub ns: Netns,
    pub container: String,
    pub v4: String,
    pub v6: String,
}

impl Cluster {
    /// The fabric, etcd and `operators` operator replicas; no node yet.
    pub fn start(tag: &str, operators: usize) -> Self {
        Self::start_with(tag, operators, POOLS, NODE_GRACE_MS)
    }

    /// As `start`, with other operator configuration appended (`[[ipam.pool]]` entries, and
    /// tables after them such as `[metrics]`) and node grace period.
    pub fn start_with(tag: &str, operators: usize, pools: &str, node_grace_ms: u64) -> Self {
        let ipam = format!("[ipam]\nmode = \"cluster-pool\"\n{pools}");
        Self::start_as(tag, operators, Some(&ipam), node_grace_ms)
    }

    /// The fabric, etcd and `operators` operator replicas of the add-on mode (no `[ipam]`:
    /// LB-IPAM and L2 announcements only, pods wired by another CNI); no node yet.
    pub fn start_add_on(tag: &str, operators: usize) -> Self {
        Self::start_as(tag, operators, None, NODE_GRACE_MS)
    }

    fn start_as(tag: &str, operators: usize, ipam: Option<&str>, node_grace_ms: u64) -> Self {
        let fabric = Netns::new(&format!("{tag}f"));
        fabric.add_bridge("br0");
        fabric.add_address("br0", &format!("{FABRIC_V4}/24"));
        fabric.add_address("br0", "fd77::fe/64");
        let etcd = EtcdCluster::start_in_netns(3, &fabric.path(), FABRIC_V4)
            .expect("etcd members in the fabric namespace");
        let store = etcd.config(&ipam_etcd::testing::unique_prefix(tag));
        let store_section = store_section(&store, node_grace_ms);
        let dir = TempDir::new(&format!("{tag}-cluster-"));
        let operator_config = TempFile::new(&format!("{tag}-op"), "toml");
        std::fs::write(
            &operator_config.0,
            format!("{store_section}\n{}", ipam.unwrap_or_default()),
        )
        .expect("write operator config");
        let mut cluster = Self {
            fabric,
            etcd,
            store,
            store_section,
            nodes: Vec::new(),
            operators: Vec::new(),
            operator_config,
            gossip_key: None,

            pod_ipam: ipam.is_some(),
            segments: Vec::new(),
            wide: false,
            _dir: dir,
        };
        for _ in 0..operators {
            let daemon = cluster.start_operator();
            cluster.operators.push(Some(daemon));
        }
        cluster
    }

    /// Starts another operator replica in the fabric namespace.
    pub fn start_operator(&self) -> Daemon {
        Daemon::start_with(
            &self.fabric,
            &self.operator_config.0,
            &["--role", "operator"],
        )
    }

    /// Nodes added from now on tell each other who is alive over UDP (`[gossip]`, with a key of
    /// the cluster's own and the responders' timings below the suspicion delay) instead of
    /// through their leases.
    pub fn enable_gossip(&mut self) {
        let key = TempFile::new("gossip-key", "key");
        std::fs::write(&key.0, random_key_hex() + "\n").expect("write the gossip key");
        self.gossip_key = Some(key);
    }

    /// The gossip key file, when the cluster gossips.
    pub fn gossip_key(&self) -> Option<&std::path::Path> {
        self.gossip_key.as_ref().map(|k| k.0.as_path())
    }

    /// Makes room for hundreds of nodes on the segment: nodes added from now on are at
    /// `wide_node_addresses`, the segment a /16 (the fabric gets an address in it), while
    /// Service IPs and clients keep 10.77.0.0/24.
    pub fn widen_segment(&mut self) {
        assert!(
            self.nodes.is_empty(),
            "widen the segment before adding nodes"
        );
        self.fabric.add_address("br0", "10.77.255.254/16");
        self.wide = true;
    }

    /// Node `index`'s addresses on the segment, and the v4 prefix length.
    pub fn node_addresses_of(&self, index: usize) -> (String, String, u8) {
        if self.wide {
            let (v4, v6) = wide_node_addresses(index);
            (v4, v6, 16)
        } else {
            let (v4, v6) = node_addresses(index);
            (v4, v6, 24)
        }
    }

    /// Adds node `index` (a namespace on the bridge) and starts its agent.
    pub fn add_node(&mut self, tag: &str) -> usize {
        self.add_node_with(tag, "")
    }

    /// As `add_node`, with more configuration (`[[announcement]]` tables, say) for its agent.
    pub fn add_node_with(&mut self, tag: &str, extra_config: &str) -> usize {
        let index = self.prepare_node(tag, extra_config);
        self.nodes[index].start();
        index
    }

    /// Adds node `index` (its namespace on the bridge, its configuration with `extra_config`)
    /// without starting its agent: for starting many at once (`ClusterNode::launch`).
    pub fn prepare_node(&mut self, tag: &str, extra_config: &str) -> usize {
        let index = self.nodes.len();
        let name = format!("node-{index}");
        let ns = Netns::new(&format!("{tag}n{index}"));
        veth(&ns, UPLINK, &self.fabric, &format!("p{index}"));
        self.fabric.add_port(&format!("p{index}"), "br0");
        let (v4, v6, v4_prefix) = self.node_addresses_of(index);
        ns.add_address(UPLINK, &format!("{v4}/{v4_prefix}"));
        ns.add_address(UPLINK, &format!("{v6}/64"));
        for (k, segment) in self.segments.iter().enumerate() {
            let port = format!("s{k}p{index}");
            veth(&ns, &segment.interface, &self.fabric, &port);
            self.fabric.add_port(&port, &segment.bridge);
            ns.add_address(
                &segment.interface,
                &format!("{}.{}/24", segment.subnet, index + 1),
            );
        }
        let dir = TempDir::new(&format!("{tag}-n{index}-"));
        let root = BpffsRoot::new();
        let config = TempFile::new(&format!("{tag}-n{index}"), "toml");
        // With gossip a killed agent's responders must be silent before the suspicion delay
        // (400 ms) runs out.
        let (timeout, gossip) = match &self.gossip_key {
            Some(key) => (
                300,
                format!("[gossip]\nkey_file = \"{}\"\n", key.0.display()),
            ),
            None => (500, String::new()),
        };
        let d = dir.0.display();
        let who = if self.pod_ipam {
            format!(
                "[ipam]\nmode = \"cluster-pool\"\nnode_name = \"{name}\"\nstate_dir = \"{d}/node\"\n\
                 socket = \"{d}/api/ipamd.sock\"\nfamilies = [\"v4\", \"v6\"]\nuplinks = [\"{UPLINK}\"]\n"
            )
        } else {
            format!(
                "[node]\nname = \"{name}\"\naddresses = [\"{v4}\", \"{v6}\"]\n\
                 socket = \"{d}/api/ipamd.sock\"\n"
            )
        };
        std::fs::write(
            &config.0,
            format!(
                "[datapath]\nbpffs_root = \"{}\"\nliveness_timeout_ms = {timeout}\nheartbeat_interval_ms = 100\n\n{}\n\
                 {who}\n{gossip}{extra_config}",
                root.0.display(),
                self.store_section,
            ),
        )
        .expect("write agent config");
        self.nodes.push(ClusterNode {
            name,
            ns,
            dir,
            config,
            root,
            daemon: None,
            earlier_logs: String::new(),
            binary: None,
        });
        index
    }

    /// Runs `ipamctl ARGS --config <node's ipamd.toml>` in the node's namespace (it reaches
    /// etcd over the segment); returns its output, panicking with it when it fails.
    pub fn ipamctl(&self, node: usize, args: &[&str]) -> String {
        let n = &self.nodes[node];
        let out =
            n.ns.command(crate::workspace_binary("ipamctl"))
                .args(args)
                .arg("--config")
                .arg(n.config_path())
                .output()
                .expect("run ipamctl");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "ipamctl {args:?}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    }

    /// Runs `ipamctl ARGS --config <the operators' config>` in the fabric namespace (where etcd
    /// listens), with no node needed; returns its output whatever its exit code.
    pub fn ipamctl_beside_store(&self, args: &[&str]) -> std::process::Output {
        self.fabric
            .command(crate::workspace_binary("ipamctl"))
            .args(args)
            .arg("--config")
            .arg(&self.operator_config.0)
            .output()
            .expect("run ipamctl")
    }

    /// Runs `f` against the cluster's store, from the fabric namespace (where etcd listens).
    pub fn with_store<T: Send + 'static>(
        &self,
        f: impl AsyncFnOnce(EtcdStore) -> T + Send + 'static,
    ) -> T {
        let config = self.store.clone();
        self.fabric.run(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime")
                .block_on(async move {
                    let store = EtcdStore::connect(config).await.expect("etcd client");
                    f(store).await
                })
        })
    }

    /// Every node record, by node name (empty while the store cannot be read).
    pub fn records(&self) -> BTreeMap<String, Versioned<NodeIpam>> {
        self.with_store(async |s| s.list_typed::<NodeIpam>().await)
            .map(|all| all.into_iter().map(|r| (r.name.clone(), r)).collect())
            .unwrap_or_default()
    }

    /// The blocks each node holds according to the store.
    pub fn blocks(&self) -> BTreeMap<String, Vec<Cidr>> {
        self.records()
            .into_iter()
            .map(|(n, r)| (n, r.value.status.allocated.iter().map(|b| b.cidr).collect()))
            .collect()
    }

    /// Panics when a block is held by two nodes, or by a node and another's local state.
    pub fn assert_no_block_twice(&self) {
        let mut holder: BTreeMap<Cidr, String> = BTreeMap::new();
        for (node, blocks) in self.blocks() {
            for b in blocks {
                if let Some(other) = holder.insert(b, node.clone()) {
                    panic!("block {b} held by {other} and {node}");
                }
            }
        }
    }

    /// Writes `value` as `name` (creating or replacing it).
    pub fn put<T: ipam_core::store::Resource + Clone + 'static>(&self, name: &str, value: &T) {
        let (name, value) = (name.to_owned(), value.clone());
        self.with_store(async move |s| {
            loop {
                let result = match s.get_typed::<T>(&name).await.expect("read") {
                    None => s.create_typed(&name, &value).await,
                    Some(cur) => s.update_typed(&name, &value, &cur.revision).await,
                };
                if result.is_ok() {
                    break;
                }
            }
        });
    }

    /// Deletes `name` of `T`'s kind (nothing if there is none).
    pub fn delete<T: ipam_core::store::Resource + 'static>(&self, name: &str) {
        let name = name.to_owned();
        self.with_store(async move |s| {
            ipam_core::store::Store::delete(&s, T::KIND, &name, None).await
        })
        .expect("delete");
    }

    /// Every object of `T`'s kind.
    pub fn list<T: ipam_core::store::Resource + 'static>(&self) -> Vec<Versioned<T>> {
        self.with_store(async |s| s.list_typed::<T>().await)
            .unwrap_or_default()
    }

    /// The status of Service `name` (`namespace/name`) as stored; empty while it has none.
    pub fn service_status(&self, name: &str) -> ipam_core::lb::resources::ServiceStatus {
        self.list::<ipam_core::lb::resources::Service>()
            .into_iter()
            .find(|s| s.name == name)
            .map(|s| s.value.status)
            .unwrap_or_default()
    }

    /// Another L2 segment, `<subnet>.0/24` (`subnet` as `10.79.0`): a bridge in the fabric,
    /// and on every node added from now on an interface `interface` on it at
    /// `<subnet>.<index+1>`.
    pub fn add_segment(&mut self, bridge: &str, interface: &str, subnet: &str) {
        self.fabric.add_bridge(bridge);
        self.segments.push(Segment {
            bridge: bridge.to_owned(),
            interface: interface.to_owned(),
            subnet: subnet.to_owned(),
        });
    }

    /// A client host on segment `bridge` (`add_segment`) at `<subnet>.100/24` on its `eth0`.
    pub fn add_client_on(&self, tag: &str, bridge: &str) -> Netns {
        let segment = self
            .segments
            .iter()
            .find(|s| s.bridge == bridge)
            .unwrap_or_else(|| panic!("no segment {bridge}: add_segment first"));
        let client = Netns::new(tag);
        let port = format!("c{}", &client.name[client.name.len().saturating_sub(6)..]);
        veth(&client, "eth0", &self.fabric, &port);
        self.fabric.add_port(&port, bridge);
        client.add_address("eth0", &format!("{}.100/24", segment.subnet));
        client
    }

    /// A client host on the segment: 10.77.0.100/24 and fd77::100/64 on its `eth0`.
    pub fn add_client(&self, tag: &str) -> Netns {
        let client = Netns::new(tag);
        veth(
            &client,
            "eth0",
            &self.fabric,
            &format!("c{}", &client.name[client.name.len().saturating_sub(6)..]),
        );
        let port = format!("c{}", &client.name[client.name.len().saturating_sub(6)..]);
        self.fabric.add_port(&port, "br0");
        client.add_address("eth0", "10.77.0.100/24");
        client.add_address("eth0", "fd77::100/64");
        client
    }

    /// Every write to the cluster's keys while `during` runs, counted by kind from a watch on
    /// the whole prefix (by key instead with `IPAM_WRITES_BY_KEY` set, to find who writes).
    pub fn count_writes(&self, during: impl FnOnce()) -> BTreeMap<String, u64> {
        self.count_writes_by(std::env::var_os("IPAM_WRITES_BY_KEY").is_some(), during)
    }

    /// As `count_writes`, by key (`Kind/name`) when `by_key`.
    pub fn count_writes_by(&self, by_key: bool, during: impl FnOnce()) -> BTreeMap<String, u64> {
        let config = self.store.clone();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
        let counter = self.fabric.spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime")
                .block_on(async move {
                    let mut client = etcd_client::Client::connect(&config.endpoints, None)
                        .await
                        .expect("etcd client");
                    let mut watch = client
                        .watch(
                            config.prefix.clone(),
                            Some(etcd_client::WatchOptions::new().with_prefix()),
                        )
                        .await
                        .expect("etcd watch");
                    ready_tx.send(()).expect("ready");
                    let mut by_kind: BTreeMap<String, u64> = BTreeMap::new();
                    loop {
                        tokio::select! {
                            m = watch.message() => {
                                let Ok(Some(m)) = m else { break };
                                for e in m.events() {
                                    let key = e
                                        .kv()
                                        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
                                        .unwrap_or_default();
                                    let rest = key.trim_start_matches(&config.prefix);
                                    let kind = if by_key {
                                        rest.to_owned()
                                    } else {
                                        rest.split('/').nth(1).unwrap_or("?").to_owned()
                                    };
                                    *by_kind.entry(kind).or_default() += 1;
                                }
                            }
                            () = tokio::time::sleep(Duration::from_millis(50)) => {
                                if stop_rx.try_recv().is_ok() { break; }
                            }
                        }
                    }
                    by_kind
                })
        });
        ready_rx.recv().expect("watch started");
        during();
        stop_tx.send(()).expect("stop");
        counter.join().expect("counter")
    }

    /// Cuts the nodes in `group` off from the other nodes (blackhole routes both ways, both
    /// families): a partition between nodes that the store (on the fabric) and clients on the
    /// segment do not share.
    pub fn partition(&self, group: &[usize]) {
        self.partition_routes(group, Netns::blackhole);
    }

    /// Undoes `partition(group)`.
    pub fn heal(&self, group: &[usize]) {
        self.partition_routes(group, Netns::delete_route);
    }

    fn partition_routes(&self, group: &[usize], route: impl Fn(&Netns, &str)) {
        let outside: Vec<usize> = (0..self.nodes.len())
            .filter(|i| !group.contains(i))
            .collect();
        for (from, to) in group
            .iter()
            .flat_map(|g| outside.iter().flat_map(move |o| [(*g, *o), (*o, *g)]))
        {
            let (v4, v6, _) = self.node_addresses_of(to);
            route(&self.nodes[from].ns, &format!("{v4}/32"));
            route(&self.nodes[from].ns, &format!("{v6}/128"));
        }
    }

    /// The log of operator replica `i` (empty when it was stopped).
    pub fn operator_log(&self, i: usize) -> String {
        self.operators[i]
            .as_ref()
            .map(Daemon::log_text)
            .unwrap_or_default()
    }

    /// Which operator replica leads, by the lease in the store.
    pub fn leader(&self) -> Option<String> {
        use ipam_core::{resources::OPERATOR_LEASE, store::lease::Lease};
        self.with_store(async |s| s.get_typed::<Lease>(OPERATOR_LEASE).await)
            .ok()
            .flatten()
            .map(|l| l.value.holder)
            .filter(|h| !h.is_empty())
    }

    /// The node that answers the most of `owners`' IPs, leaving out the nodes in `skip`: the
    /// one whose drain moves the most. Its index, and the IPs it answers.
    pub fn busiest_node(
        &self,
        owners: &BTreeMap<Ipv4Addr, String>,
        skip: &[String],
    ) -> (usize, Vec<Ipv4Addr>) {
        let at = (0..self.nodes.len())
            .filter(|i| !skip.contains(&self.nodes[*i].name))
            .max_by_key(|i| {
                owners
                    .values()
                    .filter(|o| **o == self.nodes[*i].name)
                    .count()
            })
            .expect("a node not skipped");
        let name = &self.nodes[at].name;
        let theirs = owners
            .iter()
            .filter(|(_, owner)| *owner == name)
            .map(|(ip, _)| *ip)
            .collect();
        (at, theirs)
    }
}

impl ClusterNode {
    /// Starts (or restarts) the node's agent and waits until its API answers.
    pub fn start(&mut self) {
        self.launch();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.api_answers() {
            assert!(
                Instant::now() < deadline,
                "{}: agent never answered:\n{}",
                self.name,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the node's agent cleanly (SIGTERM) and waits until it is gone.
    pub fn stop(&mut self) {
        self.end_agent(Daemon::terminate);
    }

    /// Kills the node's agent (SIGKILL) and waits until it is gone.
    pub fn kill(&mut self) {
        self.end_agent(Daemon::kill);
    }

    /// Ends the node's agent with `end`, keeping its log for `log()`.
    fn end_agent(&mut self, end: impl FnOnce(Daemon) -> String) {
        let name = &self.name;
        let daemon = self
            .daemon
            .take()
            .unwrap_or_else(|| panic!("{name}'s agent is not running"));
        let log = end(daemon);
        self.keep_log(&log);
    }

    /// Keeps the log of an agent stopped here for `log()`.
    fn keep_log(&mut self, log: &str) {
        self.earlier_logs.push_str(log);
        self.earlier_logs
            .push_str("--- (the agent above stopped; the next one's log follows)\n");
    }

    /// Starts the node's agent without waiting for it.
    pub fn launch(&mut self) {
        let args = ["--role", "agent"];
        self.daemon = Some(match &self.binary {
            Some(binary) => Daemon::start_binary(&self.ns, binary, &self.config.0, &args, &[]),
            None => Daemon::start_with(&self.ns, &self.config.0, &args),
        });
    }

    /// The agent's metrics (`[metrics] listen` must be `127.0.0.1:<port>`), or `None` while
    /// they do not answer.
    pub fn metrics(&self, port: u16) -> Option<String> {
        self.ns.run(move || {
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
            crate::http::http_get_path(addr, "/metrics", Duration::from_secs(2)).ok()
        })
    }

    /// The agent's process id, while it runs.
    pub fn pid(&self) -> Option<i32> {
        self.daemon.as_ref().map(Daemon::pid)
    }

    pub fn api_answers(&self) -> bool {
        ipam_api::client::call(
            &self.socket(),
            &ipam_api::types::Request::Status,
            Duration::from_secs(1),
        )
        .is_ok()
    }

    /// A power loss: the agent SIGKILLed and the node's link to the segment cut.
    pub fn power_off(&mut self) {
        if let Some(d) = self.daemon.take() {
            let log = d.kill();
            self.keep_log(&log);
        }
        self.ns.down(UPLINK);
    }

    /// The MAC of the node's uplink.
    pub fn mac(&self) -> [u8; 6] {
        self.ns.mac(UPLINK)
    }

    /// `true` when the agent can serve pods (router addresses in place).
    pub fn ready(&self) -> bool {
        matches!(
            ipam_api::client::call(
                &self.socket(),
                &ipam_api::types::Request::Status,
                Duration::from_secs(1),
            ),
            Ok(ipam_api::types::Response::Ready)
        )
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.0.join("api/ipamd.sock")
    }

    /// The agent's configuration file.
    pub fn config_path(&self) -> &std::path::Path {
        &self.config.0
    }

    /// Sets `key` in the agent's `[node]` section to `value` (TOML), or takes it out with
    /// `None`, and has the running agent reload its configuration (SIGHUP).
    pub fn set_node_setting(&self, key: &str, value: Option<&str>) {
        self.set_setting("node", key, value);
    }

    /// Gives the node the label `key` (`Some(value)`) or takes it away, by the agent's
    /// `[node.labels]` and a reload, as a host's owner would: the exclusion label drains it.
    pub fn set_node_label(&self, key: &str, value: Option<&str>) {
        let value = value.map(|v| format!("{v:?}"));
        self.set_setting("node.labels", &format!("{key:?}"), value.as_deref());
    }

    /// Sets `key` in the configuration's `[section]` to `value` (TOML), or takes it out with
    /// `None`, and has the running agent reload its configuration (SIGHUP).
    fn set_setting(&self, section: &str, key: &str, value: Option<&str>) {
        let text = std::fs::read_to_string(self.config_path()).expect("read the agent's config");
        let prefix = format!("{key} =");
        let header = format!("[{section}]\n");
        let mut kept: String = text
            .lines()
            .filter(|l| !l.starts_with(&prefix))
            .map(|l| format!("{l}\n"))
            .collect();
        if let Some(value) = value {
            if !kept.contains(&header) {
                kept.push_str(&header);
            }
            kept = kept.replacen(&header, &format!("{header}{key} = {value}\n"), 1);
        }
        std::fs::write(self.config_path(), kept).expect("write the agent's config");
        let daemon = self.daemon.as_ref().expect("the agent runs");
        let reloads = daemon.log_text().matches("configuration reloaded").count();
        daemon.signal(nix::sys::signal::Signal::SIGHUP);
        wait_until(
            Duration::from_secs(10),
            "the agent to reload its configuration",
            || daemon.log_text().matches("configuration reloaded").count() > reloads,
            || daemon.log_text(),
        );
    }

    pub fn log(&self) -> String {
        let current = self
            .daemon
            .as_ref()
            .map(Daemon::log_text)
            .unwrap_or_default();
        format!("{}{current}", self.earlier_logs)
    }

    /// The node's published status (`ipamctl ipam status` reads the same file).
    pub fn status(&self) -> Option<ipam_core::pod::published::PublishedStatus> {
        ipam_core::pod::published::read_status(&self.dir.0.join("node")).ok()
    }

    pub fn bpffs_root(&self) -> &std::path::Path {
        &self.root.0
    }

    /// The network configuration with `ipam-cni` as the main plugin.
    pub fn conf(&self) -> Value {
        json!({
            "cniVersion": "1.1.0",
            "name": "podnet",
            "type": "ipam-cni",
            "socket": self.socket(),
            "timeoutMs": 5000,
            "mtu": 1500,
        })
    }

    /// A new pod on this node, wired by CNI ADD; `Err` with the plugin's output if it failed.
    pub fn try_add_pod(&self, tag: &str) -> Result<ClusterPod, Value> {
        let ns = Netns::new(tag);
        let container = format!("ctr-{}", ns.name);
        let (ok, result) = run_cni(
            &workspace_binary("ipam-cni"),
            Some(&self.ns),
            "ADD",
            &container,
            "eth0",
            Some(&ns),
            &self.conf(),
        );
        if !ok {
            return Err(result);
        }
        let (v4, v6) = crate::pod_net::result_addresses(&result);
        Ok(ClusterPod {
            ns,
            container,
            v4,
            v6,
        })
    }

    pub fn add_pod(&self, tag: &str) -> ClusterPod {
        self.try_add_pod(tag)
            .unwrap_or_else(|e| panic!("CNI ADD of {tag} on {}: {e}\n{}", self.name, self.log()))
    }
}

/// Node `index`'s addresses on the segment.
pub fn node_addresses(index: usize) -> (String, String) {
    (
        format!("10.77.0.{}", index + 1),
        format!("fd77::{}", index + 1),
    )
}

/// Node `index`'s addresses on a widened segment (`Cluster::widen_segment`): 250 nodes per
/// /24 from 10.77.1.0.
pub fn wide_node_addresses(index: usize) -> (String, String) {
    (
        format!("10.77.{}.{}", 1 + index / 250, 1 + index % 250),
        format!("fd77::1:{:x}", index + 1),
    )
}

/// The pools of `Cluster::start`.
pub const POOLS: &str = "[[ipam.pool]]\nname = \"default\"\n\
    ipv4 = { cidrs = [\"10.240.0.0/16\"], maskSize = 24 }\n\
    ipv6 = { cidrs = [\"fd00:240::/104\"], maskSize = 120 }\n";

fn store_section(store: &EtcdConfig, node_grace_ms: u64) -> String {
    format!(
        "[store]\nkind = \"etcd\"\n[store.etcd]\nendpoints = {:?}\nprefix = \"{}\"\n\
         request_timeout_ms = 1000\ndial_timeout_ms = 500\n\n[cluster]\n\
         node_lease_ms = {NODE_LEASE_MS}\nnode_grace_ms = {node_grace_ms}\n\
         node_renew_ms = {renew}\noperator_lease_ms = {OPERATOR_LEASE_MS}\nresync_ms = 5000\n",
        store.endpoints,
        store.prefix,
        // With gossip the lease is renewed this often: as the default (10 s) allows for the
        // grace period.
        renew = (node_grace_ms / 3).min(10_000),
    )
}

/// 32 random bytes from the kernel, in hex: a gossip key.
pub fn random_key_hex() -> String {
    let mut key = [0; 32];
    std::io::Read::read_exact(
        &mut std::fs::File::open("/dev/urandom").expect("/dev/urandom"),
        &mut key,
    )
    .expect("read /dev/urandom");
    key.iter().map(|b| format!("{b:02x}")).collect()
}

/// How many node records whose name starts with `prefix` hold a block, in `store` (any store:
/// the benches ask etcd and the Kubernetes API); none while the store does not answer.
pub async fn nodes_holding_blocks<S: TypedStore>(store: &S, prefix: &str) -> usize {
    store.list_typed::<NodeIpam>().await.map_or(0, |all| {
        all.iter()
            .filter(|r| r.name.starts_with(prefix) && !r.value.status.allocated.is_empty())
            .count()
    })
}

/// Waits until `done` holds, or panics after `timeout` with `what` and `context()`.
pub fn wait_until(
    timeout: Duration,
    what: &str,
    mut done: impl FnMut() -> bool,
    context: impl Fn() -> String,
) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}\n{}",
            context()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
