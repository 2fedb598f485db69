//! The IPAM node daemon as a library: its binary (`ipamd`), the tests and the benchmarks all
//! call these functions. The configuration (`ipam-config`), the datapath (`ipam-datapath`) and
//! the store (`ipam-store`) are crates of their own, shared with `ipamctl`.
//!
//! From the top down (a module uses only those below it):
//! - `daemon`: the roles, wiring the controllers together and handling signals;
//! - the node's controllers, peers of each other: `pod_ipam` (pod addresses, the local API's
//!   allocations, the host network), `l2` (which Service IPs this node answers for, and
//!   answering ARP/NDP for them on the links), `bgp` (advertising them to routers),
//!   `liveness` (its lease, the fence, who else is alive), `routes` (routes to other nodes'
//!   pods), `endpoints` (the pods' interfaces as the datapath knows them); and the operator's,
//!   in `cluster::operator`;
//! - `node_record`: this node's record as the announcers read it (eligibility, its facts);
//! - `runtime`: the one loop every controller runs under (when it passes, backoff, spans,
//!   metrics);
//! - `cluster`: the store the daemon runs on, the watches that wake controllers, events;
//! - `api` (the local API's server), `metrics` (with the readiness checks);
//! - `net` (frames, raw sockets, the Service IPs on `lo`), `logging`, `clock`;
//! - `datapath_settings`: the configuration's words for the datapath mapped onto its own.

pub mod api;
pub mod bgp;
pub mod clock;
pub mod cluster;
pub mod daemon;
pub mod datapath_settings;
pub mod endpoints;
pub mod l2;
pub mod liveness;
pub mod logging;
pub mod metrics;
pub mod net;
pub mod node_record;
pub mod pod_ipam;
pub mod routes;
pub mod runtime;
