//! Serving the local API on a Unix socket that only root (or a configured group) can use.
//!
//! At start the socket's directory is created with mode 0700 or, when it exists, checked: it
//! must belong to root and not be writable by group or others (whoever can write there could put
//! their own socket in our place). The socket is bound inside a fresh directory of mode 0700,
//! given its mode (0600, or 0660 and the group with `[node] socket_group`), and only then
//! renamed into place: at no moment does a socket with a looser mode exist at the path. A live
//! socket of another daemon is never taken over.
//!
//! Every connection's peer is checked as well (`SO_PEERCRED`): root, the daemon's own user, or a
//! member of the configured group. The mode is the first gate; the check keeps a socket whose
//! mode was changed by hand, or a descriptor passed on, from serving anyone else.

use std::{
    os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    sync::Arc,
};

use thiserror::Error;
use tokio::{
    io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader},
    net::{UnixListener, UnixStream},
};

use ipam_api::types::{API_VERSION, Envelope, ErrorCode, Request, Response};

#[derive(Debug, Error)]
pub enum ServerError {
    #[error(
        "API socket directory {dir} is {why}; anyone able to write there could replace the \
         socket. Make it root-owned with mode 0700 (chown root {dir}; chmod 700 {dir}) or set \
         ipam.socket elsewhere"
    )]
    UnsafeDirectory { dir: PathBuf, why: String },
    #[error(
        "another ipamd is serving {socket}; stop it first, or give this one another ipam.socket"
    )]
    InUse { socket: PathBuf },
    #[error(
        "API socket group {gid} is not a group of this system; set [node] socket_group to \
         the gid of the group whose members may use ipamctl and ipam-cni, or leave it out \
         (root only)"
    )]
    NoSuchGroup { gid: u32 },
    #[error("cannot set up the API socket {socket}: {source}")]
    Io {
        socket: PathBuf,
        source: std::io::Error,
    },
}

/// Handles one request; runs on a blocking thread (allocations wait for fsync).
pub type Handler = Arc<dyn Fn(Request) -> Response + Send + Sync>;

/// Who may use the API besides root and the daemon's own user.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Access {
    /// Members of this group (by gid) may connect too.
    pub group: Option<u32>,
}

impl Access {
    /// The access `[node]` grants (`socket_group`).
    pub fn of(node: &ipam_config::NodeSettings) -> Self {
        Self {
            group: node.socket_group,
        }
    }
}

/// A bound socket and who may use it.
#[derive(Debug)]
pub struct Listener {
    listener: UnixListener,
    access: Access,
}

/// Binds the socket after the safety checks above.
pub fn bind(socket: &Path, access: Access) -> Result<Listener, ServerError> {
    let io = |source| ServerError::Io {
        socket: socket.to_owned(),
        source,
    };
    let dir = socket.parent().unwrap_or(Path::new("/"));
    if dir.exists() {
        let meta = std::fs::metadata(dir).map_err(io)?;
        let me = nix::unistd::geteuid().as_raw();
        if meta.uid() != 0 && meta.uid() != me {
            return Err(ServerError::UnsafeDirectory {
                dir: dir.to_owned(),
                why: format!("owned by uid {}", meta.uid()),
            });
        }
        if meta.mode() & 0o022 != 0 {
            return Err(ServerError::UnsafeDirectory {
                dir: dir.to_owned(),
                why: format!(
                    "writable by group or others (mode {:o})",
                    meta.mode() & 0o777
                ),
            });
        }
    } else {
        // Created with its mode: no moment with the umask's.
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io)?;
    }
    if let Some(gid) = access.group
        && nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid))
            .ok()
            .flatten()
            .is_none()
    {
        return Err(ServerError::NoSuchGroup { gid });
    }
    if socket.exists() {
        if std::os::unix::net::UnixStream::connect(socket).is_ok() {
            return Err(ServerError::InUse {
                socket: socket.to_owned(),
            });
        }
        // Left by a daemon that died: nobody listens.
        std::fs::remove_file(socket).map_err(io)?;
    }
    let listener = bind_privately(socket, access).map_err(io)?;
    Ok(Listener { listener, access })
}

/// Binds `socket` in a private directory beside it, sets its mode and group, and renames it
/// into place.
fn bind_privately(socket: &Path, access: Access) -> std::io::Result<UnixListener> {
    let dir = socket.parent().unwrap_or(Path::new("/"));
    let name = socket.file_name().unwrap_or_default().to_string_lossy();
    let private = dir.join(format!(".{name}.{}", std::process::id()));
    // A directory left by a daemon of the same pid that died before renaming.
    let _ = std::fs::remove_dir_all(&private);
    std::fs::DirBuilder::new().mode(0o700).create(&private)?;
    let staged = private.join("sock");
    let bound = (|| {
        let listener = UnixListener::bind(&staged)?;
        match access.group {
            Some(gid) => {
                nix::unistd::chown(&staged, None, Some(nix::unistd::Gid::from_raw(gid)))?;
                std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o660))?;
            }
            None => std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))?,
        }
        std::fs::rename(&staged, socket)?;
        Ok(listener)
    })();
    let _ = std::fs::remove_dir_all(&private);
    bound
}

