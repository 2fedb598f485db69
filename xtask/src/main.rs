//! Project automation: `cargo xtask <command>`. Deliberately independent of the project's own
//! crates, so `setup` runs on a machine that cannot build them yet.

mod bench;
mod build_cni;
mod build_ebpf;
mod clean_root;
mod cmd;
mod completions;
mod fuzz;
mod image;
mod lab;
mod layers;
mod lint;
mod previous_release;
mod setup;
mod test;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(about = "Build, test, benchmark and demo the IPAM datapath")]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Install or check every prerequisite (Debian packages, nightly rust-src, bpf-linker, bpffs).
    Setup {
        /// Only what building needs (the nightly with rust-src, bpf-linker): for an image
        /// build, which has no Debian test packages to install and no bpffs to mount.
        #[arg(long)]
        toolchain_only: bool,
    },
    /// Run `setup` and the workspace build in a clean Debian root (mmdebstrap) with the
    /// machine's Rust toolchains, to find what a fresh machine lacks. Slow; not part of CI.
    CleanRoot {
        /// Keep the root (under the target directory) after a successful run.
        #[arg(long)]
        keep: bool,
    },
    /// Build the eBPF object on its own (a plain `cargo build` of the daemon also does it).
    BuildEbpf,
    /// Build the CNI plugin as a static executable, the form to install on nodes.
    BuildCni,
    /// fmt --check and clippy -D warnings on every crate, the eBPF one included, and `layers`.
    Lint,
    /// Check that no two top-level modules of a crate need each other, and print the layers.
    Layers,
    /// Set up, then lint (as `lint`) and run every unit and integration test.
    Test {
        /// Extra arguments for `cargo test` (after `--`), e.g. a test name filter.
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
    /// Set up, then run the lab: a cluster (etcd, operators, three nodes, a client) with pods on
    /// every node; `lab failover` kills the node answering for a service IP and prints the
    /// timeline; `lab kube` installs the project on a real Kubernetes cluster.
    Lab {
        #[arg(value_enum)]
        which: Option<lab::Which>,
    },
    /// Build ipamctl and write its shell completions and man page under target/ (completions/,
    /// man/), ready to install.
    Completions,
    /// Set up, then run a fuzz target (or all) for a bounded time and report executions.
    Fuzz {
        #[arg(value_enum)]
        target: fuzz::Target,
        /// How long to run each target.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
    },
    /// Build the container image (deploy/Containerfile) from binaries built here, and check it:
    /// the binaries start, and the agent's init step installs the CNI plugin.
    Image {
        #[arg(long, default_value = "localhost/ipam-ebpf:0.1.0")]
        tag: String,
        /// Make the base image from Debian's packages (mmdebstrap) instead of pulling
        /// debian:bookworm-slim from a registry.
        #[arg(long)]
        local_base: bool,
    },
    /// Run seeds of the whole-cluster simulation (ipam-sim) in release: `--seeds N [--nodes K]`,
    /// or one seed `--seed S [--events 0,3]`; prints what was exercised, seeds per second, and
    /// each failing seed shrunk with the command that replays it.
    Sim {
        /// Passed on to ipam-sim.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Set up, then run a benchmark and print its figures (last line: key=value pairs).
    Bench {
        #[arg(value_enum)]
        name: bench::Name,
    },
}

fn main() -> anyhow::Result<()> {
    match Args::parse().command {
        Command::Setup { toolchain_only } => {
            if toolchain_only {
                setup::toolchain()
            } else {
                setup::run()
            }
        }
        Command::CleanRoot { keep } => clean_root::run(keep),
        Command::BuildEbpf => build_ebpf::run(),
        Command::BuildCni => build_cni::run().map(drop),
        Command::Lint => lint::run(),
        Command::Layers => layers::run(),
        Command::Test { args } => {
            setup::run()?;
            // A filtered run is a developer's loop; the full run is CI's and must be clean.
            if args.is_empty() {
                lint::run()?;
            }
            test::run(&args)
        }
        Command::Completions => completions::run(),
        Command::Lab { which } => {
            setup::run()?;
            lab::run(which.unwrap_or_default())
        }
        Command::Fuzz { target, seconds } => {
            setup::run()?;
            fuzz::run(target, seconds)
        }
        Command::Image { tag, local_base } => image::run(&tag, local_base),
        Command::Sim { args } => cmd::exec(
            cmd::cargo()
                .args([
                    "run",
                    "--release",
                    "-p",
                    "ipam-sim",
                    "--bin",
                    "ipam-sim",
                    "--",
                ])
                .args(&args),
        ),
        Command::Bench { name } => {
            // The simulator needs no package and no root.
            if !matches!(name, bench::Name::Sim) {
                setup::run()?;
            }
            bench::run(name)
        }
    }
}
