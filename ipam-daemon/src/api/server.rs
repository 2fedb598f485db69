//! Serving the local API on a Unix socket that only root can use.
//!
//! At start the socket's directory is created with mode 0700 or, when it exists, checked: it
//! must belong to root and not be writable by group or others (whoever can write there could put
//! their own socket in our place). The socket itself gets mode 0600. A live socket of another
//! daemon is never taken over.

use std::{
    os::unix::fs::{MetadataExt as _, PermissionsExt as _},
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
    #[error("cannot set up the API socket {socket}: {source}")]
    Io {
        socket: PathBuf,
        source: std::io::Error,
    },
}

/// Handles one request; runs on a blocking thread (allocations wait for fsync).
pub type Handler = Arc<dyn Fn(Request) -> Response + Send + Sync>;

/// Binds the socket after the safety checks above.
pub fn bind(socket: &Path) -> Result<UnixListener, ServerError> {
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
        std::fs::create_dir_all(dir).map_err(io)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io)?;
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
    let listener = UnixListener::bind(socket).map_err(io)?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
    Ok(listener)
}

/// Serves connections until the task is dropped.
pub async fn serve(listener: UnixListener, handler: Handler) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let handler = handler.clone();
                tokio::spawn(async move {
                    if let Err(e) = connection(stream, handler).await {
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

async fn connection(stream: UnixStream, handler: Handler) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    BufReader::new(read).read_line(&mut line).await?;
    let response = match serde_json::from_str::<Envelope<Request>>(&line) {
        Ok(envelope) if envelope.version == API_VERSION => {
            let body = envelope.body;
            tokio::task::spawn_blocking(move || handler(body))
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
        let e = bind(&socket).unwrap_err().to_string();
        assert!(
            e.contains("writable by group or others") && e.contains("chmod 700"),
            "{e}"
        );

        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let listener = bind(&socket).unwrap();
        let mode = std::fs::metadata(&socket).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600, "only root may connect");
        let e = bind(&socket).unwrap_err().to_string();
        assert!(e.contains("another ipamd"), "{e}");

        // The daemon died: its socket file stays, nobody listens; the next one takes over.
        drop(listener);
        bind(&socket).unwrap();

        // A directory that does not exist yet is created root-only.
        let fresh = temp.path().join("api-fresh");
        bind(&fresh.join("ipamd.sock")).unwrap();
        assert_eq!(std::fs::metadata(&fresh).unwrap().mode() & 0o777, 0o700);
    }
}
