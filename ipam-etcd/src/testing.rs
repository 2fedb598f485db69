//! Real etcd members on loopback for tests and benchmarks (Debian's `etcd-server`, installed by
//! `cargo xtask setup`): start a cluster, kill and restart members, and clean up.
//!
//! Members are started by one long-lived thread with a parent-death signal, so they die with
//! the test process even when a cluster is never dropped (the one shared by a test binary).
//! Their data directories carry the owning process's id; `EtcdCluster::start` removes those of
//! processes that are gone.

use std::{
    io::{Read as _, Write as _},
    net::{Ipv4Addr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Mutex, OnceLock,
        atomic::{AtomicU32, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};

use crate::config::{EtcdConfig, TlsFiles};

/// How long a cluster may take to elect a leader and answer.
const START_TIMEOUT: Duration = Duration::from_secs(30);
const DIR_PREFIX: &str = "ipam-etcd-";

/// TLS for the members' client port: their certificate, and the CA whose client certificates
/// they accept (with `--client-cert-auth`).
#[derive(Debug, Clone)]
pub struct ServerTls {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

struct Member {
    name: String,
    client_url: String,
    peer_url: String,
    data_dir: PathBuf,
    child: Option<Child>,
}

pub struct EtcdCluster {
    members: Vec<Member>,
    /// The network namespace the members run in (the root namespace's loopback when `None`).
    netns: Option<PathBuf>,
    initial_cluster: String,
    token: String,
    tls: Option<ServerTls>,
    dir: tempfile::TempDir,
}

static SHARED: OnceLock<Mutex<Option<EtcdCluster>>> = OnceLock::new();
static CLUSTERS: AtomicU32 = AtomicU32::new(0);
static PREFIXES: AtomicU32 = AtomicU32::new(0);

impl EtcdCluster {
    /// Starts `size` members and waits until they have a leader.
    pub fn start(size: usize) -> std::io::Result<Self> {
        Self::start_with(size, None)
    }

    /// Starts `size` members serving clients over TLS.
    pub fn start_with(size: usize, tls: Option<ServerTls>) -> std::io::Result<Self> {
        Self::start_on(size, tls, None, Ipv4Addr::LOCALHOST)
    }

    /// Starts `size` members inside the network namespace at `netns` (a path such as
    /// `/run/netns/<name>`), listening on `ip` there: for tests whose nodes live in namespaces
    /// and reach the store over their own network.
    pub fn start_in_netns(size: usize, netns: &Path, ip: Ipv4Addr) -> std::io::Result<Self> {
        Self::start_on(size, None, Some(netns.to_owned()), ip)
    }

    fn start_on(
        size: usize,
        tls: Option<ServerTls>,
        netns: Option<PathBuf>,
        ip: Ipv4Addr,
    ) -> std::io::Result<Self> {
        remove_stale_dirs();
        let dir = tempfile::Builder::new()
            .prefix(&format!("{DIR_PREFIX}{}-", std::process::id()))
            .tempdir()?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        // Ports free on the host's loopback are as good as any in a fresh namespace.
        let ports = free_ports(2 * size)?;
        let members: Vec<Member> = ports
            .chunks(2)
            .enumerate()
            .map(|(i, pair)| {
                let name = format!("m{i}");
                Member {
                    client_url: format!("{scheme}://{ip}:{}", pair[0]),
                    peer_url: format!("http://{ip}:{}", pair[1]),
                    data_dir: dir.path().join(&name),
                    name,
                    child: None,
                }
            })
            .collect();
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url))
            .collect::<Vec<_>>()
            .join(",");
        let token = format!(
            "ipam-test-{}-{}",
            std::process::id(),
            CLUSTERS.fetch_add(1, Ordering::Relaxed)
        );
        let mut cluster = Self {
            members,
            netns,
            initial_cluster,
            token,
            tls,
            dir,
        };
        for i in 0..size {
            cluster.spawn(i, "new")?;
        }
        cluster.wait_ready(START_TIMEOUT)?;
        Ok(cluster)
    }

    /// The cluster of this test binary, started on first use and shared by its tests; each
    /// test keeps to its own key prefix (`unique_prefix`).
    pub fn shared_config(name: &str) -> EtcdConfig {
        let shared = SHARED.get_or_init(|| Mutex::new(None));
        let mut guard = shared
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let cluster = guard.get_or_insert_with(|| {
            Self::start(3).expect("etcd cluster for the tests (is etcd-server installed?)")
        });
        cluster.config(&unique_prefix(name))
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client_url.clone()).collect()
    }

    pub fn endpoint(&self, member: usize) -> String {
        self.members[member].client_url.clone()
    }

    /// A client configuration for every member, under `prefix`.
    pub fn config(&self, prefix: &str) -> EtcdConfig {
        EtcdConfig::new(self.endpoints()).with_prefix(prefix)
    }

    /// A client configuration with TLS files.
    pub fn tls_config(&self, prefix: &str, tls: TlsFiles) -> EtcdConfig {
        let mut config = self.config(prefix);
        config.tls = Some(tls);
        config
    }

    /// SIGKILLs member `i` (a crash or power loss).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freezes member `i` (SIGSTOP): its connections stay open and nothing on them is
    /// answered, as with a member whose host lost power behind a switch that keeps the link up,
    /// or a member stuck on its disk. [`Self::thaw`] undoes it.
    pub fn freeze(&self, i: usize) {
        self.signal(i, nix::sys::signal::Signal::SIGSTOP);
    }

    /// Lets a frozen member run again (SIGCONT).
    pub fn thaw(&self, i: usize) {
        self.signal(i, nix::sys::signal::Signal::SIGCONT);
    }

    fn signal(&self, i: usize, signal: nix::sys::signal::Signal) {
        let child = self.members[i].child.as_ref().expect("a running member");
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("a pid"));
        nix::sys::signal::kill(pid, signal).expect("signal the member");
    }

    /// Starts member `i` again from its data directory.
    pub fn restart(&mut self, i: usize) -> std::io::Result<()> {
        self.spawn(i, "existing")
    }

    pub fn is_running(&self, i: usize) -> bool {
        self.members[i].child.is_some()
    }

    /// Waits until every running member answers its health check.
    pub fn wait_ready(&self, timeout: Duration) -> std::io::Result<()> {
        let deadline = Instant::now() + timeout;
        for m in self.members.iter().filter(|m| m.child.is_some()) {
            loop {
                if self.healthy(m) {
                    break;
                }
                if Instant::now() > deadline {
                    let log = std::fs::read_to_string(log_path(&m.data_dir)).unwrap_or_default();
                    return Err(std::io::Error::other(format!(
                        "etcd member {} at {} not healthy after {timeout:?}; its log ends:\n{}",
                        m.name,
                        m.client_url,
                        tail(&log, 20)
                    )));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(())
    }

    fn healthy(&self, m: &Member) -> bool {
        let Some(address) = m
            .client_url
            .split("://")
            .nth(1)
            .and_then(|a| a.parse::<std::net::SocketAddr>().ok())
        else {
            return false;
        };
        let connected = match &self.netns {
            None => TcpStream::connect_timeout(&address, Duration::from_millis(200)),
            Some(netns) => {
                let netns = netns.clone();
                std::thread::spawn(move || {
                    let file = std::fs::File::open(&netns)?;
                    // Only this thread enters the namespace; the socket stays in it.
                    nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                        .map_err(std::io::Error::from)?;
                    TcpStream::connect_timeout(&address, Duration::from_millis(200))
                })
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("probe thread panicked")))
            }
        };
        let Ok(mut stream) = connected else {
            return false;
        };
        if self.tls.is_some() {
            // /health is behind TLS there: an open port and a short settle will do.
            std::thread::sleep(Duration::from_millis(500));
            return true;
        }
        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
        if stream
            .write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .is_err()
        {
            return false;
        }
        let mut reply = String::new();
        let _ = stream.read_to_string(&mut reply);
        reply.contains("\"health\":\"true\"")
    }

    fn spawn(&mut self, i: usize, state: &str) -> std::io::Result<()> {
        let m = &self.members[i];
        std::fs::create_dir_all(&m.data_dir)?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log_path(&m.data_dir))?;
        let mut command = match &self.netns {
            None => Command::new("etcd"),
            Some(netns) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net={}", netns.display())).arg("etcd");
                c
            }
        };
        command
            .args(["--name", &m.name])
            .arg("--data-dir")
            .arg(m.data_dir.join("data"))
            .args(["--listen-client-urls", &m.client_url])
            .args(["--advertise-client-urls", &m.client_url])
            .args(["--listen-peer-urls", &m.peer_url])
            .args(["--initial-advertise-peer-urls", &m.peer_url])
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-token", &self.token])
            .args(["--initial-cluster-state", state])
            // Loopback: elect within a second of a member's death.
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--logger", "zap", "--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        if let Some(tls) = &self.tls {
            command
                .arg("--cert-file")
                .arg(&tls.cert)
                .arg("--key-file")
                .arg(&tls.key)
                .arg("--trusted-ca-file")
                .arg(&tls.ca)
                .arg("--client-cert-auth");
        }
        let child = spawn_tied_to_process(command)?;
        self.members[i].child = Some(child);
        Ok(())
    }

    /// Where the members keep their data and logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

