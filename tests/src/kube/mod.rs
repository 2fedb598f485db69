//! A real Kubernetes cluster on one machine, for `cargo xtask lab kube` and
//! `tests/tests/kube_cluster.rs`: upstream kube-apiserver, kube-controller-manager and
//! kube-scheduler over an etcd member in a fabric namespace (10.77.0.254 on the segment's
//! bridge), three nodes on the bridge (10.77.0.11...), each with its own containerd (Debian's),
//! kubelet and kube-proxy in its own network and mount namespace (`node`), and a client
//! namespace (10.77.0.100) outside the cluster. The project is installed as a user installs it:
//! its image imported into every node's containerd, `kubectl apply -k` of an overlay of
//! deploy/, the gossip Secret made with kubectl.
//!
//! The Kubernetes binaries come from `KUBEBUILDER_ASSETS` (`Assets`), built by hand from an
//! upstream tree (docs/toolchain.md); none is committed or downloaded. Every command the
//! harness sends to the API server runs in the fabric namespace: the host has no route to the
//! segment, and no test traffic may leave the namespaces the test made.

pub mod add_on;
pub mod checks;
pub mod images;
pub mod node;
pub mod pki;
pub mod scenario;

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{
    TempDir,
    netns::{Netns, command_in, veth},
};
pub use node::KubeNode;

pub const FABRIC: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 254);
pub const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 100);
/// The `kubernetes` Service's ClusterIP: the first address of the Service range.
const SERVICE_RANGE: &str = "10.96.0.0/16";
const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 1);
/// Pods' addresses on this cluster (deploy/overlays/example's pools): kube-proxy's
/// `clusterCIDR`, what it masquerades traffic from outside of.
const POD_RANGE: &str = "10.200.0.0/16";

/// The Kubernetes binaries, from the folder `KUBEBUILDER_ASSETS` names.
pub struct Assets(pub PathBuf);

pub const BINARIES: [&str; 6] = [
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "kube-proxy",
    "kubectl",
];

impl Assets {
    /// The folder, or the program `what` says why it cannot run and exits with 2 (the labs' and
    /// benches' "not run").
    pub fn find_or_exit(what: &str) -> Self {
        Self::find().unwrap_or_else(|why| {
            eprintln!("{what}: not run: {why}");
            std::process::exit(2);
        })
    }

    /// The folder, or a sentence saying what is missing and how to get it.
    pub fn find() -> Result<Self, String> {
        let how = "build them from an upstream Kubernetes tree as docs/toolchain.md (\"A real \
                   Kubernetes cluster\") says, and set KUBEBUILDER_ASSETS to their folder";
        let Some(dir) = std::env::var_os("KUBEBUILDER_ASSETS").map(PathBuf::from) else {
            return Err(format!(
                "KUBEBUILDER_ASSETS is not set; it must name a folder with {}: {how}",
                BINARIES.join(", ")
            ));
        };
        let missing: Vec<&str> = BINARIES
            .iter()
            .copied()
            .filter(|b| !dir.join(b).is_file())
            .collect();
        if missing.is_empty() {
            Ok(Self(dir))
        } else {
            Err(format!(
                "{} lacks {}: {how}",
                dir.display(),
                missing.join(", ")
            ))
        }
    }

    pub fn binary(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

/// How kube-proxy carries Services.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    Iptables,
    Ipvs,
}

/// kube-proxy's `iptables.minSyncPeriod` as `IPAM_LAB_KUBE_PROXY_MIN_SYNC` sets it for the lab
/// and the bench (a duration such as `100ms`), or `None` for kube-proxy's default (1 s): what a
/// cluster tuned for a faster end to a dead node's errors gets.
pub fn proxy_min_sync_period() -> Option<String> {
    let value = std::env::var("IPAM_LAB_KUBE_PROXY_MIN_SYNC").ok()?;
    let number = value
        .strip_suffix("ms")
        .or_else(|| value.strip_suffix('s'))
        .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    assert!(
        number.is_some(),
        "IPAM_LAB_KUBE_PROXY_MIN_SYNC={value:?}: give a duration such as 100ms or 1s"
    );
    Some(value)
}

impl ProxyMode {
    fn name(self) -> &'static str {
        match self {
            Self::Iptables => "iptables",
            Self::Ipvs => "ipvs",
        }
    }
}

