//! `cargo xtask test`: every unit and integration test, after the binaries the integration tests
//! start (ipamd) are built.

use crate::cmd::{cargo, exec};


pub fn run(extra: &[String]) -> anyhow::Result<()> {
    exec(cargo().args(["build", "--bins"]))?;
    exec(cargo().arg("test").arg("--").args(extra))
}
