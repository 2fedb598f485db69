//! `cargo xtask lint`: the style gate CI runs before the tests. `cargo fmt --check`, clippy with
//! warnings as errors on the host crates, and clippy on the eBPF crate for its own target (the
//! host-side clippy leaves it out: it only builds for bpfel), and the modules' layers.

use crate::cmd::{cargo, exec, workspace_root};

pub(crate) fn run() -> anyhow::Result<()> {
    exec(cargo().args(["fmt", "--all", "--check"]))?;
    // The fuzz targets are a workspace of their own (their warnings are denied in its manifest).
    exec(cargo().args(["fmt", "--check", "--manifest-path", "fuzz/Cargo.toml"]))?;
    exec(cargo().args(["clippy", "--all-targets", "--", "-D", "warnings"]))?;
    let mut ebpf = std::process::Command::new("cargo");
    ebpf.current_dir(workspace_root().join("ipam-ebpf"))
        .args([
            "+nightly",
            "clippy",
            "--release",
            "--target",
            "bpfel-unknown-none",
            "-Z",
            "build-std=core",
            "--",
            "-D",
            "warnings",
        ])
        .env_remove("RUSTC")
        .env_remove("RUSTC_WORKSPACE_WRAPPER");
    exec(&mut ebpf)?;
    crate::layers::run()?;
    println!("lint: fmt, clippy (host crates), clippy (eBPF) and the layers are clean");
    Ok(())
}