/// A key prefix no other test of this run uses.
pub fn unique_prefix(name: &str) -> String {
    format!(
        "/test-{}-{}-{name}",
        std::process::id(),
        PREFIXES.fetch_add(1, Ordering::Relaxed)
    )
}

fn log_path(data_dir: &Path) -> PathBuf {
    data_dir.join("etcd.log")
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// `count` distinct ports nobody listens on now (the members bind them a moment later). They
/// are all held until the last is found: ports released one by one can be handed out again.
fn free_ports(count: usize) -> std::io::Result<Vec<u16>> {
    let held = (0..count)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .collect::<std::io::Result<Vec<_>>>()?;
    held.iter().map(|l| Ok(l.local_addr()?.port())).collect()
}

/// Data directories of earlier runs whose process is gone.
fn remove_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(DIR_PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Spawns `command` from a thread that lives as long as the process, with SIGKILL as its
/// parent-death signal: the kernel sends it when the spawning *thread* exits, and test threads
/// end with their test.
fn spawn_tied_to_process(command: Command) -> std::io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("etcd-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    use std::os::unix::process::CommandExt as _;
                    // SAFETY: the closure runs in the child between fork and exec and only
                    // makes the async-signal-safe prctl system call.
                    unsafe {
                        command.pre_exec(|| {
                            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                                .map_err(std::io::Error::from)
                        });
                    }
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("etcd spawner thread");
        Mutex::new(tx)
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    spawner
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .send((command, reply_tx))
        .map_err(|_| std::io::Error::other("etcd spawner thread is gone"))?;
    reply_rx
        .recv()
        .map_err(|_| std::io::Error::other("etcd spawner thread is gone"))?
}
