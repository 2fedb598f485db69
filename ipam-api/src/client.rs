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
    #[error(
        "ipamd at {socket} closed the connection before answering (it stopped or restarted \
         mid-request); try again once it is up"
    )]
    Disconnected { socket: PathBuf },
    #[error("ipamd at {socket} sent an answer that is not API version {API_VERSION}: {detail}")]
    Protocol { socket: PathBuf, detail: String },
}

/// Sends one request and waits at most `timeout` for the response.
pub fn call(socket: &Path, request: &Request, timeout: Duration) -> Result<Response, ClientError> {
    let unreachable = |source| ClientError::Unreachable {
        socket: socket.to_owned(),
        source,
    };
    let disconnected = || ClientError::Disconnected {
        socket: socket.to_owned(),
    };
    let timed_out = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => ClientError::Timeout {
            socket: socket.to_owned(),
            timeout,
        },
        std::io::ErrorKind::BrokenPipe
        | std::io::ErrorKind::ConnectionReset
        | std::io::ErrorKind::UnexpectedEof => disconnected(),
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
    // The daemon writes its answer as one line: anything shorter means it went away mid-answer.
    if !answer.ends_with('\n') {
        return Err(disconnected());
    }
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

#[cfg(test)]
mod tests {
    use std::{io::Read as _, os::unix::net::UnixListener};

    use super::*;

    /// A daemon that reads the request, then writes `answer` and goes away.
    fn one_shot_daemon(answer: &'static [u8]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("ipamd.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut byte = [0u8; 1];
            while stream.read(&mut byte).unwrap() == 1 && byte[0] != b'\n' {}
            stream.write_all(answer).unwrap();
        });
        (dir, socket)
    }

    #[test]
    fn a_daemon_gone_mid_request_is_a_disconnect_not_a_protocol_error() {
        for answer in [&b""[..], &b"{\"version\":1,\"body\":{\"res"[..]] {
            let (_dir, socket) = one_shot_daemon(answer);
            let e = call(&socket, &Request::Status, Duration::from_secs(5)).unwrap_err();
            assert!(
                matches!(e, ClientError::Disconnected { .. }),
                "{answer:?}: {e:?}"
            );
            assert!(e.to_string().contains("try again"), "{e}");
        }
    }

    #[test]
    fn a_complete_answer_of_another_version_is_a_protocol_error() {
        let (_dir, socket) = one_shot_daemon(b"{\"version\":9,\"body\":{\"result\":\"ready\"}}\n");
        let e = call(&socket, &Request::Status, Duration::from_secs(5)).unwrap_err();
        assert!(matches!(e, ClientError::Protocol { .. }), "{e:?}");
    }
}
