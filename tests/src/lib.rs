//! Test kit for the integration tests and benchmarks: network namespaces, veth pairs, bpffs
//! roots and daemon processes that clean up after themselves, even when a test panics.
//!
//! Every name carries the process id and a counter, so tests run in parallel and again after a
//! crash without colliding; traffic only flows between namespaces a test made itself.

pub mod arp_watch;
pub mod bgp_rig;
pub mod bgp_router;
pub mod cluster;
pub mod cni;
pub mod daemon;
pub mod delay;
pub mod deploy;
pub mod failover;
pub mod http;
pub mod ipam_node;
pub mod kube;
pub mod kube_api;
pub mod netns;
pub mod oracle;
pub mod pod_net;
pub mod relay;
pub mod resolve;
pub mod responder_harness;
pub mod tcp_bench;
pub mod traffic;

use std::{
    path::PathBuf,
    process::Command,
    sync::atomic::{AtomicU32, Ordering},
};

use ipam_datapath::Datapath;

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Says, in the test run's output (past the test harness's capture, which hides what a passing
/// test prints), that `what` was not checked in this run and why: a check that cannot run here
/// must not read as passed.
pub fn not_checked(what: &str, why: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "NOT CHECKED in this run: {what}: {why}");
}

/// A short name unique to this process and call (interface names are limited to 15 bytes).
pub fn unique(tag: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{tag}{}x{n}", std::process::id() % 100_000)
}

/// Runs a command and panics with its output when it fails.
pub fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {} failed: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A bpffs directory of the test's own, removed (with everything pinned in it) on drop.
pub struct BpffsRoot(pub PathBuf);

impl BpffsRoot {
    pub fn new() -> Self {
        Self::named("ipam-test-")
    }

    /// A fresh root `/sys/fs/bpf/<tag><unique>`; a process that cannot drop it (a fuzzer that
    /// exits) uses its own tag, so its runner can remove what it left.
    pub fn named(tag: &str) -> Self {
        Self(PathBuf::from("/sys/fs/bpf").join(unique(tag)))
    }
}

impl Default for BpffsRoot {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for BpffsRoot {
    fn drop(&mut self) {
        let _ = Datapath::remove_pins(&self.0);
    }
}

/// A file of the test's own, removed on drop.
pub struct TempFile(pub PathBuf);

impl TempFile {
    /// A fresh path in the temporary directory, `<unique>.<extension>`.
    pub fn new(tag: &str, extension: &str) -> Self {
        Self(std::env::temp_dir().join(format!("{}.{extension}", unique(tag))))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A directory of the test's own, removed with its contents on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let path = std::env::temp_dir().join(unique(tag));
        std::fs::create_dir_all(&path).expect("create temporary directory");
        Self(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The previous release's `ipamd`, which `cargo xtask test` builds (xtask's `previous_release`)
/// and names in `IPAM_PREVIOUS_IPAMD`; `None`, said as not checked, when it is not there.
pub fn previous_release_ipamd(what: &str) -> Option<PathBuf> {
    let binary = std::env::var_os("IPAM_PREVIOUS_IPAMD").map(PathBuf::from);
    match binary {
        Some(binary) if binary.exists() => Some(binary),
        Some(binary) => {
            not_checked(what, &format!("{} does not exist", binary.display()));
            None
        }
        None => {
            not_checked(
                what,
                "IPAM_PREVIOUS_IPAMD is not set: `cargo xtask test` builds the previous \
                 release's ipamd and sets it (not in a shallow clone)",
            );
            None
        }
    }
}

/// Path of a binary of this workspace, built by `cargo build --bins` (`cargo xtask test` does).
pub fn workspace_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    // Test binaries live in target/<profile>/deps, other binaries in target/<profile>.
    let dir = exe.parent().expect("binary has a directory");
    let candidates = [dir.join(name), dir.join("..").join(name)];
    candidates
        .iter()
        .find(|p| p.exists())
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "{name} not found next to {}: build the binaries first with `cargo build --bins` \
                 (cargo xtask test does)",
                exe.display()
            )
        })
}

/// Runs `program` once on `frame` through BPF_PROG_TEST_RUN: (return value, frame as it left).
pub fn test_run<P>(program: &P, frame: &[u8]) -> (u32, Vec<u8>)
where
    P: for<'a> aya::programs::TestRun<
            Opts<'a> = aya::programs::TestRunOptions<'a>,
            Result = aya::programs::TestRunResult,
        >,
{
    let mut out = vec![0u8; frame.len() + 256];
    let result = program
        .test_run(aya::programs::TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            ..aya::programs::TestRunOptions::new()
        })
        .unwrap_or_else(|e| panic!("test run on frame {frame:02x?}: {e}"));
    out.truncate(result.data_size_out as usize);
    (result.return_value, out)
}
