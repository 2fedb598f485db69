//! The BIRD routing daemon, run by the agent as its child: started with the node's
//! configuration, reconfigured in place (`birdc configure`), asked for its sessions, and
//! stopped with SIGTERM, on which BIRD closes every session with a Cease notification, so the
//! routers withdraw this node's routes at once instead of waiting for a hold timer; or, for a
//! restart of the agent (`[node] on_stop = "restart"`), with `birdc graceful restart`: no
//! Cease, routers with graceful restart keep the routes, and the next BIRD starts in recovery
//! (`bird -R`) and ends the restart with End-of-RIB.
//!
//! BIRD gets SIGTERM too if the agent itself dies (`PR_SET_PDEATHSIG`): a BIRD left behind
//! would keep advertising for a node whose agent no longer follows its Services. Routers that
//! keep routes across such a restart are what `gracefulRestart` on the peer is for.

use std::{
    collections::BTreeMap,
    io,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use ipam_config::BgpSettings;
use thiserror::Error;
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
};

use super::sessions::{self, Session};

#[derive(Debug, Error)]
pub enum BirdError {
    #[error(
        "cannot prepare BIRD's directory {dir}: {source}; check that [bgp] run_dir is writable"
    )]
    Directory { dir: PathBuf, source: io::Error },
    #[error(
        "cannot start BIRD ({bird}): {source}; install it (Debian: bird2) or set [bgp] bird to \
         its path"
    )]
    Spawn { bird: PathBuf, source: io::Error },
    #[error(
        "BIRD exited at start ({status}); its messages are in the log above (with no IPv4 \
         address on the node, BIRD cannot pick a router ID: set [bgp] router_id)"
    )]
    Exited { status: std::process::ExitStatus },
    #[error("BIRD did not open its control socket {socket} within {waited:?}")]
    NoSocket { socket: PathBuf, waited: Duration },
    #[error("cannot run {birdc} {command}: {source}")]
    Birdc {
        birdc: PathBuf,
        command: String,
        source: io::Error,
    },
    #[error("BIRD refused the configuration in {file}: {said}; this is a bug of ipamd: report it")]
    Refused { file: PathBuf, said: String },
    #[error("birdc {command} failed: {said}")]
    Control { command: String, said: String },
}

/// A running BIRD.
pub struct Bird {
    settings: BgpSettings,
    child: Child,
}

impl Bird {
    fn config_file(settings: &BgpSettings) -> PathBuf {
        settings.run_dir.join("bird.conf")
    }

    fn socket(settings: &BgpSettings) -> PathBuf {
        settings.run_dir.join("bird.ctl")
    }

    /// Left by a stop for a restart: the next BIRD starts in graceful restart recovery.
    fn restart_marker(settings: &BgpSettings) -> PathBuf {
        settings.run_dir.join("graceful-restart")
    }