pub struct KubeCluster {
    pub fabric: Netns,
    pub client: Netns,
    pub nodes: Vec<KubeNode>,
    pub assets: Assets,
    pub proxy_mode: ProxyMode,
    control_plane: Vec<(&'static str, Child)>,
    _etcd: ipam_etcd::testing::EtcdCluster,
    pub dir: TempDir,
}

impl KubeCluster {
    /// The control plane and `nodes` nodes, each Ready for pods once a CNI is installed (none
    /// is yet: the nodes are NotReady until the project's agent writes its configuration).
    /// `say` is told each step.
    pub fn start(assets: Assets, nodes: usize, proxy_mode: ProxyMode, say: &dyn Fn(&str)) -> Self {
        let dir = TempDir::new("ipam-kube-lab-");
        let fabric = Netns::new("klf");
        fabric.add_bridge("br0");
        fabric.add_address("br0", &format!("{FABRIC}/24"));
        fabric.add_address("br0", "fd77::fe/64");
        let client = Netns::new("klc");
        veth(&fabric, "klc", &client, "eth0");
        fabric.add_port("klc", "br0");
        client.add_address("eth0", &format!("{CLIENT}/24"));

        say("control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler");
        let etcd = ipam_etcd::testing::EtcdCluster::start_in_netns(1, &fabric.path(), FABRIC)
            .expect("an etcd member in the fabric namespace");
        let names: Vec<String> = (1..=nodes).map(|i| format!("node-{i}")).collect();
        let pki = dir.0.join("pki");
        std::fs::create_dir_all(&pki).expect("the pki folder");
        pki::write(&pki, FABRIC, CLUSTER_IP, &names);
        let mut cluster = Self {
            fabric,
            client,
            nodes: Vec::new(),
            assets,
            proxy_mode,
            control_plane: Vec::new(),
            _etcd: etcd,
            dir,
        };
        say("images: the project's, and the pause and web images from Debian's busybox");
        images::prepare(&cluster.dir.0);
        let etcd_servers = cluster._etcd.endpoints().join(",");
        cluster.start_control_plane(&etcd_servers);

        for (i, name) in names.iter().enumerate() {
            say(&format!(
                "{name}: its own network and mount namespace, containerd, kubelet, kube-proxy ({}, \
                 minSyncPeriod {})",
                proxy_mode.name(),
                proxy_min_sync_period().unwrap_or_else(|| "1s, the default".into())
            ));
            cluster.add_node(name, i + 1);
        }
        cluster
    }

    fn pki(&self, file: &str) -> String {
        self.dir.0.join("pki").join(file).display().to_string()
    }

