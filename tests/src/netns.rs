//! Network namespaces, links, addresses and routes owned by a test, made through the project's
//! own netlink crate (no `ip` commands), and commands run inside a namespace.

use std::{
    ffi::OsStr, fs::File, net::IpAddr, os::unix::process::CommandExt, path::PathBuf,
    process::Command, sync::Mutex,
};

use ipam_netlink::{LinkInfo, Netlink, RouteInfo};

use crate::unique;

/// A named network namespace (as `ip netns add` makes them), deleted on drop with everything in
/// it. Its methods panic with the namespace and object named: a test cannot go on without them.
pub struct Netns {
    pub name: String,
    /// One request at a time: answers on a netlink socket are matched to the request that is
    /// waiting for them.
    netlink: Mutex<Netlink>,
}

impl Netns {
    /// A new namespace with its loopback up.
    pub fn new(tag: &str) -> Self {
        let name = unique(tag);
        let path = ipam_netlink::netns::create(&name).unwrap_or_else(|e| panic!("{e}"));
        let netlink = Netlink::open_in(&path).unwrap_or_else(|e| {
            let _ = ipam_netlink::netns::delete(&name);
            panic!("{e}")
        });
        let ns = Self {
            name,
            netlink: Mutex::new(netlink),
        };
        ns.up("lo");
        ns
    }

    pub fn path(&self) -> PathBuf {
        ipam_netlink::netns::path(&self.name)
    }

    /// Runs `request` on this namespace's netlink connection; panics naming the namespace when
    /// the kernel refuses.
    fn netlink<T>(
        &self,
        request: impl FnOnce(&Netlink) -> Result<T, ipam_netlink::NetlinkError>,
    ) -> T {
        let netlink = self
            .netlink
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        request(&netlink).unwrap_or_else(|e| panic!("namespace {}: {e}", self.name))
    }

    /// The link `dev`, which must exist.
    pub fn link(&self, dev: &str) -> LinkInfo {
        self.netlink(|nl| nl.link_by_name(dev))
            .unwrap_or_else(|| panic!("namespace {}: no link {dev}", self.name))
    }

    pub fn links(&self) -> Vec<LinkInfo> {
        self.netlink(Netlink::links)
    }

    pub fn up(&self, dev: &str) {
        let index = self.link(dev).index;
        self.netlink(|nl| nl.set_up(index));
    }

    pub fn down(&self, dev: &str) {
        let index = self.link(dev).index;
        self.netlink(|nl| nl.set_down(index));
    }

    /// A bridge named `name`, up.
    pub fn add_bridge(&self, name: &str) {
        // A fixed, locally administered MAC from the name: a bridge left to choose follows
        // the lowest MAC of its ports, and changed it when a test's client joined the segment
        // after the nodes, stalling the nodes' connections to etcd behind it for seconds.
        let mut mac = [0x02, 0x77, 0, 0, 0, 0];
        for (i, byte) in name.bytes().enumerate() {
            mac[2 + i % 4] ^= byte;
        }
        self.netlink(|nl| nl.create_bridge(name, mac));
    }

    /// Makes `dev` a port of the bridge `bridge`.
    pub fn add_port(&self, dev: &str, bridge: &str) {
        let (port, bridge) = (self.link(dev).index, self.link(bridge).index);
        self.netlink(|nl| nl.set_controller(port, bridge));
    }

    /// Adds `cidr` ("10.0.0.1/24", "fd00::1/64": an address and its prefix length) to `dev`;
    /// IPv6 without duplicate address detection.
    pub fn add_address(&self, dev: &str, cidr: &str) {
        let (ip, prefix_len) = address(cidr);
        let index = self.link(dev).index;
        self.netlink(|nl| nl.add_address(index, ip, prefix_len));
    }

    pub fn delete_address(&self, dev: &str, cidr: &str) {
        let (ip, prefix_len) = address(cidr);
        let index = self.link(dev).index;
        self.netlink(|nl| nl.delete_address(index, ip, prefix_len));
    }

    /// The addresses on `dev`, as (address, prefix length).
    pub fn addresses(&self, dev: &str) -> Vec<(IpAddr, u8)> {
        let index = self.link(dev).index;
        self.netlink(|nl| nl.addresses(index))
    }