/// Why a peer may not use the API, if it may not.
fn refused(peer: &tokio::net::unix::UCred, access: Access) -> Option<String> {
    let uid = peer.uid();
    if uid == 0 || uid == nix::unistd::geteuid().as_raw() {
        return None;
    }
    if let Some(gid) = access.group
        && (peer.gid() == gid || peer.pid().is_some_and(|pid| in_group(pid, gid)))
    {
        return None;
    }
    Some(match access.group {
        Some(gid) => format!(
            "uid {uid} is neither root nor a member of group {gid} ([node] socket_group): run \
             ipamctl as root or add the user to the group"
        ),
        None => format!(
            "uid {uid} is not root: run ipamctl as root, or set [node] socket_group to a group \
             of the users who may use it"
        ),
    })
}

/// Whether process `pid` holds `gid` among its supplementary groups (SO_PEERCRED names the
/// primary group only; the socket's mode lets every member in).
fn in_group(pid: i32, gid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|status| {
        status
            .lines()
            .find_map(|l| l.strip_prefix("Groups:"))
            .is_some_and(|groups| groups.split_whitespace().any(|g| g.parse() == Ok(gid)))
    })
}

/// Serves connections until the task is dropped.
pub async fn serve(listener: Listener, handler: Handler) {
    let Listener { listener, access } = listener;
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let refusal = match stream.peer_cred() {
                    Ok(peer) => refused(&peer, access),
                    Err(e) => Some(format!("its credentials cannot be read: {e}")),
                };
                let handler = handler.clone();
                tokio::spawn(async move {
                    let result = match refusal {
                        None => connection(stream, handler).await,
                        Some(why) => {
                            tracing::warn!("API connection refused: {why}");
                            refuse(stream, why).await
                        }
                    };
                    if let Err(e) = result {
                        tracing::debug!("API connection ended: {e}");
                    }
                });
            }
            Err(e) => {
                tracing::warn!("API accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

/// Answers a refused peer with why. Its request line is read first (at most 64 KiB, for at most
/// a second, and never handled): a client that is still writing when the answer comes and the
/// socket closes would see a broken pipe instead of the reason.
async fn refuse(stream: UnixStream, why: String) -> std::io::Result<()> {
    use tokio::io::AsyncReadExt as _;
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(1),
        BufReader::new(read.take(64 * 1024)).read_line(&mut line),
    )
    .await;
    let mut out = serde_json::to_vec(&Envelope {
        version: API_VERSION,
        body: Response::error(
            ErrorCode::BadRequest,
            format!("ipamd's API refused this connection: {why}"),
        ),
    })
    .expect("responses serialise");
    out.push(b'\n');
    write.write_all(&out).await
}

async fn connection(stream: UnixStream, handler: Handler) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    BufReader::new(read).read_line(&mut line).await?;
    let response = match serde_json::from_str::<Envelope<Request>>(&line) {
        Ok(envelope) if envelope.version == API_VERSION => {
            let body = envelope.body;
            let span = request_span(&body);
            tokio::task::spawn_blocking(move || span.in_scope(|| handler(body)))
                .await
                .unwrap_or_else(|e| Response::Error {
                    code: ErrorCode::Failed,
                    message: format!("request handler failed: {e}"),
                })
        }
        Ok(envelope) => Response::Error {
            code: ErrorCode::BadRequest,
            message: format!(
                "API version {} is not supported (this ipamd speaks {API_VERSION}); use the \
                 ipam-cni and ipamctl of the same release",
                envelope.version
            ),
        },
        Err(e) => Response::Error {
            code: ErrorCode::BadRequest,
            message: format!("request is not valid JSON for API version {API_VERSION}: {e}"),
        },
    };
    let mut out = serde_json::to_vec(&Envelope {
        version: API_VERSION,
        body: response,
    })
    .expect("responses serialise");
    out.push(b'\n');
    write.write_all(&out).await
}