    fn log_file(&self, name: &str) -> std::fs::File {
        let path = self.dir.0.join(format!("{name}.log"));
        std::fs::File::create(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    fn start_control_plane(&mut self, etcd_servers: &str) {
        let pki = self.dir.0.join("pki");
        let p = |f: &str| pki.join(f).display().to_string();
        let apiserver: Vec<String> = [
            "--etcd-servers",
            etcd_servers,
            "--bind-address",
            "0.0.0.0",
            "--advertise-address",
            &FABRIC.to_string(),
            "--secure-port",
            "6443",
            "--tls-cert-file",
            &p("server.pem"),
            "--tls-private-key-file",
            &p("server-key.pem"),
            "--client-ca-file",
            &p("ca.pem"),
            "--token-auth-file",
            &p("tokens.csv"),
            "--authorization-mode",
            "Node,RBAC",
            "--enable-admission-plugins",
            "NodeRestriction",
            "--allow-privileged=true",
            "--service-account-issuer",
            "https://kubernetes.default.svc",
            "--service-account-key-file",
            &p("sa.pem"),
            "--service-account-signing-key-file",
            &p("sa-key.pem"),
            "--api-audiences",
            "https://kubernetes.default.svc",
            "--service-cluster-ip-range",
            SERVICE_RANGE,
            "--kubelet-client-certificate",
            &p("kubelet-client.pem"),
            "--kubelet-client-key",
            &p("kubelet-client-key.pem"),
            // Nodes are reached by their address: their names resolve nowhere here.
            "--kubelet-preferred-address-types",
            "InternalIP",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        self.spawn_control("kube-apiserver", &apiserver);
        self.wait_for(Duration::from_secs(60), "kube-apiserver's /readyz", |c| {
            c.kubectl(&["get", "--raw", "/readyz"])
                .status
                .success()
                .then_some(())
        });
        let kubeconfig = |who: &str| p(&format!("{who}.kubeconfig"));
        let cm = kubeconfig("controller-manager");
        let controller_manager: Vec<String> = [
            "--kubeconfig",
            &cm,
            "--authentication-kubeconfig",
            &cm,
            "--authorization-kubeconfig",
            &cm,
            "--bind-address",
            "127.0.0.1",
            "--leader-elect=false",
            "--service-account-private-key-file",
            &p("sa-key.pem"),
            "--root-ca-file",
            &p("ca.pem"),
            "--use-service-account-credentials=true",
            "--service-cluster-ip-range",
            SERVICE_RANGE,
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        self.spawn_control("kube-controller-manager", &controller_manager);
        let sched = kubeconfig("scheduler");
        let scheduler: Vec<String> = [
            "--kubeconfig",
            &sched,
            "--authentication-kubeconfig",
            &sched,
            "--authorization-kubeconfig",
            &sched,
            "--bind-address",
            "127.0.0.1",
            "--leader-elect=false",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        self.spawn_control("kube-scheduler", &scheduler);
    }

    fn spawn_control(&mut self, name: &'static str, args: &[String]) {
        let child = command_in(&self.fabric.path(), self.assets.binary(name))
            .args(args)
            .stdout(Stdio::null())
            .stderr(self.log_file(name))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        self.control_plane.push((name, child));
    }

    fn add_node(&mut self, name: &str, i: usize) {
        let ns = Netns::new(&format!("kln{i}"));
        let port = format!("kln{i}");
        veth(&self.fabric, &port, &ns, "eth0");
        self.fabric.add_port(&port, "br0");
        let ip = Ipv4Addr::new(10, 77, 0, 10 + i as u8);
        let ipv6 = format!("fd77::{:x}", 0x10 + i);
        ns.add_address("eth0", &format!("{ip}/24"));
        ns.add_address("eth0", &format!("{ipv6}/64"));
        // Through the fabric, which forwards nothing: a node needs a route to the Service range
        // for kube-proxy's DNAT of locally made connections to apply.
        ns.route_via("0.0.0.0/0", &FABRIC.to_string());
        ns.route_via("::/0", "fd77::fe");
        let dir = self.dir.0.join(name);
        let node = KubeNode::new(name, ip, &ipv6, ns, &port, dir);
        self.write_node_configs(&node);
        self.nodes.push(node);
        self.boot(self.nodes.len() - 1);
    }

    fn write_node_configs(&self, node: &KubeNode) {
        let etc = node.dir.join("kubernetes");
        let put = |name: &str, text: String| {
            std::fs::write(etc.join(name), text).unwrap_or_else(|e| panic!("{name}: {e}"));
        };
        put("containerd.toml", node::containerd_config());
        put(
            "kubelet.yaml",
            node::kubelet_config(&self.pki("ca.pem"), &node.cgroup, node.ip),
        );
        put(
            "kube-proxy.yaml",
            node::kube_proxy_config(
                &format!("{}/kube-proxy.kubeconfig", self.dir.0.join("pki").display()),
                &node.name,
                node.ip,
                self.proxy_mode.name(),
                POD_RANGE,
                proxy_min_sync_period().as_deref(),
            ),
        );
    }

    /// Starts node `i`'s containerd, loads the images every node has (`images::prepare`), then
    /// its kubelet and kube-proxy.
    pub fn boot(&mut self, i: usize) {
        self.start_runtime(i);
        let node = &mut self.nodes[i];
        let etc = node.dir.join("kubernetes");
        let proxy = self.assets.binary("kube-proxy");
        node.start(
            "kube-proxy",
            &proxy,
            &[
                "--config".into(),
                etc.join("kube-proxy.yaml").display().to_string(),
                // Each sync of its rules in its log, with the time: when a dead node's
                // endpoints left the node's rules.
                "--v=2".into(),
            ],
        );
    }

    /// Restarts node `i`'s kubelet and containerd (SIGTERM, then started again); the pods'
    /// containers run on under their shims meanwhile, as on a host whose runtime restarts.
    pub fn restart_runtime(&mut self, i: usize) {
        self.nodes[i].stop("kubelet", true);
        self.nodes[i].stop("containerd", true);
        self.start_runtime(i);
    }

    /// containerd (with the images loaded) and the kubelet of node `i`.
    fn start_runtime(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        let etc = node.dir.join("kubernetes");
        node.start(
            "containerd",
            Path::new("/usr/bin/containerd"),
            &[
                "--config".into(),
                etc.join("containerd.toml").display().to_string(),
            ],
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while !node
            .command("ctr")
            .args(["--address", node::CONTAINERD_SOCKET, "version"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
        {
            assert!(
                Instant::now() < deadline,
                "node {}: containerd did not answer in 30 s; its log: {}",
                node.name,
                node.log_path("containerd").display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        for archive in images::archives(&self.dir.0) {
            node.run(
                "ctr",
                &[
                    "--address",
                    node::CONTAINERD_SOCKET,
                    "-n",
                    "k8s.io",
                    "images",
                    "import",
                    &archive.display().to_string(),
                ],
            );
        }
        self.start_kubelet(i);
    }

    /// Node `i`'s kubelet stops (SIGTERM); its pods run on, its agent too. The node lifecycle
    /// controller marks the Node NotReady once its grace period has passed.
    pub fn stop_kubelet(&mut self, i: usize) {
        self.nodes[i].stop("kubelet", true);
    }

    /// Starts node `i`'s kubelet (its containerd runs already).
    pub fn start_kubelet(&mut self, i: usize) {
        let kubeconfig = format!(
            "{}/{}.kubeconfig",
            self.dir.0.join("pki").display(),
            self.nodes[i].name
        );
        let node = &mut self.nodes[i];
        let etc = node.dir.join("kubernetes");
        let kubelet = self.assets.binary("kubelet");
        let args: Vec<String> = vec![
            "--config".into(),
            etc.join("kubelet.yaml").display().to_string(),
            "--kubeconfig".into(),
            kubeconfig,
            "--hostname-override".into(),
            node.name.clone(),
            "--node-ip".into(),
            format!("{},{}", node.ip, node.ipv6),
            "--root-dir".into(),
            "/var/lib/kubelet".into(),
        ];
        node.start("kubelet", &kubelet, &args);
    }

    /// Node `i` loses power: every process of it frozen and killed at once, its link cut.
    pub fn power_off(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        node.kill_everything();
        self.fabric.down(&node.port);
    }

    /// Node `i` comes back from a power loss: what a reboot clears is cleared, the link is up,
    /// its processes start again.
    pub fn power_on(&mut self, i: usize) {
        self.nodes[i].clear_volatile_state();
        let port = self.nodes[i].port.clone();
        self.fabric.up(&port);
        self.boot(i);
    }

    /// kubectl as the cluster's admin, in the fabric namespace.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        command_in(&self.fabric.path(), self.assets.binary("kubectl"))
            .arg("--kubeconfig")
            .arg(self.pki("admin.kubeconfig"))
            .args(args)
            .output()
            .expect("run kubectl")
    }

    /// kubectl, killed after `limit` (`timeout`): for `exec`, whose stream no request timeout
    /// bounds.
    pub fn kubectl_within(&self, limit: Duration, args: &[&str]) -> Output {
        command_in(&self.fabric.path(), "timeout")
            .arg(limit.as_secs().max(1).to_string())
            .arg(self.assets.binary("kubectl"))
            .arg("--kubeconfig")
            .arg(self.pki("admin.kubeconfig"))
            .args(args)
            .output()
            .expect("run kubectl")
    }

    /// kubectl's output; panics with its error when it fails.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl get ... -o json`, parsed.
    pub fn get_json(&self, args: &[&str]) -> Value {
        let mut all = vec!["get"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-o", "json"]);
        serde_json::from_str(&self.kubectl_ok(&all)).expect("kubectl's JSON")
    }

    /// `kubectl apply -f` of `yaml`.
    pub fn apply(&self, yaml: &str) {
        let file = self
            .dir
            .0
            .join(format!("apply-{}.yaml", crate::unique("m")));
        std::fs::write(&file, yaml).expect("write a manifest");
        self.kubectl_ok(&["apply", "-f", &file.display().to_string()]);
    }

    /// Polls `f` every 200 ms until it gives a value; panics naming `what` after `timeout`,
    /// with the cluster's state.
    pub fn wait_for<T>(
        &self,
        timeout: Duration,
        what: &str,
        mut f: impl FnMut(&Self) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(v) = f(self) {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for {what}\n{}",
                self.describe()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Nodes and pods as kubectl shows them, and where the logs are, for failure messages.
    pub fn describe(&self) -> String {
        let show = |args: &[&str]| {
            let out = self.kubectl(args);
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        };
        format!(
            "{}{}logs: {}",
            show(&["get", "nodes", "-o", "wide"]),
            show(&["get", "pods", "-A", "-o", "wide"]),
            self.dir.0.display()
        )
    }

    /// Keeps the cluster's folder (logs) instead of removing it on drop.
    pub fn keep_logs(&mut self) -> PathBuf {
        let kept = std::env::temp_dir().join(format!("{}-kept", crate::unique("ipam-kube-lab")));
        let _ = std::fs::create_dir_all(&kept);
        for entry in std::fs::read_dir(&self.dir.0)
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = entry.file_name();
            let is_log = name.to_string_lossy().ends_with(".log");
            if is_log {
                let _ = std::fs::copy(entry.path(), kept.join(&name));
            }
        }
        for node in &self.nodes {
            let to = kept.join(&node.name);
            let _ = std::fs::create_dir_all(&to);
            // The node's network as the failure left it: neighbours, routes, and the counters
            // of kube-proxy's rules (an INVALID drop, a DNAT that never matched).
            let mut network = String::new();
            for args in [
                &["ip", "-d", "neigh"][..],
                &["ip", "route"],
                &["ip", "-6", "route"],
                &["iptables-save", "-c"],
                &["ip6tables-save", "-c"],
            ] {
                let out = node.ns.command(args[0]).args(&args[1..]).output();
                network.push_str(&format!("$ {}\n", args.join(" ")));
                match out {
                    Ok(out) => network.push_str(&String::from_utf8_lossy(&out.stdout)),
                    Err(e) => network.push_str(&format!("{e}\n")),
                }
            }
            let _ = std::fs::write(to.join("network.txt"), network);
            for entry in std::fs::read_dir(node.dir.join("logs"))
                .into_iter()
                .flatten()
                .flatten()
            {
                let _ = std::fs::copy(entry.path(), to.join(entry.file_name()));
            }
            // The project's pods' logs (agent, operator), as the kubelet keeps them.
            for pod in std::fs::read_dir(node.dir.join("log/pods"))
                .into_iter()
                .flatten()
                .flatten()
                .filter(|p| p.file_name().to_string_lossy().starts_with("ipam-system_"))
            {
                for container in std::fs::read_dir(pod.path())
                    .into_iter()
                    .flatten()
                    .flatten()
                {
                    for log in std::fs::read_dir(container.path())
                        .into_iter()
                        .flatten()
                        .flatten()
                    {
                        let name = format!(
                            "{}-{}-{}",
                            pod.file_name().to_string_lossy(),
                            container.file_name().to_string_lossy(),
                            log.file_name().to_string_lossy()
                        );
                        let _ = std::fs::copy(log.path(), to.join(name));
                    }
                }
            }
        }
        kept
    }
}

impl Drop for KubeCluster {
    fn drop(&mut self) {
        // Nodes first (their processes and cgroups), then the control plane.
        self.nodes.clear();
        for (_, child) in self.control_plane.iter_mut().rev() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `kubectl` in namespace `ns`, for the commands the checks repeat.
pub fn in_namespace<'a>(ns: &'a str, args: &[&'a str]) -> Vec<&'a str> {
    let mut all = vec!["-n", ns];
    all.extend_from_slice(args);
    all
}

/// Runs `command` and returns its stdout when it succeeds.
pub fn output_of(command: &mut Command) -> Option<String> {
    let out = command.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}
