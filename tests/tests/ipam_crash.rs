//! Crash safety of durable allocations with a real process: a worker allocates from several
//! threads and prints each acknowledgement; it is SIGKILLed at random points and restarted.
//! Every acknowledged allocation must still be there with the same address, acknowledged
//! releases must be gone, and no address may be held twice.

use std::{
    collections::{HashMap, HashSet},
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use ipam_tests::{TempFile, workspace_binary};
use rand::{Rng as _, SeedableRng as _, rngs::StdRng};

#[test]
fn every_acknowledged_allocation_survives_sigkill() {
    let state = TempFile::new("alloc-crash", "log");
    let worker = workspace_binary("alloc-worker");
    let mut rng = StdRng::seed_from_u64(u64::from(std::process::id()) ^ 0xc0ffee);
    // owner -> Some(ip) when acknowledged held, None when its release was acknowledged.
    let mut acked: HashMap<String, Option<String>> = HashMap::new();
    let mut total_acks = 0usize;

    for round in 0..6 {
        let mut child = Command::new(&worker)
            .args(["run", state.0.to_str().unwrap(), &round.to_string(), "8"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("start worker");
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
                .collect::<Vec<_>>()
        });
        let run_for = Duration::from_millis(150 + rng.random_range(0..600) as u64);
        let start = Instant::now();
        while start.elapsed() < run_for {
            std::thread::sleep(Duration::from_millis(10));
        }
        child.kill().expect("SIGKILL");
        let _ = child.wait();
        for line in reader.join().unwrap() {
            let mut parts = line.split_whitespace();
            match (parts.next(), parts.next(), parts.next()) {
                (Some("ACK"), Some(owner), Some(ip)) => {
                    acked.insert(owner.to_owned(), Some(ip.to_owned()));
                    total_acks += 1;
                }
                (Some("REL"), Some(owner), None) => {
                    acked.insert(owner.to_owned(), None);
                }
                _ => {} // a line cut by the kill
            }
        }

        let dump = Command::new(&worker)
            .args(["dump", state.0.to_str().unwrap()])
            .output()
            .expect("dump");
        assert!(
            dump.status.success(),
            "restart failed: {}",
            String::from_utf8_lossy(&dump.stderr)
        );
        let mut has: HashMap<String, String> = HashMap::new();
        let mut ips = HashSet::new();
        for line in String::from_utf8_lossy(&dump.stdout).lines() {
            let mut parts = line.split_whitespace().skip(1);
            let (owner, ip) = (parts.next().unwrap(), parts.next().unwrap());
            assert!(
                ips.insert(ip.to_owned()),
                "round {round}: {ip} is held twice"
            );
            has.insert(owner.to_owned(), ip.to_owned());
        }
        for (owner, state) in &acked {
            match state {
                Some(ip) => {
                    // A release in flight at the kill may or may not have landed (every fifth owner).
                    let releasable = owner
                        .rsplit('p')
                        .next()
                        .and_then(|i| i.parse::<u64>().ok())
                        .is_some_and(|i| i % 5 == 0);
                    match has.get(owner) {
                        Some(found) => {
                            assert_eq!(found, ip, "round {round}: {owner} changed address");
                        }
                        None => assert!(
                            releasable,
                            "round {round}: acknowledged {owner} {ip} was lost"
                        ),
                    }
                }
                None => assert!(
                    !has.contains_key(owner),
                    "round {round}: released {owner} came back"
                ),
            }
        }
    }
    assert!(
        total_acks > 500,
        "the worker made progress ({total_acks} acknowledgements)"
    );
}

/// The same guarantee with `ipamd` itself: 16 clients allocate over the daemon's API, the
/// daemon is SIGKILLed at random points and restarted, and every allocation it acknowledged is
/// still there with the same address, none held twice.
#[test]
fn ipamd_sigkilled_keeps_every_acknowledged_allocation() {
    use std::{
        sync::{
            Arc, Mutex,
            atomic::{AtomicBool, Ordering},
        },
        time::Duration,
    };

    use ipam_api::{
        client::call,
        types::{Attachment, AttachmentId, Request, Response},
    };
    use ipam_tests::ipam_node::IpamNode;

    let node = IpamNode::new("crashd", "10.96.0.0/12", 16);
    let socket = node.socket();
    let acked: Arc<Mutex<Vec<(AttachmentId, String)>>> = Arc::default();
    let mut rng = StdRng::seed_from_u64(u64::from(std::process::id()) ^ 0xdead);
    for round in 0..5 {
        let daemon = node.start_daemon();
        let stop = Arc::new(AtomicBool::new(false));
        let clients: Vec<_> = (0..16)
            .map(|c| {
                let (stop, acked, socket) = (stop.clone(), acked.clone(), socket.clone());
                std::thread::spawn(move || {
                    let mut i = 0;
                    while !stop.load(Ordering::SeqCst) {
                        let id = AttachmentId {
                            network: "podnet".into(),
                            container_id: format!("r{round}c{c}n{i}"),
                            ifname: "eth0".into(),
                        };
                        let request = Request::Allocate(Attachment {
                            ips: Vec::new(),
                            id: id.clone(),
                            pod: None,
                            pool: None,
                        });
                        // Errors (the daemon is gone) mean "not acknowledged": nothing to check.
                        if let Ok(Response::Allocated { ips }) =
                            call(&socket, &request, Duration::from_secs(2))
                        {
                            acked.lock().unwrap().push((id, ips[0].address.to_string()));
                        }
                        i += 1;
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(200 + rng.random_range(0..500) as u64));
        daemon.kill();
        stop.store(true, Ordering::SeqCst);
        for c in clients {
            c.join().unwrap();
        }
    }

    // Kept running (bound to the end of the test) while every acknowledgement is checked.
    let _daemon = node.start_daemon();
    let acked = acked.lock().unwrap();
    assert!(
        acked.len() > 200,
        "the clients made progress ({} acknowledgements)",
        acked.len()
    );
    let mut seen = HashSet::new();
    for (id, ip) in acked.iter() {
        let answer = call(
            &socket,
            &Request::Check(Attachment {
                ips: Vec::new(),
                id: id.clone(),
                pod: None,
                pool: None,
            }),
            Duration::from_secs(2),
        )
        .unwrap();
        let Response::Checked { ips } = answer else {
            panic!("acknowledged {id:?} {ip} was lost: {answer:?}");
        };
        assert_eq!(ips[0].address.to_string(), *ip, "{id:?} changed address");
        assert!(seen.insert(ip.clone()), "{ip} held twice");
    }
}
