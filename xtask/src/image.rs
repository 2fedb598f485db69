//! `cargo xtask image`: the container image of deploy/Containerfile, from binaries built here,
//! then checked: the binaries start in it, and the agent DaemonSet's init step installs the CNI
//! plugin and network configuration as deploy/base/agent.yaml and deploy/base/config.yaml say
//! (`tests/tests/image.rs`).
//!
//! Building the binaries inside the image (the Containerfile's default) needs the Rust images
//! from a container registry; `--local-base` makes the runtime base from Debian's packages
//! instead, for machines that reach no registry.

use std::{path::Path, process::Command};

use anyhow::Context as _;

use crate::{
    build_cni,
    cmd::{cargo, exec, output, target_dir, workspace_root},
    setup,
};

/// What building and checking the image needs on the host.
const PACKAGES: &[(&str, &str)] = &[
    ("podman", "builds and runs the image"),
    (
        "runc",
        "the OCI runtime podman runs containers with (crun refuses hybrid cgroup hierarchies)",
    ),
    (
        "mmdebstrap",
        "--local-base: a Debian root file system from the package mirror",
    ),
];

/// The base made by `--local-base`.
const LOCAL_BASE: &str = "localhost/ipam-base:bookworm";

pub(crate) fn run(tag: &str, local_base: bool) -> anyhow::Result<()> {
    let mut changed = Vec::new();
    setup::install_packages(PACKAGES, &mut changed)?;
    let target = target_dir()?;
    let context = target.join("image");
    let out = context.join("out");
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;

    exec(cargo().args([
        "build",
        "--release",
        "-p",
        "ipam-daemon",
        "-p",
        "ipamctl",
        "--bins",
    ]))?;
    let cni = build_cni::run()?;
    let release = target.join("release");
    for (from, name) in [
        (release.join("ipamd"), "ipamd"),
        (release.join("ipamctl"), "ipamctl"),
        (cni, "ipam-cni"),
    ] {
        std::fs::copy(&from, out.join(name))
            .with_context(|| format!("cannot copy {} into the image context", from.display()))?;
    }

    let mut build = podman();
    build
        .args(["build", "--network", "host", "-f"])
        .arg(workspace_root().join("deploy/Containerfile"))
        .args(["--build-arg", "BINARIES=prebuilt", "-t", tag]);
    if local_base {
        make_local_base(&context)?;
        build.args(["--build-arg", &format!("BASE_IMAGE={LOCAL_BASE}")]);
    }
    exec(build.arg(&context)).context(
        "the image build failed; without a reachable container registry, use --local-base",
    )?;
    println!("image: built {tag}; checking it");

    exec(
        cargo()
            .args([
                "test",
                "-p",
                "ipam-tests",
                "--test",
                "image",
                "--",
                "--ignored",
            ])
            .env("IPAM_IMAGE", tag),
    )?;
    let size = output(podman().args(["image", "inspect", "--format", "{{.Size}}", tag]))
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map_or_else(|| "?".to_owned(), |b| format!("{:.0} MB", b as f64 / 1e6));
    println!("image: {tag} ({size}) passed its checks");
    Ok(())
}

/// Podman with the runtime the machines of this project can use.
fn podman() -> Command {
    let mut c = Command::new("podman");
    c.args(["--runtime", "runc"]);
    c
}

/// A Debian bookworm root file system from the package mirror, imported as `LOCAL_BASE`
/// (once: an existing one is kept).
fn make_local_base(context: &Path) -> anyhow::Result<()> {
    if output(podman().args(["image", "exists", LOCAL_BASE])).is_some() {
        return Ok(());
    }
    let tar = context.join("base.tar");
    exec(
        Command::new("mmdebstrap")
            .args([
                "--variant=apt",
                "--include=ca-certificates,iproute2",
                "bookworm",
            ])
            .arg(&tar),
    )
    .context("mmdebstrap failed; check that the Debian mirror is reachable")?;
    exec(podman().args(["import"]).arg(&tar).arg(LOCAL_BASE))?;
    std::fs::remove_file(&tar).ok();
    Ok(())
}
