//! `cargo xtask bench alloc`: pod IP allocation on one node, and the operator's block logic.
//!
//! - in-memory allocations per second (NodeAllocator, 1,000,000 owners);
//! - durable allocations per second with 64 concurrent clients (acknowledged after the embedded
//!   database committed with fsync; concurrent requests share commits);
//! - cost of an allocate+release cycle at 1,000,000 live allocations versus at 1,000 (ratio,
//!   measured in the same run: it must not grow);
//! - heap bytes per live allocation (counted by the global allocator, bitmaps and owner names
//!   included);
//! - time for the operator logic to give blocks to 5,000 nodes.
//!
//! Last line: `alloc_per_s=<n> durable_alloc_per_s=<n> alloc_cost_ratio_1m_vs_1k=<f>
//! bytes_per_allocation=<n> blocks_5000_nodes_ms=<n>`.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use ipam_core::{
    Cidr, Family,
    pod::blocks::BlockAllocator,
    pod::durable::DurableAllocator,
    pod::node::NodeAllocator,
    pod::pool::{FamilySpec, PodIpPoolSpec, validate},
};
use ipam_tests::TempFile;

struct Counting;
static HEAP: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator and only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        HEAP.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HEAP.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        HEAP.fetch_add(new_size, Ordering::Relaxed);
        HEAP.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const MILLION: usize = 1_000_000;

/// A pod-like owner name: namespace/deployment-replicaset-suffix, as a runtime passes it.
fn owner(i: usize) -> String {
    format!("default/web-7d9f8c6b5-{i:06x} eth0")
}

fn node_with_big_block() -> NodeAllocator {
    let mut n = NodeAllocator::new("bench-node", "default");
    // A /11 holds 2M addresses: room for 1M live allocations plus churn.
    n.add_block("10.0.0.0/11".parse::<Cidr>().unwrap());
    n
}

fn main() {
    println!(
        "environment: {} CPUs",
        std::thread::available_parallelism()
            .map(std::num::NonZero::get)
            .unwrap_or(0)
    );

    // In memory, and bytes per live allocation.
    let owners: Vec<String> = (0..MILLION).map(owner).collect();
    let heap_before = HEAP.load(Ordering::Relaxed);
    let mut node = node_with_big_block();
    let start = Instant::now();
    for o in &owners {
        node.allocate(o, Family::V4).unwrap();
    }
    let elapsed = start.elapsed();
    let alloc_per_s = MILLION as f64 / elapsed.as_secs_f64();
    let bytes_per_allocation = (HEAP.load(Ordering::Relaxed) - heap_before) as f64 / MILLION as f64;
    println!(
        "in memory: {MILLION} allocations in {:.0} ms = {alloc_per_s:.0}/s",
        elapsed.as_secs_f64() * 1e3
    );
    println!(
        "heap per live allocation: {bytes_per_allocation:.1} bytes (owner names of {} bytes included)",
        owners[0].len()
    );

    // Cost per allocate+release cycle at 1M live versus 1k live, alternated over rounds.
    let mut small = node_with_big_block();
    for o in &owners[..1000] {
        small.allocate(o, Family::V4).unwrap();
    }
    // A middle point, past the CPU caches: shows whether cost keeps growing with size.
    let mut middle = node_with_big_block();
    for o in &owners[..100_000] {
        middle.allocate(o, Family::V4).unwrap();
    }
    let churn: Vec<String> = (0..200_000)
        .map(|i| format!("churn/pod-{i:06x} eth0"))
        .collect();
    let cycle = |n: &mut NodeAllocator| -> f64 {
        let start = Instant::now();
        for o in &churn {
            n.allocate(o, Family::V4).unwrap();
            n.release(o, Family::V4);
        }
        start.elapsed().as_nanos() as f64 / churn.len() as f64
    };
    let (mut at_1k, mut at_100k, mut at_1m) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..3 {
        at_1k.push(cycle(&mut small));
        at_100k.push(cycle(&mut middle));
        at_1m.push(cycle(&mut node));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (c1k, c100k, c1m) = (median(&mut at_1k), median(&mut at_100k), median(&mut at_1m));
    let ratio = c1m / c1k;
    println!(
        "allocate+release cycle: {c1k:.0} ns at 1,000 live, {c100k:.0} ns at 100,000, {c1m:.0} ns \
         at 1,000,000 (1M/1k {ratio:.2}, 1M/100k {:.2})",
        c1m / c100k
    );
    drop(node);
    drop(middle);
    drop(small);

    // Durable, 64 concurrent clients.
    let state = TempFile::new("bench-alloc", "log");
    let (durable, _) = DurableAllocator::open(&state.0, "bench-node", "default").unwrap();
    durable.add_block("10.64.0.0/12".parse().unwrap()).unwrap();
    let durable = Arc::new(durable);
    let run_for = Duration::from_secs(3);
    let start = Instant::now();
    let done = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for t in 0..64 {
            let (durable, done) = (&durable, &done);
            s.spawn(move || {
                let mut i = 0;
                while start.elapsed() < run_for {
                    durable
                        .allocate(&format!("c{t}/pod-{i}"), Family::V4)
                        .unwrap();
                    done.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            });
        }
    });
    let durable_per_s = done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
    let stats = durable.commit_stats();
    println!(
        "  {} commits, {:.1} changes per commit, {:.2} ms per commit, committing {:.0}% of the time",
        stats.commits,
        stats.changes as f64 / stats.commits.max(1) as f64,
        stats.busy.as_secs_f64() * 1e3 / stats.commits.max(1) as f64,
        100.0 * stats.busy.as_secs_f64() / start.elapsed().as_secs_f64()
    );
    println!(
        "durable, 64 clients: {} acknowledged in {:.1} s = {durable_per_s:.0}/s (fsync per shared commit)",
        done.load(Ordering::Relaxed),
        start.elapsed().as_secs_f64()
    );

    // Operator: blocks for 5,000 nodes.
    let pool = validate(
        "default",
        &PodIpPoolSpec {
            reserved: Vec::new(),
            reservations: Vec::new(),
            ipv4: Some(FamilySpec {
                cidrs: vec!["10.128.0.0/9".into()],
                mask_size: 24,
            }),
            ipv6: Some(FamilySpec {
                cidrs: vec!["fd00::/96".into()],
                mask_size: 120,
            }),
            namespaces: Vec::new(),
            namespace_selector: Default::default(),
            max_blocks_per_node: None,
        },
    )
    .unwrap();
    let mut blocks = BlockAllocator::new();
    blocks.upsert_pool(pool).unwrap();
    let start = Instant::now();
    for n in 0..5000 {
        let node = format!("node-{n}");
        blocks.ensure_one(&node, "default", Family::V4).unwrap();
        blocks.ensure_one(&node, "default", Family::V6).unwrap();
    }
    let blocks_ms = start.elapsed().as_secs_f64() * 1e3;
    println!("operator: dual-stack blocks for 5,000 nodes in {blocks_ms:.1} ms");

    println!(
        "alloc_per_s={alloc_per_s:.0} durable_alloc_per_s={durable_per_s:.0} alloc_cost_ratio_1m_vs_1k={ratio:.2} bytes_per_allocation={bytes_per_allocation:.0} blocks_5000_nodes_ms={blocks_ms:.1}"
    );
}
