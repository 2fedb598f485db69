//! `cargo xtask build-ebpf`: the eBPF object alone, with the flags ipam-datapath's build.rs uses.

use crate::cmd::{exec, workspace_root};

pub(crate) fn run() -> anyhow::Result<()> {
    let root = workspace_root();
    let mut cmd = std::process::Command::new("cargo");
    cmd.current_dir(root.join("ipam-ebpf"))
        .args([
            "+nightly",
            "build",
            "--release",
            "--target",
            "bpfel-unknown-none",
        ])
        .args(["-Z", "build-std=core", "--bins"])
        // BTF for typed map dumps and the verifier's line info, as aya-build does.
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            "-Cdebuginfo=2\x1f-Clink-arg=--btf",
        )
        .env_remove("RUSTC")
        .env_remove("RUSTC_WORKSPACE_WRAPPER");
    exec(&mut cmd)?;
    println!(
        "eBPF object: {}",
        root.join("target/bpfel-unknown-none/release/ipam-ebpf")
            .display()
    );
    Ok(())
}
