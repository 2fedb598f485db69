//! `cargo xtask bench failover`: how long a Service IP is unreachable when the node answering for
//! it loses power, and what the announcements cost the store, on one machine with real etcd and
//! real agents (docs/benchmarks.md):
//! - `failover_s`: power loss (agent SIGKILLed, link cut) to the client's first answered request
//!   again; the client requests every 50 ms. Median of 5 kills; the node comes back between.
//! - `failed_requests_pct`: failed requests from 5 s before to 30 s after each kill, all kills.
//! - `store_writes_per_s_1000_services`: etcd writes per second with 3 nodes and 1,000 services
//!   in steady state, counted by a watch on every key for 10 s.
//!
//! Last line: `failover_s=… failed_requests_pct=… store_writes_per_s_1000_services=…`

use std::time::Duration;

use ipam_core::lb::resources::{LbIpBlock, LbIpPool};
use ipam_tests::{
    cluster::{NODE_LEASE_MS, wait_until},
    failover::{FailoverRig, lb_service, segment_pool},
};

const KILLS: usize = 5;
const BEFORE: Duration = Duration::from_secs(5);
const AFTER: Duration = Duration::from_secs(30);
const SERVICES: usize = 1000;

fn main() {
    let mut rig = FailoverRig::start("bfo");
    println!(
        "3 nodes, node_lease_ms={NODE_LEASE_MS} (renewed every {} ms), liveness_timeout_ms=500; \
         service {} requested every 50 ms",
        NODE_LEASE_MS / 3,
        rig.ip
    );
    let figures = rig.measure_kills(KILLS, BEFORE, AFTER);
    let (failover, failed_pct) = (figures.failover_s, figures.failed_requests_pct);

    // 1,000 services over the 3 nodes (a second pool holds them; the segment's has 230).
    let bulk = LbIpPool {
        labels: Default::default(),
        spec: ipam_core::lb::resources::LbIpPoolSpec {
            blocks: vec![LbIpBlock {
                cidr: Some("10.78.0.0/22".into()),
                ..LbIpBlock::default()
            }],
            ..segment_pool().spec
        },
        status: Default::default(),
    };
    rig.cluster.put("bulk", &bulk);
    for i in 0..SERVICES {
        rig.cluster
            .put(&format!("bulk/svc-{i:04}"), &lb_service(80));
    }
    wait_until(
        Duration::from_secs(120),
        "1,000 services with IPs",
        || {
            rig.cluster
                .list::<ipam_core::lb::resources::Service>()
                .iter()
                .filter(|s| s.name.starts_with("bulk/") && !s.value.status.ingress.is_empty())
                .count()
                == SERVICES
        },
        || rig.cluster.operator_log(0),
    );
    std::thread::sleep(Duration::from_secs(3));
    let window = Duration::from_secs(10);
    let by_kind = rig.cluster.count_writes(|| std::thread::sleep(window));
    let writes: u64 = by_kind.values().sum();
    let per_s = writes as f64 / window.as_secs_f64();
    println!("steady state with {SERVICES} services, writes in {window:?} by kind: {by_kind:?}");
    println!(
        "median failover {failover:.2} s over {KILLS} kills; {failed_pct:.2} % of requests failed"
    );
    println!(
        "failover_s={failover:.2} failed_requests_pct={failed_pct:.2} \
         store_writes_per_s_1000_services={per_s:.1}"
    );
}
