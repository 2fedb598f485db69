//! A plain HTTP/1.0 client for the test kit: one request per connection, with why it failed
//! (which step, how, when) as the client saw it. The web pods of the cluster tests and the
//! agents' metrics endpoint are read through it.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    time::{Duration, Instant},
};

/// One HTTP request to `addr` on a new connection: the body (the answering pod's node).
pub fn http_get(addr: SocketAddr, timeout: Duration) -> Option<String> {
    http_get_or_why(addr, timeout).ok()
}

/// [`http_get`], or why it failed as the client saw it: at which step (connect, send, read),
/// how (timed out, refused, reset), and when within the request.
pub fn http_get_or_why(addr: SocketAddr, timeout: Duration) -> Result<String, String> {
    http_get_path(addr, "/", timeout)
}

/// As [`http_get_or_why`], for `path` (`/metrics`, say).
pub fn http_get_path(addr: SocketAddr, path: &str, timeout: Duration) -> Result<String, String> {
    let started = Instant::now();
    let failed = |step: &str, e: std::io::Error| {
        let how = match e.kind() {
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => "timed out".into(),
            std::io::ErrorKind::ConnectionRefused => "refused".into(),
            std::io::ErrorKind::ConnectionReset => "reset".into(),
            _ => e.to_string(),
        };
        format!("{step} {how} after {} ms", started.elapsed().as_millis())
    };
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| failed("connect", e))?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| failed("socket", e))?;
    s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
        .map_err(|e| failed("send", e))?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)
        .map_err(|e| failed("read", e))?;
    match answer.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.") && head.contains(" 200 ") => {
            Ok(body.trim().to_owned())
        }
        _ => Err(format!(
            "answer {:?} after {} ms",
            answer.lines().next().unwrap_or_default(),
            started.elapsed().as_millis()
        )),
    }
}
