//! A client asking "who has this IP?" again and again, recording every MAC that answers each
//! request: two MACs for one request is two nodes answering one IP.

use std::{
    net::Ipv4Addr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use crate::{netns::Netns, resolve::Resolver};

/// How long each request collects answers; a request goes out every this long.
pub const WINDOW: Duration = Duration::from_millis(40);

/// One request and its answers.
#[derive(Debug, Clone)]
pub struct ArpSample {
    /// When the request went out, from the watch's start.
    pub at: Duration,
    pub macs: Vec<[u8; 6]>,
}

pub struct ArpWatch {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<ArpSample>>,
}

impl ArpWatch {
    /// Starts asking for `ip` from `client`'s `eth0` as `sender`, timing from `start`.
    pub fn start(client: &Netns, sender: Ipv4Addr, ip: Ipv4Addr, start: Instant) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            client.spawn(move || {
                let resolver = Resolver::new("eth0");
                let mut samples = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    let at = start.elapsed();
                    let mut macs = resolver.arp_all(sender, ip, WINDOW);
                    macs.sort_unstable();
                    macs.dedup();
                    samples.push(ArpSample { at, macs });
                }
                samples
            })
        };
        Self { stop, thread }
    }

    /// Stops asking; every sample, oldest first.
    pub fn stop(self) -> Vec<ArpSample> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().expect("ARP watch")
    }
}

/// The requests two or more MACs answered.
pub fn double_answers(samples: &[ArpSample]) -> Vec<&ArpSample> {
    samples.iter().filter(|s| s.macs.len() > 1).collect()
}