    /// Routes `cidr` through `gateway`.
    pub fn route_via(&self, cidr: &str, gateway: &str) {
        let (destination, prefix_len) = address(cidr);
        let gateway: IpAddr = gateway
            .parse()
            .unwrap_or_else(|e| panic!("gateway {gateway}: {e}"));
        self.netlink(|nl| nl.add_gateway_route(destination, prefix_len, gateway));
    }

    /// Drops everything sent to `cidr`.
    pub fn blackhole(&self, cidr: &str) {
        let (destination, prefix_len) = address(cidr);
        self.netlink(|nl| nl.add_blackhole_route(destination, prefix_len));
    }

    /// Deletes the route to `cidr`, whatever it is.
    pub fn delete_route(&self, cidr: &str) {
        let (destination, prefix_len) = address(cidr);
        self.netlink(|nl| nl.delete_route(destination, prefix_len));
    }

    /// The main table's routes of one family.
    pub fn routes(&self, ipv6: bool) -> Vec<RouteInfo> {
        self.netlink(|nl| nl.routes(ipv6))
    }

    /// Every link with its state and addresses, one per line: for a failure message.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for link in self.links() {
            let addresses: Vec<String> = self
                .netlink(|nl| nl.addresses(link.index))
                .iter()
                .map(|(ip, len)| format!("{ip}/{len}"))
                .collect();
            let state = if link.up { "UP" } else { "DOWN" };
            out.push_str(&format!("{} {state} {}\n", link.name, addresses.join(" ")));
        }
        out
    }

    /// `program` as a command that runs in this namespace.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        command_in(&self.path(), program)
    }

    /// Runs `f` on a thread that has entered this namespace, and returns its result.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let handle = self.spawn(f);
        match handle.join() {
            Ok(v) => v,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }

    /// Like `run`, without waiting.
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<T> {
        let path = self.path();
        std::thread::spawn(move || {
            let file = File::open(&path).expect("open netns");
            // Only this thread moves into the namespace.
            let moved = nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET);
            assert!(moved.is_ok(), "setns {}: {:?}", path.display(), moved);
            f()
        })
    }

    /// The MAC address of `dev` in this namespace.
    pub fn mac(&self, dev: &str) -> [u8; 6] {
        self.link(dev).mac
    }

    pub fn ifindex(&self, dev: &str) -> u32 {
        self.link(dev).index
    }
}

/// `program` as a command that runs in the namespace at `path` (a namespace's
/// [`Netns::path`]), for callers that outlive no `Netns` borrow.
pub fn command_in(path: &std::path::Path, program: impl AsRef<OsStr>) -> Command {
    let netns = File::open(path).unwrap_or_else(|e| panic!("namespace {}: {e}", path.display()));
    let mut command = Command::new(program);
    // SAFETY: between fork and exec the child only calls setns(2), which is async-signal-safe,
    // and touches no lock or allocation; the file it reads was opened before the fork.
    unsafe {
        command.pre_exec(move || {
            nix::sched::setns(&netns, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(std::io::Error::from)
        });
    }
    command
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(e) = ipam_netlink::netns::delete(&self.name) {
            eprintln!("{e}");
        }
    }
}

/// Joins `a` and `b` with a veth pair named `dev_a` in `a` and `dev_b` in `b`, both up.
pub fn veth(a: &Netns, dev_a: &str, b: &Netns, dev_b: &str) {
    a.netlink(|nl| nl.create_veth(dev_a, dev_b, &b.path(), 1500));
    a.up(dev_a);
    b.up(dev_b);
}

/// "10.0.0.1/24" as (address, prefix length).
fn address(cidr: &str) -> (IpAddr, u8) {
    let parsed = cidr
        .split_once('/')
        .and_then(|(ip, len)| Some((ip.parse::<IpAddr>().ok()?, len.parse::<u8>().ok()?)));
    parsed.unwrap_or_else(|| panic!("{cidr} is not an address/prefix-length"))
}

/// The arguments of `iptables`/`ip6tables` that DNAT TCP to `service`:`port` towards `backend`
/// (`addr:port`, `[v6]:port`) at PREROUTING, as kube-proxy does for a Service.
pub fn dnat_args(service: &str, port: u16, backend: &str) -> Vec<String> {
    [
        "-t",
        "nat",
        "-A",
        "PREROUTING",
        "-d",
        service,
        "-p",
        "tcp",
        "--dport",
        &port.to_string(),
        "-j",
        "DNAT",
        "--to-destination",
        backend,
    ]
    .map(str::to_owned)
    .to_vec()
}
