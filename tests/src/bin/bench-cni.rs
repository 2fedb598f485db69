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
//! Last line: `cni_add_p50_ratio_vs_host_local=<f> cni_add_p99_ms=<f>
//! cni_concurrent_ratio_vs_host_local=<f> cni_exec_floor_ms=<f> cni_add_over_exec_ms=<f>`
//! (ratios: host-local time / ours; higher is better).

use std::{
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
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
    for round in 0..SEQUENTIAL / 50 {
        for (k, p) in [&ours, &host_local].into_iter().enumerate() {
            for i in 0..50 {
                let id = format!("s{round}-{i}");
                lat[k].push(call(p, "ADD", &id));
                call(p, "DEL", &id);
            }
        }
        for i in 0..50 {
            floor_lat.push(call(&floor, "ADD", &format!("f{round}-{i}")));
            version_lat.push(call(&ours, "VERSION", &format!("v{round}-{i}")));
        }
    }
    floor_lat.sort();
    version_lat.sort();
    let floor50 = percentile(&floor_lat, 0.5);
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
        ms(percentile(&version_lat, 0.5))
    );
    println!(
        "  ipam-cni ADD over the floor: {:.2} ms (start-up, request to ipamd, durable commit)",
        ms(o50.saturating_sub(floor50))
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
         cni_add_over_exec_ms={:.3}",
        ms(o99),
        ms(floor50),
        ms(o50.saturating_sub(floor50))
    );
}
