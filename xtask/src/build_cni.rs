//! `cargo xtask build-cni`: the CNI plugin as a static executable (glibc linked in), the form to
//! install on nodes: it has no library to resolve at start-up, which makes each invocation
//! about 0.4 ms cheaper here (docs/cni.md), and it runs on any node whatever its libc.

use std::path::PathBuf;

use crate::cmd::{cargo, exec, target_dir};

const TARGET: &str = "x86_64-unknown-linux-gnu";

/// Builds the static plugin and returns its path.
pub(crate) fn run() -> anyhow::Result<PathBuf> {
    // An explicit --target keeps the flag off build scripts and proc macros, which cannot be
    // static.
    exec(
        cargo()
            .args(["build", "--release", "-p", "ipam-cni", "--target", TARGET])
            .env(
                "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS",
                "-C target-feature=+crt-static",
            ),
    )?;
    let path = target_dir()?.join(TARGET).join("release/ipam-cni");
    println!("static ipam-cni: {}", path.display());
    Ok(path)
}
