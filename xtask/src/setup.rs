//! `cargo xtask setup`: every prerequisite of building and testing, installed or checked,
//! idempotently. When everything is there it takes seconds and says so.

use std::{path::PathBuf, process::Command};

use anyhow::{Context as _, bail};

use crate::cmd::{exec, output};

/// Debian packages the build itself needs: installed by `setup --toolchain-only` too, so an image
/// build or a clean root gets them from the same list.
const BUILD_PACKAGES: &[(&str, &str)] = &[
    (
        "protobuf-compiler",
        "protoc: the etcd client's gRPC stubs are generated at build time",
    ),
    (
        "libprotobuf-dev",
        "the well-known .proto files (google/protobuf/descriptor.proto) etcd's protos import; \
         Debian's protoc ships without them",
    ),
];

/// Debian packages the tests, the lab and the benchmarks use.
const TEST_PACKAGES: &[(&str, &str)] = &[
    (
        "iproute2",
        "ip: the netlink test checks that `ip netns` sees the namespaces the test kit makes \
         over netlink; and for looking into a running test or the lab by hand",
    ),
    ("mount", "mount: setup mounts bpffs at /sys/fs/bpf"),
    (
        "util-linux",
        "nsenter: runs the daemon by hand in a namespace without hiding bpffs",
    ),
    ("ethtool", "NIC offload settings in tests"),
    ("procps", "sysctl: a test sets arp_ignore"),
    ("iputils-ping", "ping through the announcing interface"),
    ("bpftool", "inspecting pinned maps and programs"),
    ("arping", "resolving announced IPs by hand"),
    ("ndisc6", "resolving announced IPv6 addresses by hand"),
    (
        "containernetworking-plugins",
        "Debian's CNI plugins (bridge, ptp, host-local) in the CNI tests and benchmark",
    ),
    (
        "iptables",
        "iptables, ip6tables: the gossip test drops a fifth of a node's gossip packets \
         (statistic match); the netlink test DNATs as kube-proxy does and reads conntrack",
    ),
    (
        "etcd-server",
        "etcd: the cluster store; tests and the lab start members on loopback",
    ),
    (
        "prometheus",
        "promtool: the metrics test checks ipamd's exposition with it",
    ),
    (
        "bird2",
        "bird, birdc: the BGP speaker the agents drive ([bgp]); its unit test parses the \
         rendered configuration with it",
    ),
    (
        "frr",
        "zebra, bgpd, bfdd, vtysh: the router of the BGP tests, bench and lab (another \
         implementation than the agents' BIRD)",
    ),
];

/// The toolchain alone: what building the project needs, nothing the tests need.
pub(crate) fn toolchain() -> anyhow::Result<()> {
    let mut changed = Vec::new();
    install_packages(BUILD_PACKAGES, &mut changed)?;
    nightly(&mut changed)?;
    bpf_linker(&mut changed)?;
    println!(
        "setup: toolchain in place; changed: {}",
        if changed.is_empty() {
            "nothing".to_owned()
        } else {
            changed.join(", ")
        }
    );
    Ok(())
}

pub(crate) fn run() -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let mut changed = Vec::new();
    packages(&mut changed)?;
    nightly(&mut changed)?;
    bpf_linker(&mut changed)?;
    bpffs(&mut changed)?;
    if changed.is_empty() {
        println!(
            "setup: everything already in place ({} ms)",
            started.elapsed().as_millis()
        );
    } else {
        println!(
            "setup: done in {:.1} s; changed: {}",
            started.elapsed().as_secs_f64(),
            changed.join(", ")
        );
    }
    Ok(())
}

fn packages(changed: &mut Vec<String>) -> anyhow::Result<()> {
    let all: Vec<(&str, &str)> = BUILD_PACKAGES
        .iter()
        .chain(TEST_PACKAGES)
        .copied()
        .collect();
    install_packages(&all, changed)
}

/// Installs the Debian packages of `wanted` (name, why) that are not installed yet.
/// Installs what `wanted` lacks, as `install_packages`, leaving the host's services as they
/// were: each `(package, unit)` of `services` whose package this installs is neither started
/// nor left enabled (Debian starts and enables a package's services on install: containerd's
/// would run a system-wide containerd next to the lab's own).
pub(crate) fn install_packages_without_services(
    wanted: &[(&str, &str)],
    services: &[(&str, &str)],
    changed: &mut Vec<String>,
) -> anyhow::Result<()> {
    let before = changed.len();
    let missing = missing_packages(wanted);
    // invoke-rc.d asks policy-rc.d whether to start a service: 101 is "no".
    let policy = PathBuf::from("/usr/sbin/policy-rc.d");
    let ours = !missing.is_empty() && !policy.exists();
    if ours {
        std::fs::write(
            &policy,
            "#!/bin/sh\n# cargo xtask: no service starts during the install\nexit 101\n",
        )
        .and_then(|()| {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&policy, std::fs::Permissions::from_mode(0o755))
        })
        .with_context(|| format!("cannot write {}", policy.display()))?;
    }
    let installed = install_packages(wanted, changed);
    if ours {
        let _ = std::fs::remove_file(&policy);
    }
    installed?;
    if changed.len() == before {
        return Ok(());
    }
    let systemd = std::path::Path::new("/run/systemd/system").is_dir();
    for (package, unit) in services.iter().filter(|(p, _)| missing.contains(p)) {
        if systemd {
            // Enabled by the package's postinst; stopped in case anything started it.
            let _ = exec(Command::new("systemctl").args(["disable", "--now", "--quiet", unit]));
        }
        println!(
            "setup: {unit} (from {package}) is installed but left disabled and stopped: the \
             lab runs its own"
        );
    }
    Ok(())
}

