//! `cargo xtask lab [failover|bgp|kube]`: builds the binaries and runs a lab program
//! (tests/src/bin/lab.rs, lab-failover.rs, lab-bgp.rs, lab-kube.rs).

use std::path::PathBuf;

use anyhow::bail;

use crate::{
    cmd::{cargo, exec, target_dir},
    image, setup,
};

#[derive(Debug, Clone, Copy, Default, clap::ValueEnum)]
pub(crate) enum Which {
    /// The cluster: pods on every node reaching each other, a service IP answered.
    #[default]
    Cluster,
    /// A service IP's node loses power: the timeline until clients are answered again.
    Failover,
    /// Service IPs over BGP: a router learns them from every node (ECMP), one node loses
    /// power, the timeline until its route is withdrawn.
    Bgp,
    /// A real Kubernetes cluster (kube-apiserver, controller manager, scheduler, and on three
    /// nodes containerd, kubelet and kube-proxy) installed from deploy/ with kubectl; needs the
    /// Kubernetes binaries in KUBEBUILDER_ASSETS (docs/kubernetes.md).
    Kube,
}

/// What the Kubernetes lab's nodes run, from Debian.
const KUBE_PACKAGES: &[(&str, &str)] = &[
    ("containerd", "each node's container runtime (CRI)"),
    ("runc", "the OCI runtime containerd starts pods with"),
    (
        "containernetworking-plugins",
        "loopback, which containerd calls for every pod",
    ),
    (
        "busybox-static",
        "the lab's pause and web images (podman builds them from it)",
    ),
    ("iptables", "kube-proxy's iptables mode"),
    ("conntrack", "kube-proxy clears stale UDP flows with it"),
    (
        "ipvsadm",
        "kube-proxy's IPVS mode, and reading its tables by hand",
    ),
];

/// The services those packages bring, which the lab does not use: each node runs its own
/// containerd in its namespaces, so the host's stays as it was (not installed: left off).
const KUBE_SERVICES: &[(&str, &str)] = &[("containerd", "containerd.service")];

/// The Kubernetes binaries the lab runs, all in KUBEBUILDER_ASSETS.
const KUBE_BINARIES: [&str; 6] = [
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "kube-proxy",
    "kubectl",
];

const KUBE_IMAGE: &str = "localhost/ipam-ebpf:0.1.0";

pub(crate) fn run(which: Which) -> anyhow::Result<()> {
    let mut command = match which {
        Which::Kube => kube_program("lab-kube")?,
        other => std::process::Command::new(target_dir()?.join("debug").join(match other {
            Which::Cluster => "lab",
            Which::Failover => "lab-failover",
            Which::Bgp => "lab-bgp",
            Which::Kube => unreachable!(),
        })),
    };
    exec(cargo().args(["build", "--bins"]))?;
    exec(&mut command)
}

/// A program that runs a real Kubernetes cluster (the lab, the `kube-failover` bench), with
/// what it needs made ready: the nodes' Debian packages, the project's image (the nodes pull
/// nothing: it is built here and imported into each node), the Kubernetes binaries found.
pub(crate) fn kube_program(program: &str) -> anyhow::Result<std::process::Command> {
    let assets = kube_assets()?;
    println!(
        "lab: [1/3] the nodes' Debian packages, [2/3] the project's image (a release build, then \
         podman), [3/3] the binaries, then the cluster. The first run takes about 17 minutes \
         on 2 CPUs before any cluster starts (most of it the release build); later ones \
         rebuild only what changed"
    );
    let mut changed = Vec::new();
    println!("lab: [1/3] the nodes' Debian packages");
    setup::install_packages_without_services(KUBE_PACKAGES, KUBE_SERVICES, &mut changed)?;
    println!("lab: [2/3] the project's image {KUBE_IMAGE}");
    image::run(KUBE_IMAGE, true)?;
    println!("lab: [3/3] the binaries");
    let mut c = std::process::Command::new(target_dir()?.join("debug").join(program));
    c.env("KUBEBUILDER_ASSETS", assets)
        .env("IPAM_IMAGE", KUBE_IMAGE);
    Ok(c)
}

/// The folder KUBEBUILDER_ASSETS names, with every binary the lab runs in it.
fn kube_assets() -> anyhow::Result<PathBuf> {
    let Some(dir) = std::env::var_os("KUBEBUILDER_ASSETS").map(PathBuf::from) else {
        bail!(
            "the Kubernetes lab runs the real Kubernetes binaries ({}), which no package \
             registry this machine reaches carries; build them from an upstream Kubernetes tree as \
             docs/toolchain.md (\"A real Kubernetes cluster\") says, and set KUBEBUILDER_ASSETS \
             to their folder",
            KUBE_BINARIES.join(", ")
        );
    };
    let missing: Vec<&str> = KUBE_BINARIES
        .into_iter()
        .filter(|b| !dir.join(b).is_file())
        .collect();
    if !missing.is_empty() {
        bail!(
            "KUBEBUILDER_ASSETS={} lacks {}; the lab needs all of {}",
            dir.display(),
            missing.join(", "),
            KUBE_BINARIES.join(", ")
        );
    }
    Ok(dir)
}
