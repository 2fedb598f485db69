//! One Kubernetes node: its own network namespace on the fabric's bridge and its own mount
//! namespace (its own /run, /var/lib/kubelet, /var/lib/containerd, /var/log, CNI directories,
//! /var/lib/ipam and a bpffs of its own at /sys/fs/bpf, every other path the host's), in which
//! its containerd, kubelet and kube-proxy run. Every process of the node, pods included, lives
//! in the node's cgroups (`<cgroup>` in every v1 hierarchy: kubelet's `cgroupRoot`, with the
//! node's own processes in `<cgroup>/system`), so a power loss freezes and kills all of them
//! at once.

use std::{
    collections::BTreeMap,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::netns::Netns;

/// The node's processes, in the order they start.
pub const COMPONENTS: [&str; 3] = ["containerd", "kubelet", "kube-proxy"];

/// The folders the node has of its own, and where its mount namespace puts them.
const OWN_DIRS: [(&str, &str); 7] = [
    ("kubelet", "/var/lib/kubelet"),
    ("containerd", "/var/lib/containerd"),
    ("log", "/var/log"),
    ("cni-conf", "/etc/cni/net.d"),
    ("cni-bin", "/opt/cni/bin"),
    ("ipam", "/var/lib/ipam"),
    ("kubernetes", "/etc/kubernetes"),
];

/// The CNI plugins every runtime needs on the node (containerd 1.6 calls `loopback` for each
/// pod), and the ones the add-on run's other CNI is made of. Debian's, from
/// containernetworking-plugins.
const DEBIAN_PLUGINS: [&str; 4] = ["loopback", "bridge", "host-local", "portmap"];
const DEBIAN_PLUGIN_DIR: &str = "/usr/lib/cni";

pub struct KubeNode {
    pub name: String,
    pub ip: Ipv4Addr,
    pub ipv6: String,
    pub ns: Netns,
    /// The node's port on the fabric's bridge (its link: cut on a power loss).
    pub port: String,
    pub dir: PathBuf,
    /// The node's cgroup, under every hierarchy's root.
    pub cgroup: String,
    holder: Child,
    processes: BTreeMap<&'static str, Child>,
}

impl KubeNode {
    /// Makes the node's mount namespace (its holder process keeps it), cgroups and folders.
    pub fn new(name: &str, ip: Ipv4Addr, ipv6: &str, ns: Netns, port: &str, dir: PathBuf) -> Self {
        for (own, _) in OWN_DIRS {
            std::fs::create_dir_all(dir.join(own)).expect("a node folder");
        }
        std::fs::create_dir_all(dir.join("logs")).expect("a node folder");
        for plugin in DEBIAN_PLUGINS {
            let from = Path::new(DEBIAN_PLUGIN_DIR).join(plugin);
            std::fs::copy(&from, dir.join("cni-bin").join(plugin)).unwrap_or_else(|e| {
                panic!(
                    "{}: {e} (install Debian's containernetworking-plugins: cargo xtask lab kube \
                     does)",
                    from.display()
                )
            });
        }
        let cgroup = format!("{}-{name}", crate::unique("ipamlab"));
        for hierarchy in hierarchies() {
            for sub in ["", "/system"] {
                let path = hierarchy.join(format!("{cgroup}{sub}"));
                std::fs::create_dir_all(&path)
                    .unwrap_or_else(|e| panic!("cgroup {}: {e}", path.display()));
                if hierarchy.ends_with("cpuset") {
                    // A new cpuset has no CPUs or memory nodes until it is given its parent's.
                    for file in ["cpuset.cpus", "cpuset.mems"] {
                        let parent = std::fs::read_to_string(path.parent().unwrap().join(file))
                            .expect("the parent cpuset");
                        std::fs::write(path.join(file), parent.trim()).expect("set the cpuset");
                    }
                }
            }
        }
        let holder = Self::hold(&ns, &dir);
        let node = Self {
            name: name.to_owned(),
            ip,
            ipv6: ipv6.to_owned(),
            ns,
            port: port.to_owned(),
            dir,
            cgroup,
            holder,
            processes: BTreeMap::new(),
        };
        let ready = node.dir.join("holder-ready");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ready.exists() {
            assert!(
                Instant::now() < deadline,
                "node {}: its mount namespace was not ready in 10 s",
                node.name
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        node
    }

    /// The process that holds the node's mount namespace: `unshare` a copy of the host's mounts,
    /// enter the node's network namespace (a sysfs mounted there shows its links), then mount
    /// the node's own folders and make every mount shared (the agent's bpffs is mounted
    /// Bidirectional into its container).
    fn hold(ns: &Netns, dir: &Path) -> Child {
        let mut script = String::from(
            "set -e\n\
             stash=$(mktemp -d)\n\
             mount --rbind /sys/fs/cgroup \"$stash\"\n\
             mount -t sysfs sysfs /sys\n\
             mount --rbind \"$stash\" /sys/fs/cgroup\n\
             umount -l \"$stash\"\n\
             rmdir \"$stash\" || true\n\
             mount -t bpf bpf /sys/fs/bpf\n\
             mount -t tmpfs tmpfs /run\n",
        );
        for (own, at) in OWN_DIRS {
            script.push_str(&format!(
                "mkdir -p {at}\nmount --bind {} {at}\n",
                dir.join(own).display()
            ));
        }
        script.push_str(&format!(
            "mount --make-rshared /\ntouch {}\nexec sleep infinity\n",
            dir.join("holder-ready").display()
        ));
        Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--", "nsenter"])
            .arg(format!("--net={}", ns.path().display()))
            .args(["--", "sh", "-c", &script])
            .stdout(Stdio::null())
            .stderr(log(&dir.join("logs/holder.log")))
            .spawn()
            .expect("start the node's mount namespace (unshare, nsenter from util-linux)")
    }

    /// `program` in the node's network and mount namespaces (not in its cgroup).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("nsenter");
        c.args(["-t", &self.holder.id().to_string(), "-m", "-n", "--"])
            .arg(program);
        c
    }

    /// Runs `program args` in the node and returns its output; panics naming the node when it
    /// fails.
    pub fn run(&self, program: &str, args: &[&str]) -> String {
        let out = self
            .command(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("node {}: cannot run {program}: {e}", self.name));
        assert!(
            out.status.success(),
            "node {}: {program} {} failed: {}{}",
            self.name,
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Starts `component` with `args`, in the node's namespaces and cgroup, its output in
    /// `logs/<component>.log`.
    pub fn start(&mut self, component: &'static str, program: &Path, args: &[String]) {
        let procs: Vec<String> = ["pids", "freezer"]
            .iter()
            .map(|h| format!("/sys/fs/cgroup/{h}/{}/system/cgroup.procs", self.cgroup))
            .collect();
        let join = procs
            .iter()
            .map(|p| format!("echo $$ > {p}"))
            .collect::<Vec<_>>()
            .join(" && ");
        let child = self
            .command("sh")
            .args(["-c", &format!("{join} && exec \"$0\" \"$@\"")])
            .arg(program)
            .args(args)
            .stdout(Stdio::null())
            .stderr(log(&self.log_path(component)))
            .spawn()
            .unwrap_or_else(|e| panic!("node {}: cannot start {component}: {e}", self.name));
        self.processes.insert(component, child);
    }

    pub fn log_path(&self, component: &str) -> PathBuf {
        self.dir.join("logs").join(format!("{component}.log"))
    }

    /// Stops `component` with SIGKILL, or SIGTERM and a wait when `gracefully`.
    pub fn stop(&mut self, component: &str, gracefully: bool) {
        let Some(mut child) = self.processes.remove(component) else {
            return;
        };
        let signal = if gracefully {
            nix::sys::signal::Signal::SIGTERM
        } else {
            nix::sys::signal::Signal::SIGKILL
        };
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal);
        let _ = child.wait();
    }

    pub fn is_running(&mut self, component: &str) -> bool {
        self.processes
            .get_mut(component)
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// Every process of the node (its components, shims, pods), frozen at once, then killed: a
    /// power loss, as far as its processes go. The link is the caller's (`KubeCluster`).
    pub fn kill_everything(&mut self) {
        let freezer = PathBuf::from("/sys/fs/cgroup/freezer").join(&self.cgroup);
        let _ = std::fs::write(freezer.join("freezer.state"), "FROZEN");
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::fs::read_to_string(freezer.join("freezer.state"))
            .is_ok_and(|s| s.trim() != "FROZEN")
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        let pids_root = PathBuf::from("/sys/fs/cgroup/pids").join(&self.cgroup);
        for pid in processes_under(&pids_root) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = std::fs::write(freezer.join("freezer.state"), "THAWED");
        for (_, mut child) in std::mem::take(&mut self.processes) {
            let _ = child.wait();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while !processes_under(&pids_root).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What a reboot clears: the node's /run (containerd's state, the pods' network namespace
    /// mounts), its bpffs (the agent's pinned maps) and its pods' cgroups. Disks (/var/lib/...)
    /// are kept. Left behind, the dead containers' cgroups held the returning kubelet up: its
    /// cAdvisor asked containerd after each of them (3 s each, 31 of them) before the kubelet
    /// synced any pod, which no reboot makes it do.
    pub fn clear_volatile_state(&self) {
        for hierarchy in hierarchies()
            .iter()
            .map(PathBuf::as_path)
            .chain([Path::new(UNIFIED)])
        {
            let Ok(children) = std::fs::read_dir(hierarchy.join(&self.cgroup)) else {
                continue;
            };
            for child in children.flatten() {
                let path = child.path();
                // The node's own components' cgroup (`system`) is where they start again.
                if path.is_dir() && child.file_name() != "system" {
                    remove_cgroup_tree(&path);
                }
            }
        }
        self.run(
            "sh",
            &[
                "-c",
                "umount -l /run && mount -t tmpfs tmpfs /run && umount -l /sys/fs/bpf && \
                 mount -t bpf bpf /sys/fs/bpf && mount --make-rshared /run && \
                 mount --make-rshared /sys/fs/bpf",
            ],
        );
    }
}

impl Drop for KubeNode {
    fn drop(&mut self) {
        self.kill_everything();
        let _ = self.holder.kill();
        let _ = self.holder.wait();
        // runc also makes the pods' cgroups in the hybrid layout's cgroup v2 tree.
        for hierarchy in hierarchies()
            .iter()
            .map(PathBuf::as_path)
            .chain([Path::new(UNIFIED)])
        {
            remove_cgroup_tree(&hierarchy.join(&self.cgroup));
        }
    }
}

/// Where a hybrid cgroup layout mounts its cgroup v2 tree.
const UNIFIED: &str = "/sys/fs/cgroup/unified";

/// The cgroup v1 hierarchies mounted under /sys/fs/cgroup.
fn hierarchies() -> Vec<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, at, kind) = (f.next()?, f.next()?, f.next()?);
            (kind == "cgroup" && at.starts_with("/sys/fs/cgroup/")).then(|| PathBuf::from(at))
        })
        .collect()
}

/// The cgroup at `root` and every cgroup below it, each parent before its children.
fn cgroup_tree(root: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        if let Ok(entries) = std::fs::read_dir(&dir) {
            stack.extend(
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
        dirs.push(dir);
    }
    dirs
}

/// Every process in the cgroup at `root` and below.
fn processes_under(root: &Path) -> Vec<i32> {
    cgroup_tree(root)
        .iter()
        .filter_map(|dir| std::fs::read_to_string(dir.join("cgroup.procs")).ok())
        .flat_map(|text| {
            text.lines()
                .filter_map(|l| l.trim().parse::<i32>().ok())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Removes the cgroup at `root` and its children, deepest first (a cgroup is removed with
/// rmdir once it holds no process and no child).
fn remove_cgroup_tree(root: &Path) {
    for dir in cgroup_tree(root).iter().rev() {
        let _ = std::fs::remove_dir(dir);
    }
}

fn log(path: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Where the node's containerd listens, inside its mount namespace.
pub const CONTAINERD_SOCKET: &str = "/run/containerd/containerd.sock";

/// containerd 1.6's configuration for a node: CRI with runc and cgroupfs (the machines run a
/// cgroup v1 hierarchy), the lab's pause image (no registry is reachable), the CNI
/// directories the agent's init step writes. `restrict_oom_score_adj`: root here lacks
/// CAP_SYS_RESOURCE, so a sandbox's -998 cannot be set; containerd clamps it to its own score.
pub fn containerd_config() -> String {
    format!(
        r#"version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{CONTAINERD_SOCKET}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "/usr/bin/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
"#,
        pause = super::images::PAUSE
    )
}

/// The kubelet's configuration: x509 clients of the cluster's CA only (the API server's), its
/// pods under `cgroup_root`, cgroup v1 allowed (`failCgroupV1: false`), eviction thresholds
/// low (the nodes share one disk and memory, which they would all count as their own).
pub fn kubelet_config(ca: &str, cgroup_root: &str, ip: Ipv4Addr) -> String {
    format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: {ca}}}
authorization: {{mode: AlwaysAllow}}
cgroupDriver: cgroupfs
cgroupRoot: /{cgroup_root}
failSwapOn: false
failCgroupV1: false
containerRuntimeEndpoint: unix://{CONTAINERD_SOCKET}
address: {ip}
healthzBindAddress: 127.0.0.1
readOnlyPort: 0
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
evictionHard: {{memory.available: 1Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
protectKernelDefaults: false
localStorageCapacityIsolation: false
"
    )
}

/// kube-proxy's configuration: `mode` (iptables or ipvs), no conntrack sysctls (they are the
/// host's, not the node's namespace's).
pub fn kube_proxy_config(
    kubeconfig: &str,
    node: &str,
    ip: Ipv4Addr,
    mode: &str,
    cluster_cidr: &str,
    min_sync_period: Option<&str>,
) -> String {
    let iptables = match min_sync_period {
        Some(period) => format!("iptables: {{minSyncPeriod: {period}}}\n"),
        None => String::new(),
    };
    format!(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {{kubeconfig: {kubeconfig}}}
hostnameOverride: {node}
bindAddress: {ip}
mode: {mode}
clusterCIDR: {cluster_cidr}
conntrack: {{maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}}
metricsBindAddress: 127.0.0.1:10249
ipvs: {{strictARP: true}}
{iptables}"
    )
}
