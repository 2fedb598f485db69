//! Builds the eBPF object (`ipam-ebpf`) with the nightly toolchain and bpf-linker, so that a plain
//! `cargo build` of the daemon always embeds an up-to-date datapath. `cargo xtask setup` installs
//! what this needs.
use anyhow::{Context as _, anyhow};

fn main() -> anyhow::Result<()> {
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
    .context(
        "building the eBPF object failed; run `cargo xtask setup` to install the nightly \
         toolchain's rust-src and bpf-linker",
    )
}
