//! `cargo xtask clean-root`: `cargo xtask setup` and the workspace build in a clean Debian root,
//! to find what a fresh machine lacks before CI does. A machine where a package was once
//! installed by hand passes every build and hides the gap; a root made from the package mirror
//! has only what the machine image of a Rust build host has (the baseline below), so whatever
//! else the build needs must come from `setup`, or this command fails and says where.
//!
//! The root gets the machine's Rust toolchains through an overlay (read from the host, written
//! to the root: setup may add components without touching the host's), a `CARGO_HOME` of its own
//! (so setup builds bpf-linker again, as on a fresh machine), the host's crate downloads through
//! an overlay (to spare the registry, not to hide anything: crates are not system packages) and
//! the source tree read-only (the build writes nothing into it), and the host's network settings
//! (resolver, trusted certificate authorities). Every mount lives in a private
//! mount namespace and vanishes with it; the root is removed at the end unless `--keep`.
//!
//! Slow (a from-scratch build on this machine's cores); not part of CI. Run it whenever a
//! dependency or a set-up step changes (docs/toolchain.md).

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, bail};

use crate::{
    cmd::{exec, output, target_dir, workspace_root},
    setup,
};

/// What a fresh Rust build machine has besides a minimal Debian: a C toolchain and linker for
/// cargo, git, and CA certificates. Everything else the build needs is setup's to install.
const BASELINE: &str = "build-essential,ca-certificates,git";

/// What this command itself needs on the host.
const HOST_PACKAGES: &[(&str, &str)] = &[
    (
        "mmdebstrap",
        "makes the clean Debian root from the package mirror",
    ),
    (
        "util-linux",
        "unshare: a private mount namespace for the root's mounts",
    ),
];

pub(crate) fn run(keep: bool) -> anyhow::Result<()> {
    let started = Instant::now();
    setup::install_packages(HOST_PACKAGES, &mut Vec::new())?;
    let home = PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?);
    let rustup_home =
        std::env::var_os("RUSTUP_HOME").map_or_else(|| home.join(".rustup"), PathBuf::from);
    let cargo_home =
        std::env::var_os("CARGO_HOME").map_or_else(|| home.join(".cargo"), PathBuf::from);
    let rustup = cargo_home.join("bin/rustup");
    if !rustup.exists() {
        bail!(
            "no rustup at {}: the clean root borrows the machine's Rust toolchains through it",
            rustup.display()
        );
    }

    let work = target_dir()?.join("clean-root");
    remove(&work)?;
    std::fs::create_dir_all(&work).with_context(|| format!("cannot create {}", work.display()))?;
    let root = work.join("root");
    let release =
        output(Command::new("sh").args(["-c", ". /etc/os-release && echo $VERSION_CODENAME"]))
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "bookworm".to_owned());
    println!("clean-root: a Debian {release} root with only {BASELINE} (mmdebstrap)");
    let made = Instant::now();
    exec(
        Command::new("mmdebstrap")
            .args(["--variant=apt", "--include", BASELINE])
            .arg(&release)
            .arg(&root),
    )
    .context("mmdebstrap failed; check that the Debian mirror is reachable")?;
    let root_s = made.elapsed().as_secs_f64();

    let script = inside_script(&root, &work, &rustup_home, &cargo_home, &rustup)?;
    let script_path = work.join("run.sh");
    std::fs::write(&script_path, script)?;
    println!("clean-root: root made in {root_s:.0} s; running setup and the build inside it");
    let built = Instant::now();
    let result = exec(
        Command::new("unshare")
            .args(["--mount", "--propagation", "private", "bash"])
            .arg(&script_path),
    );
    let build_s = built.elapsed().as_secs_f64();
    let log = work.join("root/clean-root.log");
    match result {
        Ok(()) => println!(
            "clean-root: PASSED: setup and the workspace build need nothing setup does not \
             install. Root {root_s:.0} s, setup and build {build_s:.0} s, total {:.0} s",
            started.elapsed().as_secs_f64()
        ),
        Err(e) => {
            println!(
                "clean-root: FAILED after {build_s:.0} s: {e:#}\n\
                 The step that failed and its output are above (and in {}). A missing system \
                 header, library or tool there is a Debian package to add to setup's \
                 BUILD_PACKAGES (xtask/src/setup.rs); the root is kept in {} to look into.",
                log.display(),
                work.display()
            );
            bail!("the clean root lacks something the build needs");
        }
    }
    if !keep {
        remove(&work)?;
    }
    Ok(())
}

/// The script run in the private mount namespace: mounts, then setup and the build in a chroot.
fn inside_script(
    root: &Path,
    work: &Path,
    rustup_home: &Path,
    cargo_home: &Path,
    rustup: &Path,
) -> anyhow::Result<String> {
    let q = |p: &Path| format!("'{}'", p.display());
    let source = workspace_root();
    let (root, work) = (q(root), q(work));
    let registry = cargo_home.join("registry");
    std::fs::create_dir_all(&registry)?;
    Ok(format!(
        r#"set -euo pipefail
root={root}
work={work}
overlay() {{ # lower, name, mount point
  mkdir -p "$work/$2.upper" "$work/$2.work" "$3"
  mount -t overlay overlay -o "lowerdir=$1,upperdir=$work/$2.upper,workdir=$work/$2.work" "$3"
}}
mount -t proc proc "$root/proc"
mount --bind /sys "$root/sys"
mount --rbind /dev "$root/dev"
mkdir -p "$root/src" "$root/root/.cargo/bin"
mount --bind {source} "$root/src"
mount -o remount,bind,ro "$root/src"
overlay {rustup_home} rustup "$root/root/.rustup"
overlay {registry} registry "$root/root/.cargo/registry"
# The host's network settings: its resolver, and the certificate authorities it trusts (a
# site's own, for a proxy in front of the registries, among them; kept where a later
# update-ca-certificates in the root finds them again).
cp /etc/resolv.conf "$root/etc/resolv.conf"
if [ -d /usr/local/share/ca-certificates ]; then
  cp -r /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/"
fi
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
cp {rustup} "$root/root/.cargo/bin/rustup"
for tool in cargo rustc rustdoc rustfmt cargo-fmt cargo-clippy clippy-driver; do
  ln -sf rustup "$root/root/.cargo/bin/$tool"
done
chroot "$root" /usr/bin/env -i HOME=/root PATH=/root/.cargo/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  CARGO_TARGET_DIR=/build CARGO_INCREMENTAL=0 TERM=dumb \
  bash -c 'set -euo pipefail; cd /src
    echo "== cargo xtask setup"; cargo xtask setup
    echo "== cargo build --workspace --all-targets --locked"
    cargo build --workspace --all-targets --locked' 2>&1 | tee "$root/clean-root.log"
"#,
        source = q(&source),
        rustup_home = q(rustup_home),
        registry = q(&registry),
        rustup = q(rustup),
    ))
}

/// Removes a previous root; its mounts died with their namespace, so only files are left. A
/// mount still under it (its namespace outlived it somehow) would let the removal reach the
/// host's /dev or the source tree: then nothing is removed.
fn remove(work: &Path) -> anyhow::Result<()> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    if let Some(mount) = mounts
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .find(|m| Path::new(m).starts_with(work))
    {
        bail!(
            "{mount} is still mounted inside the clean root {}; unmount it (umount -R) and \
             remove the folder by hand",
            work.display()
        );
    }
    if work.exists() {
        std::fs::remove_dir_all(work)
            .with_context(|| format!("cannot remove the previous clean root {}", work.display()))?;
    }
    Ok(())
}
