//! The agent of the previous release, for the rolling-upgrade test: agents of two versions in
//! one cluster, as every rollout has them for a while.
//!
//! `xtask/previous-release` names the release's commit. Its tree is taken out of this
//! repository's history (`git archive`, no network) under `target/previous-release/<commit>/`
//! and its `ipamd` built there with this workspace's target directory, so the dependencies
//! already built are reused (only the workspace's own crates are compiled again, once: the
//! binary is kept). Its crates' version gets a `-previous` suffix first: cargo names a path
//! crate's artifacts by its name, version and place in the workspace, which both trees share,
//! and without it each build would take the other's crates for its own. A clone without that
//! commit (a shallow one) skips the test and says so.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use crate::cmd::{cargo, exec, output, target_dir, workspace_root};

/// What the tests read to find the previous release's `ipamd`.
pub(crate) const ENV: &str = "IPAM_PREVIOUS_IPAMD";

/// The previous release's `ipamd`, built if it is not yet; `None` (and why, said) when its
/// commit is not in this clone's history.
pub(crate) fn ipamd() -> anyhow::Result<Option<PathBuf>> {
    let commit = commit()?;
    let dir = target_dir()?.join("previous-release").join(&commit);
    let binary = dir.join("ipamd");
    if binary.exists() {
        return Ok(Some(binary));
    }
    let known = output(Command::new("git").current_dir(workspace_root()).args([
        "cat-file",
        "-e",
        &format!("{commit}^{{commit}}"),
    ]));
    if known.is_none() {
        eprintln!(
            "warning: the previous release's commit {commit} (xtask/previous-release) is not in \
             this clone's history (a shallow clone?): the rolling-upgrade test between two \
             versions will not run. Fetch it (`git fetch --unshallow`) to run it."
        );
        return Ok(None);
    }
    let src = dir.join("src");
    extract(&commit, &src)?;
    mark_as_previous(&src)?;
    println!("building the previous release's ipamd ({commit}) for the rolling-upgrade test");
    exec(
        cargo()
            .current_dir(&src)
            .env("CARGO_TARGET_DIR", target_dir()?)
            .args(["build", "--bin", "ipamd"]),
    )
    .with_context(|| format!("building ipamd of the previous release {commit} failed"))?;
    // The build put it where this tree's ipamd goes; this tree's build, next, puts that back.
    let built = target_dir()?.join("debug").join("ipamd");
    std::fs::copy(&built, &binary)
        .with_context(|| format!("cannot copy {} to {}", built.display(), binary.display()))?;
    Ok(Some(binary))
}

/// The commit `xtask/previous-release` names (its one line that is not a comment).
fn commit() -> anyhow::Result<String> {
    let file = workspace_root().join("xtask").join("previous-release");
    let text = std::fs::read_to_string(&file)
        .with_context(|| format!("cannot read {}", file.display()))?;
    let commit = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .unwrap_or_default();
    if commit.len() != 40 || !commit.chars().all(|c| c.is_ascii_hexdigit()) {
        bail!(
            "{} must hold the previous release's full commit id (40 hex digits), not {commit:?}",
            file.display()
        );
    }
    Ok(commit.to_owned())
}

/// Gives the crates of the tree at `src` a version of their own (`0.1.0` -> `0.1.0-previous`),
/// in its workspace's `[workspace.package]`.
fn mark_as_previous(src: &Path) -> anyhow::Result<()> {
    let manifest = src.join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest)
        .with_context(|| format!("cannot read {}", manifest.display()))?;
    let mut in_package = false;
    let mut marked = false;
    let lines: Vec<String> = text
        .lines()
        .map(|line| {
            if line.starts_with('[') {
                in_package = line.trim() == "[workspace.package]";
            }
            match line.strip_prefix("version = \"") {
                Some(rest) if in_package && !marked => {
                    marked = true;
                    format!("version = \"{}-previous\"", rest.trim_end_matches('"'))
                }
                _ => line.to_owned(),
            }
        })
        .collect();
    if !marked {
        bail!(
            "{} has no version in [workspace.package]: cannot tell its crates from this tree's",
            manifest.display()
        );
    }
    std::fs::write(&manifest, lines.join("\n") + "\n")
        .with_context(|| format!("cannot write {}", manifest.display()))
}

/// The tree of `commit` under `src`, afresh.
fn extract(commit: &str, src: &Path) -> anyhow::Result<()> {
    if src.exists() {
        std::fs::remove_dir_all(src).with_context(|| format!("cannot clear {}", src.display()))?;
    }
    std::fs::create_dir_all(src).with_context(|| format!("cannot create {}", src.display()))?;
    let archive = Command::new("git")
        .current_dir(workspace_root())
        .args(["archive", "--format=tar", commit])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("cannot run git archive")?;
    exec(
        Command::new("tar")
            .arg("-x")
            .arg("-C")
            .arg(src)
            .stdin(archive.stdout.context("git archive's output")?),
    )
    .with_context(|| format!("cannot extract {commit} into {}", src.display()))
}
