//! TCP request/response and bulk throughput between two namespaces, for the datapath
//! benchmarks: one connection each, measured for a fixed time.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    time::{Duration, Instant},
};

use crate::netns::Netns;

/// How long each measurement runs.
pub const RUN: Duration = Duration::from_secs(3);
const CHUNK: usize = 128 * 1024;

/// Round trips per second from `client` to `server_ns` listening on `addr`.
pub fn tcp_rr(client: &Netns, server_ns: &Netns, addr: &str) -> f64 {
    let (port, server) = serve(server_ns, addr, |mut s| {
        let mut b = [0u8; 1];
        while s.read_exact(&mut b).is_ok() {
            if s.write_all(&b).is_err() {
                break;
            }
        }
        0
    });
    let target: SocketAddr = format!("{}:{port}", bracket(addr)).parse().unwrap();
    let rate = client.run(move || {
        let mut s = TcpStream::connect(target).expect("connect");
        s.set_nodelay(true).unwrap();
        let mut b = [1u8; 1];
        let start = Instant::now();
        let mut n = 0u64;
        while start.elapsed() < RUN {
            s.write_all(&b).unwrap();
            s.read_exact(&mut b).unwrap();
            n += 1;
        }
        n as f64 / start.elapsed().as_secs_f64()
    });
    server.join().unwrap();
    rate
}

/// Bytes per second received by `server_ns` from `client`.
pub fn throughput(client: &Netns, server_ns: &Netns, addr: &str) -> f64 {
    let (port, server) = serve(server_ns, addr, |mut s| {
        let mut buf = vec![0u8; CHUNK];
        let mut total = 0u64;
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 {
                break;
            }
            total += n as u64;
        }
        total
    });
    let target: SocketAddr = format!("{}:{port}", bracket(addr)).parse().unwrap();
    let elapsed = client.run(move || {
        let mut s = TcpStream::connect(target).expect("connect");
        let buf = vec![7u8; CHUNK];
        let start = Instant::now();
        while start.elapsed() < RUN {
            s.write_all(&buf).unwrap();
        }
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut rest = [0u8; 1];
        let _ = s.read(&mut rest);
        start.elapsed()
    });
    server.join().unwrap() as f64 / elapsed.as_secs_f64()
}

pub fn bracket(addr: &str) -> String {
    if addr.contains(':') {
        format!("[{addr}]")
    } else {
        addr.to_owned()
    }
}

/// A one-connection server in `ns` on `addr`: returns its port and the handler's result.
fn serve(
    ns: &Netns,
    addr: &str,
    handle: impl FnOnce(TcpStream) -> u64 + Send + 'static,
) -> (u16, std::thread::JoinHandle<u64>) {
    let bind = format!("{}:0", bracket(addr));
    let (tx, rx) = std::sync::mpsc::channel();
    let server = ns.spawn(move || {
        let listener = TcpListener::bind(&bind).expect("bind");
        tx.send(listener.local_addr().unwrap().port()).unwrap();
        let (s, _) = listener.accept().expect("accept");
        s.set_nodelay(true).unwrap();
        handle(s)
    });
    (rx.recv().unwrap(), server)
}

/// The median of `v` (the upper one for an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
