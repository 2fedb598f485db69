//! A blocking client of the local API with a deadline, for `ipam-cni` (which must never hang)
//! and `ipamctl`.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    time::Duration,
};

use thiserror::Error;

use super::types::{API_VERSION, Envelope, Request, Response};

#[derive(Debug, Error)]
pub enum ClientError {
    #[error(
        "cannot reach ipamd at {socket}: {source}; is the daemon running (and is this its \
         socket)? Try again once it is up"
    )]
    Unreachable {
        socket: PathBuf,
        source: std::io::Error,
    },
    #[error("ipamd at {socket} did not answer within {timeout:?}; try again later")]
    Timeout { socket: PathBuf, timeout: Duration },
    #[error("ipamd at {socket} sent an answer that is not API version {API_VERSION}: {detail}")]
    Protocol { socket: PathBuf, detail: String },
}

/// Sends one request and waits at most `timeout` for the response.
pub fn call(socket: &Path, request: &Request, timeout: Duration) -> Result<Response, ClientError> {
    let unreachable = |source| ClientError::Unreachable {
        socket: socket.to_owned(),
        source,
    };
    let timed_out = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => ClientError::Timeout {
            socket: socket.to_owned(),
            timeout,
        },
        _ => ClientError::Unreachable {
            socket: socket.to_owned(),
            source: e,
        },
    };
    let mut stream = UnixStream::connect(socket).map_err(unreachable)?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(unreachable)?;
    stream
        .set_write_timeout(Some(timeout))
        .map_err(unreachable)?;
    let mut line = serde_json::to_vec(&Envelope {
        version: API_VERSION,
        body: request,
    })
    .expect("requests serialise");
    line.push(b'\n');
    stream.write_all(&line).map_err(timed_out)?;
    let mut answer = String::new();
    BufReader::new(&stream)
        .read_line(&mut answer)
        .map_err(timed_out)?;
    let envelope: Envelope<Response> =
        serde_json::from_str(&answer).map_err(|e| ClientError::Protocol {
            socket: socket.to_owned(),
            detail: e.to_string(),
        })?;
    if envelope.version != API_VERSION {
        return Err(ClientError::Protocol {
            socket: socket.to_owned(),
            detail: format!("version {}", envelope.version),
        });
    }
    Ok(envelope.body)
}
