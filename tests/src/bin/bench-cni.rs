//! `cargo xtask bench cni`: CNI ADD latency, process exec included, of `ipam-cni` (IPAM-only,
//! against a running ipamd) versus Debian's `host-local`, in the same run, both called exactly as
//! a main plugin calls its IPAM plugin. Sequential rounds alternate between the two; then 100
//! concurrent ADDs each. Every ADD is followed (untimed) by its DEL.
//!
//! The floor is measured in the same rounds: a no-op plugin of the same kind as the one
//! measured, built in the run (Rust, its standard library's start-up, linked as the plugin is:
//! static when `IPAM_CNI_BIN` is the static build, as `cargo xtask bench cni` passes), that
//! reads its configuration and exits, started exactly like a plugin (same environment, stdin
//! written, stdout read). No exec'd plugin of that kind can be faster, so
//! `cni_add_over_exec_ms` (our ADD p50 minus the floor's p50) is what the plugin's own work
//! costs: the request to ipamd and the answer. `ipam-cni` VERSION (no request) shows its own
//! start-up beside the floor's.
//!
//! The ADD's parts, each p50 beside its own floor, in the same rounds:
//! - exec: `ipam-cni VERSION` (its start-up, no request) beside the no-op plugin;
//! - connect: `ipam-cni STATUS` (start-up, connect, one request without an allocation) beside
//!   VERSION; and the same request made in-process (no exec), the daemon's round trip;
//! - allocate + commit: an `Allocate` request made in-process beside the `Status` one; its
//!   commit beside a 64-byte append with `fdatasync` to a file in the daemon's state directory
//!   (the same filesystem), timed here: the floor of any durable commit on this disk. What is
//!   left, the allocation itself and the daemon's handling, is the difference.
//!
//! Last line: `cni_add_p50_ratio_vs_host_local=<f> cni_add_p99_ms=<f>
//! cni_concurrent_ratio_vs_host_local=<f> cni_exec_floor_ms=<f> cni_add_over_exec_ms=<f>
//! cni_add_p50_ms=<f> cni_version_ms=<f> cni_status_ms=<f> cni_api_status_ms=<f>
//! cni_api_allocate_ms=<f> cni_fdatasync_floor_ms=<f> cni_exec_floor_cpu_ms=<f>
//! cni_version_cpu_ms=<f> cni_add_cpu_ms=<f>` (ratios: host-local time / ours; higher is
//! better; the parts are p50s; `_cpu_` figures are the exec'd process's own CPU time, which
//! the machine's other load leaves alone where it stretches the wall times).

use std::{
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use ipam_api::{
    client,
    types::{Attachment, AttachmentId, Request, Response},
};
use ipam_tests::{TempDir, ipam_node::IpamNode, workspace_binary};
use serde_json::{Value, json};

const SEQUENTIAL: usize = 300;
const CONCURRENT: usize = 100;

struct Plugin {
    name: &'static str,
    binary: PathBuf,
    conf: Value,
}

fn call(p: &Plugin, command: &str, container: &str) -> Duration {
    let start = Instant::now();
    let mut child = Command::new(&p.binary)
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", container)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_NETNS", "/proc/self/ns/net")
        .env("CNI_PATH", p.binary.parent().unwrap())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn plugin");
    let written = child
        .stdin
        .take()
        .unwrap()
        .write_all(p.conf.to_string().as_bytes());
    // The floor (`/bin/true`) may exit before reading its stdin.
    if let Err(e) = written
        && e.kind() != std::io::ErrorKind::BrokenPipe
    {
        panic!("{}: cannot write the configuration: {e}", p.name);
    }
    let out = child.wait_with_output().unwrap();
    let elapsed = start.elapsed();
    assert!(
        out.status.success(),
        "{} {command} failed: {}",
        p.name,
        String::from_utf8_lossy(&out.stdout)
    );
    elapsed
}

