//! A user's traffic through a Service IP: a backend on every node answering with the node's
//! name, and a client requesting an IP again and again, counting what failed. The BGP and L2
//! tests and the rollout benchmark judge a move or a restart by it: what the user's network
//! sees, not what the agents say.

use std::{
    io::Read,
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

/// A backend in each node's namespace: answers every connection with the node's name.
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
            .map(|node| {
                let (name, stop) = (node.name.clone(), stop.clone());
                // `[::]` takes both families (IPv4 as mapped addresses).
                let listener = node.ns.run(|| {
                    TcpListener::bind((Ipv6Addr::UNSPECIFIED, PORT)).expect("backend listens")
                });
                std::thread::spawn(move || failover::serve_on(listener, &name, &stop))
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

/// What a [`RequestLoop`] saw.
#[derive(Debug, Default)]
pub struct Requests {
    /// Requests answered, by the node that answered.
    pub answered: usize,
    /// When each failed request was sent, from the loop's start.
    pub failed: Vec<Duration>,
    /// The node that answered each request in turn, with runs of the same node counted once:
    /// `[a, b, a]` is two moves.
    pub served_by: Vec<String>,
}

impl Requests {
    /// How many times the answering node changed.
    pub fn moves(&self) -> usize {
        self.served_by.len().saturating_sub(1)
    }
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
                    match request(ip, Duration::from_secs(1)) {
                        Some(node) => {
                            seen.answered += 1;
                            if seen.served_by.last() != Some(&node) {
                                seen.served_by.push(node);
                            }
                        }
                        None => seen.failed.push(at),
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
    let mut s = TcpStream::connect_timeout(&SocketAddr::new(ip, PORT), timeout).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    let mut name = String::new();
    s.read_to_string(&mut name).ok()?;
    (!name.is_empty()).then_some(name)
}
