//! `cargo xtask lab`: builds the binaries and runs the lab program (tests/src/bin/lab.rs).

use crate::cmd::{cargo, exec, workspace_root};

pub(crate) fn run() -> anyhow::Result<()> {
    exec(cargo().args(["build", "--bins"]))?;
    exec(&mut std::process::Command::new(
        workspace_root().join("target/debug/lab"),
    ))
}