/// A plugin that reads its configuration and exits, built now with the same linking as
/// `plugin` (static or dynamic, release): the floor of what an exec'd Rust plugin costs.
fn build_floor(plugin: &Path, dir: &Path) -> PathBuf {
    let source = dir.join("noop.rs");
    std::fs::write(
        &source,
        "use std::io::Read;\nfn main() {\n    let mut conf = Vec::new();\n    \
         let _ = std::io::stdin().read_to_end(&mut conf);\n    \
         println!(\"{}\", conf.len());\n}\n",
    )
    .expect("write the no-op plugin");
    let static_plugin = !has_interpreter(&std::fs::read(plugin).expect("read the plugin"));
    let binary = dir.join("noop");
    let mut rustc = Command::new(std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into()));
    rustc
        .args(["-O", "--edition", "2021", "-o"])
        .arg(&binary)
        .arg(&source);
    if static_plugin {
        rustc.args(["-C", "target-feature=+crt-static"]);
    }
    let status = rustc.status().expect("run rustc for the floor");
    assert!(status.success(), "cannot build the no-op plugin");
    binary
}

/// Whether a 64-bit little-endian ELF image asks for a dynamic loader (a `PT_INTERP` program
/// header): a dynamic executable does, a static one does not (it may still hold the loader's
/// name as a string, so the headers are read, not searched).
fn has_interpreter(image: &[u8]) -> bool {
    const PT_INTERP: u32 = 3;
    let u16_at = |at: usize| {
        image
            .get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u64_at = |at: usize| {
        image
            .get(at..at + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    };
    let (Some(phoff), Some(entsize), Some(count)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38))
    else {
        return false;
    };
    (0..usize::from(count)).any(|i| {
        let at = phoff as usize + i * usize::from(entsize);
        image
            .get(at..at + 4)
            .is_some_and(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) == PT_INTERP)
    })
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// CPU time (user and system) of the children this process has reaped so far.
fn children_cpu() -> Duration {
    // SAFETY: getrusage fills the struct it is given.
    let usage = unsafe {
        let mut usage = std::mem::zeroed::<libc::rusage>();
        libc::getrusage(libc::RUSAGE_CHILDREN, &raw mut usage);
        usage
    };
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Runs `f`, which execs and reaps one child, and records the child's CPU time in `cpu`:
/// what the plugin itself costs, which other load on the machine does not change.
fn timed_cpu(cpu: &mut Vec<Duration>, f: impl FnOnce() -> Duration) -> Duration {
    let before = children_cpu();
    let wall = f();
    cpu.push(children_cpu().saturating_sub(before));
    wall
}

fn p50(v: &mut [Duration]) -> Duration {
    v.sort();
    percentile(v, 0.5)
}

/// One request to the daemon from this process (no exec), timed.
fn api(socket: &Path, request: &Request) -> (Duration, Response) {
    let start = Instant::now();
    let response = client::call(socket, request, Duration::from_secs(10)).expect("ipamd answers");
    (start.elapsed(), response)
}

fn attachment(container: &str) -> Attachment {
    Attachment {
        id: AttachmentId {
            container_id: container.to_owned(),
            ifname: "eth0".to_owned(),
            network: "bench".to_owned(),
        },
        pod: None,
        pool: None,
        ips: Vec::new(),
    }
}

/// A 64-byte append with `fdatasync` to a log in `dir`, timed: what one durable commit of
/// ipamd's allocation log (an append and `fdatasync`) cannot go below on this filesystem.
struct AppendFloor {
    file: std::fs::File,
    len: u64,
}

impl AppendFloor {
    fn new(dir: &Path) -> Self {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(dir.join("append-floor.log"))
            .expect("create the append floor's file");
        Self { file, len: 0 }
    }

    fn append(&mut self) -> Duration {
        use std::os::unix::fs::FileExt as _;
        let record = [0x5au8; 64];
        let start = Instant::now();
        self.file
            .write_all_at(&record, self.len)
            .expect("append to the floor's file");
        self.file.sync_data().expect("fdatasync");
        let elapsed = start.elapsed();
        self.len += record.len() as u64;
        elapsed
    }
}

fn main() {
    // Ready means the node has its router address: ADD answers "try again later" until then.
    let node = IpamNode::new("benchcni", "10.244.0.0/16", 20);
    let daemon = node.start_daemon();
    let ours = Plugin {
        name: "ipam-cni",
        // `cargo xtask bench cni` passes the static build (`cargo xtask build-cni`).
        binary: std::env::var_os("IPAM_CNI_BIN")
            .map_or_else(|| workspace_binary("ipam-cni"), PathBuf::from),
        conf: json!({"cniVersion": "1.0.0", "name": "bench", "ipam": {"type": "ipam-cni", "socket": node.socket()}}),
    };
    let host_local = Plugin {
        name: "host-local",
        binary: Path::new("/usr/lib/cni/host-local").to_owned(),
        conf: json!({"cniVersion": "1.0.0", "name": "bench", "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.250.0.0/20"}]], "dataDir": node.dir.0.join("host-local")}}),
    };
    println!(
        "environment: {} CPUs; ipam-cni durable (fsync per commit), host-local files; plugin {}",
        std::thread::available_parallelism()
            .map(std::num::NonZero::get)
            .unwrap_or(0),
        ours.binary.display()
    );

    // Warm up both (page cache, first-exec costs).
    for p in [&ours, &host_local] {
        for i in 0..20 {
            call(p, "ADD", &format!("warm{i}"));
            call(p, "DEL", &format!("warm{i}"));
        }
    }

    let floor_dir = TempDir::new("bench-cni-floor-");
    let floor = Plugin {
        name: "no-op plugin",
        binary: build_floor(&ours.binary, &floor_dir.0),
        conf: ours.conf.clone(),
    };
    for i in 0..20 {
        call(&floor, "ADD", &format!("warm-floor{i}"));
    }
    let mut lat: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    let (mut floor_lat, mut version_lat) = (Vec::new(), Vec::new());
    let (mut status_lat, mut api_status_lat, mut api_alloc_lat, mut append_lat) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let socket = node.socket();
    let mut append_floor = AppendFloor::new(&node.dir.0);
    let (mut floor_cpu, mut version_cpu, mut status_cpu, mut add_cpu) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..SEQUENTIAL / 50 {
        for (k, p) in [&ours, &host_local].into_iter().enumerate() {
            for i in 0..50 {
                let id = format!("s{round}-{i}");
                lat[k].push(if k == 0 {
                    timed_cpu(&mut add_cpu, || call(p, "ADD", &id))
                } else {
                    call(p, "ADD", &id)
                });
                call(p, "DEL", &id);
            }
        }
        for i in 0..50 {
            // The three execs in turn, each first as often as the others: what one leaves
            // behind (caches, the scheduler's view of this process) falls on all alike.
            for k in 0..3 {
                match (i + k) % 3 {
                    0 => floor_lat.push(timed_cpu(&mut floor_cpu, || {
                        call(&floor, "ADD", &format!("f{round}-{i}"))
                    })),
                    1 => version_lat.push(timed_cpu(&mut version_cpu, || {
                        call(&ours, "VERSION", &format!("v{round}-{i}"))
                    })),
                    _ => status_lat.push(timed_cpu(&mut status_cpu, || {
                        call(&ours, "STATUS", &format!("st{round}-{i}"))
                    })),
                }
            }
            let (t, response) = api(&socket, &Request::Status);
            assert!(matches!(response, Response::Ready), "{response:?}");
            api_status_lat.push(t);
            let a = attachment(&format!("a{round}-{i}"));
            let (t, response) = api(&socket, &Request::Allocate(a.clone()));
            assert!(
                matches!(response, Response::Allocated { .. }),
                "{response:?}"
            );
            api_alloc_lat.push(t);
            let (_, response) = api(&socket, &Request::Release(a));
            assert!(
                matches!(response, Response::Released { .. }),
                "{response:?}"
            );
            append_lat.push(append_floor.append());
        }
    }
    let floor50 = p50(&mut floor_lat);
    let version50 = p50(&mut version_lat);
    let status50 = p50(&mut status_lat);
    let api_status50 = p50(&mut api_status_lat);
    let api_alloc50 = p50(&mut api_alloc_lat);
    let append50 = p50(&mut append_lat);
    let (floor_cpu50, version_cpu50, status_cpu50, add_cpu50) = (
        p50(&mut floor_cpu),
        p50(&mut version_cpu),
        p50(&mut status_cpu),
        p50(&mut add_cpu),
    );
    for l in &mut lat {
        l.sort();
    }
    let (o50, o99) = (percentile(&lat[0], 0.5), percentile(&lat[0], 0.99));
    let (h50, h99) = (percentile(&lat[1], 0.5), percentile(&lat[1], 0.99));
    println!("sequential ADD, {SEQUENTIAL} each (process exec included):");
    println!("  ipam-cni   p50 {:.2} ms  p99 {:.2} ms", ms(o50), ms(o99));
    println!("  host-local p50 {:.2} ms  p99 {:.2} ms", ms(h50), ms(h99));
    println!(
        "  exec floor (a no-op plugin built alike, started the same way) p50 {:.2} ms; ipam-cni \
         VERSION p50 {:.2} ms",
        ms(floor50),
        ms(version50)
    );
    println!(
        "  ipam-cni ADD over the floor: {:.2} ms (start-up, request to ipamd, durable commit)",
        ms(o50.saturating_sub(floor50))
    );
    let over = |a: Duration, b: Duration| ms(a) - ms(b);
    println!("the ADD's parts, p50 of {SEQUENTIAL} each beside its floor (same rounds), ms:");
    println!(
        "  exec:     ipam-cni VERSION {:.3}  beside the no-op plugin {:.3}  (+{:.3})",
        ms(version50),
        ms(floor50),
        over(version50, floor50)
    );
    println!(
        "  connect:  ipam-cni STATUS {:.3}  beside VERSION {:.3}  (+{:.3}); the same request \
         in-process {:.3}",
        ms(status50),
        ms(version50),
        over(status50, version50),
        ms(api_status50)
    );
    println!(
        "  allocate: Allocate in-process {:.3}  beside Status in-process {:.3}  (+{:.3}: \
         allocation and commit)",
        ms(api_alloc50),
        ms(api_status50),
        over(api_alloc50, api_status50)
    );
    println!(
        "  commit:   64-byte append + fdatasync here {:.3}  (the commit's floor); allocation \
         and handling over it {:.3}",
        ms(append50),
        over(api_alloc50, api_status50) - ms(append50)
    );
    println!(
        "  CPU time of the exec'd process (user + system, p50; other load does not change it): \
         no-op {:.3}, VERSION {:.3}, STATUS {:.3}, ADD {:.3}",
        ms(floor_cpu50),
        ms(version_cpu50),
        ms(status_cpu50),
        ms(add_cpu50)
    );
    println!(
        "  ADD {:.3} = STATUS {:.3} + allocation and commit {:.3} + the rest {:.3} (CNI result, \
         the Allocate request's size)",
        ms(o50),
        ms(status50),
        over(api_alloc50, api_status50),
        ms(o50) - ms(status50) - over(api_alloc50, api_status50)
    );

    let mut concurrent = [Duration::ZERO; 2];
    for round in 0..3 {
        for (k, p) in [&ours, &host_local].into_iter().enumerate() {
            let start = Instant::now();
            std::thread::scope(|s| {
                for i in 0..CONCURRENT {
                    s.spawn(move || call(p, "ADD", &format!("c{round}-{i}")));
                }
            });
            concurrent[k] += start.elapsed();
            for i in 0..CONCURRENT {
                call(p, "DEL", &format!("c{round}-{i}"));
            }
        }
    }
    println!("{CONCURRENT} concurrent ADDs, mean wall time over 3 rounds:");
    println!("  ipam-cni   {:.1} ms", ms(concurrent[0]) / 3.0);
    println!("  host-local {:.1} ms", ms(concurrent[1]) / 3.0);

    let p50_ratio = h50.as_secs_f64() / o50.as_secs_f64();
    let conc_ratio = concurrent[1].as_secs_f64() / concurrent[0].as_secs_f64();
    drop(daemon);
    println!(
        "cni_add_p50_ratio_vs_host_local={p50_ratio:.2} cni_add_p99_ms={:.2} \
         cni_concurrent_ratio_vs_host_local={conc_ratio:.2} cni_exec_floor_ms={:.3} \
         cni_add_over_exec_ms={:.3} cni_add_p50_ms={:.3} cni_version_ms={:.3} \
         cni_status_ms={:.3} cni_api_status_ms={:.3} cni_api_allocate_ms={:.3} \
         cni_fdatasync_floor_ms={:.3} cni_exec_floor_cpu_ms={:.3} cni_version_cpu_ms={:.3} \
         cni_add_cpu_ms={:.3}",
        ms(o99),
        ms(floor50),
        ms(o50.saturating_sub(floor50)),
        ms(o50),
        ms(version50),
        ms(status50),
        ms(api_status50),
        ms(api_alloc50),
        ms(append50),
        ms(floor_cpu50),
        ms(version_cpu50),
        ms(add_cpu50)
    );
}
