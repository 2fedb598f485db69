//! `cargo xtask lab [failover]`: builds the binaries and runs a lab program
//! (tests/src/bin/lab.rs, tests/src/bin/lab-failover.rs).

use crate::cmd::{cargo, exec, target_dir};

#[derive(Debug, Clone, Copy, Default, clap::ValueEnum)]
pub(crate) enum Which {
    /// The cluster: pods on every node reaching each other, a service IP answered.
    #[default]
    Cluster,
    /// A service IP's node loses power: the timeline until clients are answered again.
    Failover,
}

pub(crate) fn run(which: Which) -> anyhow::Result<()> {
    exec(cargo().args(["build", "--bins"]))?;
    let bin = match which {
        Which::Cluster => "lab",
        Which::Failover => "lab-failover",
    };
    exec(&mut std::process::Command::new(
        target_dir()?.join("debug").join(bin),
    ))
}
