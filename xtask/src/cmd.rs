//! Running commands with clear failures.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};

/// The workspace root (xtask lives one level below it).
pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask is inside the workspace")
        .to_owned()
}

/// Where cargo puts what it builds: `target/` under the workspace, or wherever
/// `CARGO_TARGET_DIR` or a cargo configuration says. Asked of cargo itself, so every way of
/// moving it is honoured.
pub(crate) fn target_dir() -> anyhow::Result<PathBuf> {
    let metadata = output(cargo().args(["metadata", "--format-version", "1", "--no-deps"]))
        .context("`cargo metadata` failed; run it by hand to see why")?;
    let metadata: serde_json::Value =
        serde_json::from_str(&metadata).context("`cargo metadata` printed no JSON")?;
    metadata["target_directory"]
        .as_str()
        .map(PathBuf::from)
        .context("`cargo metadata` names no target_directory")
}

/// Runs `cmd` with inherited output; fails with the command line when it fails.
pub(crate) fn exec(cmd: &mut Command) -> anyhow::Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

/// Runs `cmd` quietly and returns its stdout, or `None` when it cannot run or fails.
pub(crate) fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.stderr(Stdio::null()).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

pub(crate) fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(workspace_root());
    c
}

/// Warns, before a build, when the filesystem holding the workspace has less than `need_gib`
/// free: a full disk otherwise shows up minutes later as a linker bus error or `os error 28`.
pub(crate) fn warn_if_disk_low(need_gib: u64, what: &str) {
    let root = workspace_root();
    let free = output(
        Command::new("df")
            .args(["--output=avail", "-B1"])
            .arg(&root),
    )
    .and_then(|out| out.lines().nth(1)?.trim().parse::<u64>().ok());
    let Some(free) = free else { return };
    let gib = |bytes: u64| bytes as f64 / (1u64 << 30) as f64;
    if free < need_gib << 30 {
        eprintln!(
            "warning: {:.1} GiB free on the filesystem of {}; {what} takes up to {need_gib} GiB \
             from a clean clone. Free some space (`cargo clean` in another checkout, or \
             `rm -rf target/debug/incremental`) if the build fails with `No space left on device`.",
            gib(free),
            root.display()
        );
    }
}