/// The packages of `wanted` not installed.
fn missing_packages<'a>(wanted: &[(&'a str, &str)]) -> Vec<&'a str> {
    wanted
        .iter()
        .map(|(p, _)| *p)
        .filter(|p| {
            output(Command::new("dpkg-query").args(["-W", "-f=${Status}", p]))
                .is_none_or(|s| !s.contains("install ok installed"))
        })
        .collect()
}

pub(crate) fn install_packages(
    wanted: &[(&str, &str)],
    changed: &mut Vec<String>,
) -> anyhow::Result<()> {
    let missing = missing_packages(wanted);
    if missing.is_empty() {
        return Ok(());
    }
    println!("setup: installing Debian packages: {}", missing.join(" "));
    exec(Command::new("apt-get").args(["update", "-qq"]))
        .context("apt-get update failed; check that the Debian mirror is reachable")?;
    exec(
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
    .with_context(|| format!("cannot install {}; install them by hand", missing.join(" ")))?;
    changed.push(format!("packages ({})", missing.join(" ")));
    Ok(())
}

fn nightly(changed: &mut Vec<String>) -> anyhow::Result<()> {
    let toolchains = output(Command::new("rustup").args(["toolchain", "list"])).unwrap_or_default();
    if !toolchains.lines().any(|l| l.starts_with("nightly")) {
        bail!(
            "the eBPF crate needs a nightly Rust toolchain named `nightly` and none is installed; \
             install one with `rustup toolchain install nightly --component rust-src`"
        );
    }
    // rust-src builds core for the eBPF target; clippy and rustfmt are the lint gate's.
    for (toolchain, components) in [
        ("nightly", &["rust-src", "clippy"][..]),
        ("stable", &["clippy", "rustfmt"][..]),
    ] {
        let installed = output(Command::new("rustup").args([
            "component",
            "list",
            "--toolchain",
            toolchain,
            "--installed",
        ]))
        .unwrap_or_default();
        for component in components {
            if installed.lines().any(|l| l.starts_with(component)) {
                continue;
            }
            println!("setup: adding {component} to the {toolchain} toolchain");
            exec(Command::new("rustup").args([
                "component",
                "add",
                component,
                "--toolchain",
                toolchain,
            ]))?;
            changed.push(format!("{component} ({toolchain})"));
        }
    }
    Ok(())
}

/// Where the symlinks to the nightly's LLVM live; bpf-linker keeps an rpath to it.
fn llvm_prefix() -> anyhow::Result<PathBuf> {
    let home = std::env::var_os("HOME").context("HOME is not set")?;
    Ok(PathBuf::from(home).join(".local/share/ipam-toolchain/llvm"))
}

fn bpf_linker(changed: &mut Vec<String>) -> anyhow::Result<()> {
    if output(Command::new("bpf-linker").arg("--version")).is_some() {
        return Ok(());
    }
    // bpf-linker's default LLVM does not link here; the nightly ships LLVM as a shared library
    // that bpf-linker can use instead (docs/toolchain.md).
    let sysroot = output(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))
        .context("cannot find the nightly toolchain's sysroot")?;
    let lib_dir = PathBuf::from(sysroot.trim()).join("lib");
    let llvm = std::fs::read_dir(&lib_dir)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libLLVM.so.") && n.contains("-rust-"))
        })
        .with_context(|| format!("no libLLVM.so.*-rust-* in {}", lib_dir.display()))?;
    let soname = llvm.file_name().expect("file name").to_owned();
    let major = soname
        .to_str()
        .and_then(|n| n.strip_prefix("libLLVM.so."))
        .and_then(|v| v.split('.').next())
        .context("cannot read the LLVM version")?
        .to_owned();
    let prefix = llvm_prefix()?;
    let prefix_lib = prefix.join("lib");
    std::fs::create_dir_all(&prefix_lib)?;
    // Two names: `libLLVM.so` for the build, the soname for the installed binary at run time.
    for name in [std::ffi::OsString::from("libLLVM.so"), soname] {
        let link = prefix_lib.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&llvm, &link)?;
    }
    println!(
        "setup: building bpf-linker 0.13.0 against the nightly's LLVM {major} (about a minute)"
    );
    exec(
        Command::new("cargo")
            .args([
                "install",
                "bpf-linker",
                "--version",
                "0.13.0",
                "--locked",
                "--force",
            ])
            .args([
                "--no-default-features",
                "--features",
                &format!("llvm-{major}"),
            ])
            .env("LLVM_PREFIX", &prefix),
    )
    .context("cannot build bpf-linker")?;
    if output(Command::new("bpf-linker").arg("--version")).is_none() {
        bail!("bpf-linker was installed but does not run; is ~/.cargo/bin on PATH?");
    }
    changed.push("bpf-linker".into());
    Ok(())
}

fn bpffs(changed: &mut Vec<String>) -> anyhow::Result<()> {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    if mounts
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some("/sys/fs/bpf") && l.contains(" bpf "))
    {
        return Ok(());
    }
    exec(Command::new("mount").args(["-t", "bpf", "bpf", "/sys/fs/bpf"]))
        .context("cannot mount bpffs at /sys/fs/bpf; the datapath pins live there (run as root)")?;
    changed.push("bpffs mounted".into());
    Ok(())
}