    /// Starts BIRD with `config`; returns once it answers on its control socket.
    pub async fn start(settings: &BgpSettings, config: &str) -> Result<Self, BirdError> {
        let dir = &settings.run_dir;
        stop_stale(&dir.join("bird.pid")).await;
        let prepare = || -> io::Result<()> {
            std::fs::create_dir_all(dir)?;
            use std::os::unix::fs::PermissionsExt as _;
            // The configuration holds the peers' passwords.
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
            match std::fs::remove_file(Self::socket(settings)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            ipam_core::atomic_file::replace(&Self::config_file(settings), config.as_bytes())?;
            Ok(())
        };
        prepare().map_err(|source| BirdError::Directory {
            dir: dir.clone(),
            source,
        })?;
        // After a stop for a restart, BIRD starts in graceful restart recovery: it sends the
        // routers its routes and then End-of-RIB, which ends the restart for them.
        let recovering = Self::restart_marker(settings).exists();
        let mut child = Self::command(settings, recovering)
            .spawn()
            .map_err(|source| BirdError::Spawn {
                bird: settings.bird.clone(),
                source,
            })?;
        if let Some(stderr) = child.stderr.take() {
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    tracing::info!(speaker = "bird", "{line}");
                }
            });
        }
        let bird = Self {
            settings: settings.clone(),
            child,
        };
        bird.until_it_answers(recovering).await
    }

    /// BIRD's command line: in the foreground, its files in the run directory, killed with the
    /// agent.
    fn command(settings: &BgpSettings, recovering: bool) -> Command {
        let mut command = Command::new(&settings.bird);
        if recovering {
            command.arg("-R");
        }
        command
            .arg("-f")
            .arg("-c")
            .arg(Self::config_file(settings))
            .arg("-s")
            .arg(Self::socket(settings))
            .arg("-P")
            .arg(settings.run_dir.join("bird.pid"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(false);
        // SAFETY: prctl is async-signal-safe and touches nothing of the parent's.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        command
    }

    /// Waits until BIRD answers on its control socket (or exits, or 10 s pass).
    async fn until_it_answers(mut self, recovering: bool) -> Result<Self, BirdError> {
        let waited = Duration::from_secs(10);
        let deadline = tokio::time::Instant::now() + waited;
        loop {
            if let Some(status) = self.exited() {
                return Err(BirdError::Exited { status });
            }
            if self.birdc("show status").await.is_ok() {
                if recovering {
                    let _ = std::fs::remove_file(Self::restart_marker(&self.settings));
                    tracing::info!(
                        "BGP: BIRD resumes after a graceful restart: routers that kept this \
                         node's routes get them again, then End-of-RIB"
                    );
                }
                return Ok(self);
            }
            if tokio::time::Instant::now() > deadline {
                return Err(BirdError::NoSocket {
                    socket: Self::socket(&self.settings),
                    waited,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether BIRD has exited, and how.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Replaces the configuration; BIRD keeps every protocol whose configuration is unchanged.
    pub async fn configure(&self, config: &str) -> Result<(), BirdError> {
        let file = Self::config_file(&self.settings);
        ipam_core::atomic_file::replace(&file, config.as_bytes()).map_err(|source| {
            BirdError::Directory {
                dir: self.settings.run_dir.clone(),
                source,
            }
        })?;
        let said = self.birdc("configure").await?;
        // BIRD applies a configuration while protocols finish with the previous one, and
        // queues a newer one meanwhile: both are accepted.
        let accepted = [
            "Reconfigured",
            "Reconfiguration in progress",
            "Queueing new configuration",
        ];
        if accepted.iter().any(|a| said.contains(a)) {
            Ok(())
        } else {
            Err(BirdError::Refused {
                file,
                said: said.trim().replace('\n', " "),
            })
        }
    }

    /// Every BGP session, by protocol name.
    pub async fn sessions(&self) -> Result<BTreeMap<String, Session>, BirdError> {
        Ok(sessions::parse(&self.birdc("show protocols all").await?))
    }

    /// Stops BIRD: its sessions close with a Cease, the routers withdraw at once.
    pub async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
        match tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await {
            Ok(_) => tracing::info!("BIRD stopped; its sessions closed with a Cease"),
            Err(_) => {
                tracing::warn!("BIRD did not stop within 5 s of SIGTERM; killing it");
                let _ = self.child.kill().await;
            }
        }
    }

    /// Stops BIRD for a restart of the agent: no Cease, so routers with graceful restart keep
    /// this node's routes as stale for the restart time, and the next BIRD starts in recovery.
    /// Should BIRD refuse, it is stopped as for a leave.
    pub async fn stop_for_restart(mut self) {
        let marker = Self::restart_marker(&self.settings);
        if let Err(e) = std::fs::write(&marker, b"") {
            tracing::warn!(
                "cannot leave {} for the next BIRD ({e}): stopping BIRD as for a leave",
                marker.display()
            );
            return self.stop().await;
        }
        if let Err(e) = self.birdc("graceful restart").await {
            tracing::warn!("BIRD refused a graceful restart ({e}): stopping it as for a leave");
            let _ = std::fs::remove_file(&marker);
            return self.stop().await;
        }
        match tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await {
            Ok(_) => tracing::info!(
                "BIRD stopped for a restart: no Cease; routers with graceful restart keep this \
                 node's routes until the next agent resumes them"
            ),
            Err(_) => {
                tracing::warn!("BIRD did not stop within 5 s of a graceful restart; killing it");
                let _ = self.child.kill().await;
            }
        }
    }

    async fn birdc(&self, command: &str) -> Result<String, BirdError> {
        let output = Command::new(&self.settings.birdc)
            .arg("-s")
            .arg(Self::socket(&self.settings))
            .args(command.split_whitespace())
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|source| BirdError::Birdc {
                birdc: self.settings.birdc.clone(),
                command: command.to_owned(),
                source,
            })?;
        let said = String::from_utf8_lossy(&output.stdout).into_owned();
        if !output.status.success() || said.contains("Unable to connect") {
            return Err(BirdError::Control {
                command: command.to_owned(),
                said: format!(
                    "{}{}",
                    said.trim(),
                    String::from_utf8_lossy(&output.stderr).trim()
                ),
            });
        }
        Ok(said)
    }
}

/// Stops a BIRD a previous run of the agent left (it should have died with it).
async fn stop_stale(pidfile: &Path) {
    let Some(pid) = std::fs::read_to_string(pidfile)
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
    else {
        return;
    };
    let is_bird = std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .is_ok_and(|comm| comm.trim() == "bird");
    if is_bird {
        tracing::warn!(pid, "stopping a BIRD left by a previous run");
        // SAFETY: a signal to a process checked to be BIRD.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        // Time to close its sessions and its socket, without holding up the runtime.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
