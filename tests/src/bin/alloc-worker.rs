//! A process that allocates pod addresses durably as fast as it can and prints each
//! acknowledgement, so a test can SIGKILL it at any point and check that every acknowledged
//! allocation survived. Not a user tool: the crash test drives it.
//!
//! `alloc-worker run <state-file> <round> <threads>`: allocate (and release every fifth owner)
//! until killed, printing `ACK <owner> <ip>` and `REL <owner>` once durable.
//! `alloc-worker dump <state-file>`: restore and print `HAS <owner> <ip>` for every allocation.

use std::{
    io::Write as _,
    path::PathBuf,
    sync::{Arc, Mutex},
};

use ipam_core::{Family, pod::durable::DurableAllocator};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: alloc-worker run <file> <round> <threads> | dump <file>";
    let path = PathBuf::from(args.get(2).expect(usage));
    let (alloc, _) = DurableAllocator::open(&path, "crash-node", "default").expect("open state");
    match args.get(1).map(String::as_str) {
        Some("dump") => {
            for (owner, ip) in alloc.with(ipam_core::pod::node::NodeAllocator::allocations) {
                println!("HAS {owner} {ip}");
            }
        }
        Some("run") => {
            let round: u32 = args.get(3).expect(usage).parse().expect("round");
            let threads: u32 = args.get(4).expect(usage).parse().expect("threads");
            if alloc.with(|a| a.blocks(Family::V4).is_empty()) {
                alloc
                    .add_block("10.128.0.0/14".parse().expect("cidr"))
                    .expect("block");
            }
            let alloc = Arc::new(alloc);
            let out = Arc::new(Mutex::new(std::io::stdout()));
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let (alloc, out) = (alloc.clone(), out.clone());
                    std::thread::spawn(move || {
                        for i in 0u64.. {
                            let owner = format!("r{round}t{t}/p{i}");
                            let ip = alloc.allocate(&owner, Family::V4).expect("allocate");
                            let mut o = out.lock().expect("stdout");
                            writeln!(o, "ACK {owner} {ip}").expect("write");
                            o.flush().expect("flush");
                            drop(o);
                            if i % 5 == 0 {
                                alloc.release(&owner, Family::V4).expect("release");
                                let mut o = out.lock().expect("stdout");
                                writeln!(o, "REL {owner}").expect("write");
                                o.flush().expect("flush");
                            }
                        }
                    })
                })
                .collect();
            for h in handles {
                let _ = h.join();
            }
        }
        _ => panic!("{usage}"),
    }
}
