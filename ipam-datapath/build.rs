//! Builds the eBPF object (`ipam-ebpf`) with the nightly toolchain and bpf-linker, so that a plain
//! `cargo build` of the daemon always embeds an up-to-date datapath. `cargo xtask setup` installs
//! what this needs.
//!
//! The nested build's output reaches cargo as `cargo:warning` lines (some 135 of them), which
//! read as trouble on every clean build. So the build runs in a child of this script, whose
//! output is read here: its directives pass on, and its lines are shown only when it fails.

use std::process::Command;

use anyhow::{Context as _, anyhow, bail};

/// Set in the child that runs the nested build.
const INNER: &str = "IPAM_DATAPATH_EBPF_BUILD";

fn main() -> anyhow::Result<()> {
    if std::env::var_os(INNER).is_some() {
        return build();
    }
    let this = std::env::current_exe().context("cannot find the build script's own path")?;
    let child = Command::new(&this)
        .env(INNER, "1")
        .output()
        .with_context(|| format!("cannot run {}", this.display()))?;
    let stdout = String::from_utf8_lossy(&child.stdout);
    let warning = |line: &str| {
        line.strip_prefix("cargo:warning=")
            .or_else(|| line.strip_prefix("cargo::warning="))
            .map(str::to_owned)
    };
    let mut said = Vec::new();
    for line in stdout.lines() {
        match warning(line) {
            Some(text) => said.push(text),
            None => println!("{line}"),
        }
    }
    if child.status.success() {
        return Ok(());
    }
    for line in &said {
        eprintln!("{line}");
    }
    eprintln!("{}", String::from_utf8_lossy(&child.stderr));
    bail!(
        "building the eBPF object failed ({}; its output is above); run `cargo xtask setup` to \
         install the nightly toolchain's rust-src and bpf-linker",
        child.status
    )
}

/// The nested build itself (in the child).
fn build() -> anyhow::Result<()> {
    let metadata_dir = std::env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR not set")?;
    let ebpf_dir = std::path::Path::new(&metadata_dir).join("../ipam-ebpf");
    let ebpf_dir = ebpf_dir
        .to_str()
        .ok_or_else(|| anyhow!("path of ipam-ebpf is not UTF-8: {}", ebpf_dir.display()))?;
    // ipam-common is a dependency of the eBPF crate; cargo tracks it for us only on the host side.
    println!("cargo:rerun-if-changed={metadata_dir}/../ipam-common/src");
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "ipam-ebpf",
            root_dir: ebpf_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::Nightly,
    )
}
