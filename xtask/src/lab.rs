//! `cargo xtask lab [failover|bgp]`: builds the binaries and runs a lab program
//! (tests/src/bin/lab.rs, tests/src/bin/lab-failover.rs, tests/src/bin/lab-bgp.rs).

use crate::cmd::{cargo, exec, target_dir};

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
}

pub(crate) fn run(which: Which) -> anyhow::Result<()> {
    exec(cargo().args(["build", "--bins"]))?;
    let bin = match which {
        Which::Cluster => "lab",
        Which::Failover => "lab-failover",
        Which::Bgp => "lab-bgp",
    };
    exec(&mut std::process::Command::new(
        target_dir()?.join("debug").join(bin),
    ))
}
