//! `cargo xtask test`: every unit and integration test, after the binaries the integration tests
//! start (ipamd) are built; on a full run (no filter) every fuzz target then runs briefly
//! (`IPAM_FUZZ_SECONDS` each, default 20). Ends with one plain line totalling all test binaries.

use std::{
    io::{BufRead as _, BufReader},
    process::Stdio,
};

use anyhow::{Context as _, bail};

use crate::cmd::{cargo, exec, warn_if_disk_low};

/// What a clean clone's test run writes under target/ and fuzz/target/, measured: 2.1 GiB of
/// test binaries, 2.8 GiB of fuzz builds, the eBPF objects, the previous release's crates for
/// the upgrade test, with room to spare.
const DISK_NEEDED_GIB: u64 = 9;

pub(crate) fn run(extra: &[String]) -> anyhow::Result<()> {
    warn_if_disk_low(DISK_NEEDED_GIB, "building and running the tests");
    // Before this tree's binaries: its build shares their place (`previous_release`).
    let previous = crate::previous_release::ipamd()?;
    exec(cargo().args(["build", "--bins"]))?;
    let mut test = cargo();
    if let Some(previous) = previous {
        test.env(crate::previous_release::ENV, previous);
    }
    let mut child = test
        .args(["test", "--no-fail-fast", "--"])
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start cargo test")?;
    let stdout = child.stdout.take().expect("piped stdout");
    let (mut passed, mut failed) = (0u64, 0u64);
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        println!("{line}");
        if let Some((p, f)) = parse_result(&line) {
            passed += p;
            failed += f;
        }
    }
    let status = child.wait()?;
    let fuzzed = if extra.is_empty() && status.success() && failed == 0 {
        let seconds = std::env::var("IPAM_FUZZ_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(20);
        crate::fuzz::run(crate::fuzz::Target::All, seconds)
    } else {
        Ok(())
    };
    println!("tests: {passed} passed, {failed} failed");
    fuzzed?;
    if !status.success() || failed > 0 {
        bail!("tests failed ({failed} failed; cargo test exited with {status})");
    }
    if passed == 0 {
        bail!("no test ran");
    }
    Ok(())
}

/// `test result: ok. 7 passed; 0 failed; ...` -> (7, 0).
fn parse_result(line: &str) -> Option<(u64, u64)> {
    let rest = line.trim().strip_prefix("test result: ")?;
    let count = |word: &str| -> Option<u64> {
        rest.split(';')
            .find_map(|part| part.trim().rsplit_once(' ').filter(|(_, w)| *w == word))
            .and_then(|(n, _)| n.rsplit(' ').next()?.parse().ok())
    };
    Some((count("passed")?, count("failed")?))
}
