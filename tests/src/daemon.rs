//! `ipamd` as a real process inside a test namespace.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use ipam_datapath::ResponderMaps;

use crate::{netns::Netns, workspace_binary};

/// A running `ipamd`, killed on drop. Its log goes to a file the test can read.
pub struct Daemon {
    child: Child,
    pub log: PathBuf,
}

impl Daemon {
    /// Starts `ipamd -c config` in `ns` (only its network namespace is entered, which keeps the
    /// host's bpffs visible; `ip netns exec` would remount /sys and hide it).
    pub fn start(ns: &Netns, config: &Path) -> Self {
        Self::start_with(ns, config, &[])
    }

    /// As `start`, with more arguments (`--role agent`, say).
    pub fn start_with(ns: &Netns, config: &Path, args: &[&str]) -> Self {
        Self::start_in(ns, config, args, &[])
    }

    /// As `start_with`, with `env` added (a `KUBECONFIG`, say).
    pub fn start_in(ns: &Netns, config: &Path, args: &[&str], env: &[(&str, &Path)]) -> Self {
        Self::start_binary(ns, &workspace_binary("ipamd"), config, args, env)
    }

    /// As `start_in`, running `binary` rather than this workspace's `ipamd` (another release's).
    pub fn start_binary(
        ns: &Netns,
        binary: &Path,
        config: &Path,
        args: &[&str],
        env: &[(&str, &Path)],
    ) -> Self {
        let mut command = ns.command(binary);
        for (key, value) in env {
            command.env(key, value);
        }
        Self::spawn(command, config, args)
    }

    /// `ipamd -c config ARGS` in the host's network namespace with `env` added: for a role that
    /// touches no network configuration (an operator) and talks to a server on loopback.
    pub fn start_on_host(config: &Path, args: &[&str], env: &[(&str, &Path)]) -> Self {
        let mut command = Command::new(workspace_binary("ipamd"));
        for (key, value) in env {
            command.env(key, value);
        }
        Self::spawn(command, config, args)
    }

    fn spawn(mut command: Command, config: &Path, args: &[&str]) -> Self {
        let log = config.with_extension(format!("{}.log", crate::unique("")));
        let file = std::fs::File::create(&log).expect("daemon log");
        let child = command
            .arg("--config")
            .arg(config)
            .args(args)
            .env("RUST_BACKTRACE", "0")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log fd"))
            .stderr(file)
            .spawn()
            .expect("spawn ipamd");
        Self { child, log }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), signal)
            .expect("signal the daemon");
    }

    /// SIGKILL, and wait until the process is gone; its log (the file goes).
    pub fn kill(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.log_text()
    }

    /// SIGTERM (a clean stop), and wait until the process is gone; its log (the file goes).
    pub fn terminate(mut self) -> String {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
        self.log_text()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log contains `text` (log lines trail the state they describe), or
    /// panics with the log after `timeout`.
    pub fn wait_log(&self, text: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let log = self.log_text();
            if log.contains(text) {
                return log;
            }
            assert!(
                Instant::now() < deadline,
                "the daemon never logged {text:?}; log:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `true` while the process runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Waits until the responder maps under `root` satisfy `done`, or panics after `timeout`.
pub fn wait_for_maps(
    root: &Path,
    timeout: Duration,
    what: &str,
    done: impl Fn(&ResponderMaps) -> bool,
) {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(maps) = ResponderMaps::from_pins(root)
            && done(&maps)
        {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