/// The span a request is handled in: what it asks, and for which attachment (the container
/// and interface a CNI call names), so every log line of its handling says whose it was.
fn request_span(request: &Request) -> tracing::Span {
    let (op, attachment) = match request {
        Request::Allocate(a) => ("allocate", Some(&a.id)),
        Request::Release(a) => ("release", Some(&a.id)),
        Request::Check(a) => ("check", Some(&a.id)),
        Request::Gc { .. } => ("gc", None),
        Request::Status => ("status", None),
        Request::RegisterEndpoint(e) => ("register-endpoint", Some(&e.id)),
        Request::RemoveEndpoint(id) => ("remove-endpoint", Some(id)),
        Request::Endpoints => ("endpoints", None),
        Request::Members => ("members", None),
    };
    match attachment {
        Some(id) => tracing::info_span!(
            "api_request",
            op,
            container = id.container_id.as_str(),
            ifname = id.ifname.as_str()
        ),
        None => tracing::info_span!("api_request", op),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn refuses_unsafe_directories_and_live_sockets_and_replaces_stale_ones() {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path().join("api-dir");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let socket = dir.join("ipamd.sock");
        let e = bind(&socket, Access::default()).unwrap_err().to_string();
        assert!(
            e.contains("writable by group or others") && e.contains("chmod 700"),
            "{e}"
        );

        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let listener = bind(&socket, Access::default()).unwrap();
        let mode = std::fs::metadata(&socket).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600, "only root may connect");
        let e = bind(&socket, Access::default()).unwrap_err().to_string();
        assert!(e.contains("another ipamd"), "{e}");
        // Nothing of the private directory it was bound in is left.
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, [std::ffi::OsString::from("ipamd.sock")]);

        // The daemon died: its socket file stays, nobody listens; the next one takes over. (A
        // process another test spawns at that moment holds a copy of the listener between its
        // fork and its exec, and the socket then still answers: a few tries.)
        drop(listener);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while let Err(e) = bind(&socket, Access::default()) {
            assert!(std::time::Instant::now() < deadline, "{e}");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }

        // A directory that does not exist yet is created root-only.
        let fresh = temp.path().join("api-fresh");
        bind(&fresh.join("ipamd.sock"), Access::default()).unwrap();
        assert_eq!(std::fs::metadata(&fresh).unwrap().mode() & 0o777, 0o700);

        let e = bind(
            &temp.path().join("api-g/s.sock"),
            Access {
                group: Some(4_000_000_000),
            },
        )
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("group 4000000000 is not a group"), "{e}");
    }

    /// A peer that is neither root, the daemon's user nor in the group is answered with why,
    /// and its request never reaches the handler.
    #[tokio::test]
    async fn a_peer_that_may_not_use_the_api_is_refused_with_why() {
        let temp = tempfile::tempdir().unwrap();
        std::fs::set_permissions(temp.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let socket = temp.path().join("ipamd.sock");
        let listener = bind(&socket, Access::default()).unwrap();
        let served = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = served.clone();
        let handler: Handler = Arc::new(move |_| {
            seen.store(true, std::sync::atomic::Ordering::SeqCst);
            Response::Ready
        });
        tokio::spawn(serve(listener, handler));
        // Root (this test) is served.
        let root = ask(&socket).await;
        assert!(root.contains("\"ready\""), "{root}");
        // A process of another user (nobody) connects: the socket is opened to it by hand, as
        // if its mode had been loosened, and the peer check still refuses it.
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
        std::fs::set_permissions(temp.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        served.store(false, std::sync::atomic::Ordering::SeqCst);
        let out = tokio::task::spawn_blocking({
            let socket = socket.clone();
            move || {
                // Debian's python3 as the client: any program will do, run as nobody.
                let client = "import socket, sys\n\
                              s = socket.socket(socket.AF_UNIX)\n\
                              s.connect(sys.argv[1])\n\
                              s.sendall(b'{\"version\": 1, \"body\": {\"op\": \"status\"}}\\n')\n\
                              print(s.makefile().readline())";
                std::process::Command::new("setpriv")
                    .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
                    .args(["/usr/bin/python3", "-c", client])
                    .arg(&socket)
                    .output()
                    .expect("setpriv (util-linux) and python3 are on every machine of this kind")
            }
        })
        .await
        .unwrap();
        let printed = String::from_utf8_lossy(&out.stdout);
        assert!(
            printed.contains("uid 65534 is not root") && printed.contains("socket_group"),
            "{printed}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!served.load(std::sync::atomic::Ordering::SeqCst));
    }

    async fn ask(socket: &Path) -> String {
        let mut stream = UnixStream::connect(socket).await.unwrap();
        let request = serde_json::to_vec(&Envelope {
            version: API_VERSION,
            body: Request::Status,
        })
        .unwrap();
        stream.write_all(&request).await.unwrap();
        stream.write_all(b"\n").await.unwrap();
        let mut answer = String::new();
        BufReader::new(stream).read_line(&mut answer).await.unwrap();
        answer
    }
}
