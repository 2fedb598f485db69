//! A user's traffic through a Service IP: a backend on every node answering with the node's
//! name, and a client requesting an IP again and again, counting what failed. The BGP and L2
//! tests and the rollout benchmark judge a move or a restart by it: what the user's network
//! sees, not what the agents say.

use std::{
    io::{BufRead, BufReader, ErrorKind, Read, Write},
    net::{IpAddr, Ipv6Addr, SocketAddr, TcpListener, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use crate::{cluster::Cluster, failover, netns::Netns};

/// The port every backend listens on.
pub const PORT: u16 = 8080;
/// The port where every backend holds connections open, answering each line with its node's
/// name ([`HeldConnection`]).
pub const HELD_PORT: u16 = 8081;

/// A backend in each node's namespace: answers every connection with the node's name (on
/// [`PORT`]), and every line of a connection held open with it (on [`HELD_PORT`]).
pub struct Backends {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Backends {
    /// Every node's backend, listening when this returns.
    pub fn start(c: &Cluster) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = c
            .nodes
            .iter()
            .flat_map(|node| {
                let (name, stop) = (node.name.clone(), stop.clone());
                // `[::]` takes both families (IPv4 as mapped addresses).
                let (listener, held) = node.ns.run(|| {
                    let bind = |port| {
                        TcpListener::bind((Ipv6Addr::UNSPECIFIED, port)).expect("backend listens")
                    };
                    (bind(PORT), bind(HELD_PORT))
                });
                let serving = {
                    let (name, stop) = (name.clone(), stop.clone());
                    std::thread::spawn(move || failover::serve_on(listener, &name, &stop))
                };
                let holding = std::thread::spawn(move || hold_on(held, &name, &stop));
                [serving, holding]
            })
            .collect();
        Self { stop, threads }
    }

    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Backends {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Accepts connections on `listener` and answers every line of each with `node`, until `stop`.
fn hold_on(listener: TcpListener, node: &str, stop: &Arc<AtomicBool>) {
    listener.set_nonblocking(true).expect("non-blocking");
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((conn, _)) => {
                let (node, stop) = (node.to_owned(), stop.clone());
                std::thread::spawn(move || answer_lines(conn, &node, &stop));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

fn answer_lines(conn: TcpStream, node: &str, stop: &AtomicBool) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(Duration::from_millis(200)));
    let mut reader = BufReader::new(match conn.try_clone() {
        Ok(c) => c,
        Err(_) => return,
    });
    let mut writer = conn;
    let mut line = String::new();
    while !stop.load(Ordering::SeqCst) {
        match reader.read_line(&mut line) {
            Ok(0) => return,
            Ok(_) => {
                line.clear();
                if writer.write_all(format!("{node}\n").as_bytes()).is_err() {
                    return;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return,
        }
    }
}

/// A connection held open to a backend through a Service IP, as a client's long-lived
/// connection (a database session, a stream): asked again and again, each time answered by
/// the node holding it.
pub struct HeldConnection {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl HeldConnection {
    /// Opens one from `client` to `ip` ([`HELD_PORT`]).
    pub fn open(client: &Netns, ip: IpAddr) -> std::io::Result<Self> {
        let writer = client.run(move || {
            TcpStream::connect_timeout(&SocketAddr::new(ip, HELD_PORT), Duration::from_secs(1))
        })?;
        writer.set_read_timeout(Some(Duration::from_secs(1)))?;
        Ok(Self {
            reader: BufReader::new(writer.try_clone()?),
            writer,
        })
    }

    /// Asks once on the connection: the name of the node holding it, or why not.
    pub fn ask(&mut self) -> std::io::Result<String> {
        self.writer.write_all(b"?\n")?;
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(std::io::Error::new(
                ErrorKind::UnexpectedEof,
                "closed by the other end",
            ));
        }
        Ok(line.trim_end().to_owned())
    }
}

/// What a [`RequestLoop`] saw.
#[derive(Debug, Default)]
pub struct Requests {
    /// Requests answered, by the node that answered.
    pub answered: usize,
    /// Each failed request: when it was sent, from the loop's start, and why it failed.
    pub failed: Vec<Failed>,
    /// The node that answered each request in turn, with runs of the same node counted once:
    /// `[a, b, a]` is two moves.
    pub served_by: Vec<String>,
}

impl Requests {
    /// How many times the answering node changed.
    pub fn moves(&self) -> usize {
        self.served_by.len().saturating_sub(1)
    }

    /// The requests that failed other than by a reset of a connection in flight at a move:
    /// nobody answered, or the connection was refused.
    pub fn lost(&self) -> Vec<&Failed> {
        self.failed.iter().filter(|f| !f.reset_in_flight).collect()
    }

    /// The connections reset because they were in flight as the client followed the IP to
    /// another node.
    pub fn reset_in_flight(&self) -> usize {
        self.failed.iter().filter(|f| f.reset_in_flight).count()
    }
}

/// A request that failed.
#[derive(Debug, Clone)]
pub struct Failed {
    /// When it was sent, from the loop's start.
    pub at: Duration,
    /// Where it failed and the error.
    pub why: String,
    /// The connection was made and then reset: its packets went to two nodes, as when the
    /// client follows a gratuitous ARP to the IP's new owner between opening a connection to
    /// the old one and closing it, and the new owner, which knows no such connection, resets
    /// it. A sequential client has at most one such connection at each move.
    pub reset_in_flight: bool,
}

/// The client requesting an IP again and again until stopped, as a user's traffic would.
pub struct RequestLoop {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Requests>,
}

impl RequestLoop {
    /// Requests `ip` from `client` every `every` (each may take up to a second).
    pub fn start(client: &Netns, ip: IpAddr, every: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            client.spawn(move || {
                let start = Instant::now();
                let mut seen = Requests::default();
                while !stop.load(Ordering::SeqCst) {
                    let at = start.elapsed();
                    match try_request(ip, Duration::from_secs(1)) {
                        Ok(node) => {
                            seen.answered += 1;
                            if seen.served_by.last() != Some(&node) {
                                seen.served_by.push(node);
                            }
                        }
                        Err((why, reset_in_flight)) => seen.failed.push(Failed {
                            at,
                            why,
                            reset_in_flight,
                        }),
                    }
                    std::thread::sleep(every);
                }
                seen
            })
        };
        Self { stop, thread }
    }

    /// Stops; what was answered and what failed.
    pub fn stop(self) -> Requests {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().expect("request loop")
    }
}

/// One request to `ip`: the answering node's name.
pub fn request(ip: IpAddr, timeout: Duration) -> Option<String> {
    try_request(ip, timeout).ok()
}

/// One request to `ip`: the answering node's name, or where and why it failed and whether the
/// connection, once made, was reset ([`Failed::reset_in_flight`]).
pub fn try_request(ip: IpAddr, timeout: Duration) -> Result<String, (String, bool)> {
    let mut s = TcpStream::connect_timeout(&SocketAddr::new(ip, PORT), timeout)
        .map_err(|e| (format!("connect: {e}"), false))?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| (format!("read timeout: {e}"), false))?;
    let mut name = String::new();
    match s.read_to_string(&mut name) {
        Err(e) => {
            let reset = e.kind() == ErrorKind::ConnectionReset;
            let why = if name.is_empty() {
                format!("read: {e}")
            } else {
                format!("read: {e} after {name:?}")
            };
            Err((why, reset))
        }
        Ok(_) if name.is_empty() => Err(("closed with no answer".into(), false)),
        Ok(_) => Ok(name),
    }
}
