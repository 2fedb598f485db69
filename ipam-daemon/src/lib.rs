//! The IPAM node daemon as a library: the binaries (`ipamd`, `ipamctl`), the tests and the
//! benchmarks all call these functions.
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
//! - `cluster`: the store the daemon runs on, the watches that wake controllers, events;
//! - `config`, `api` (the local API's server), `metrics` (with the readiness checks);
//! - `datapath` (eBPF programs and maps), `net` (interfaces, frames, the Service IPs on `lo`),
//!   `logging`, `clock`.

pub mod api;
pub mod bgp;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod daemon;
pub mod datapath;
pub mod endpoints;
pub mod l2;
pub mod liveness;
pub mod logging;
pub mod metrics;
pub mod net;
pub mod node_record;
pub mod pod_ipam;
pub mod routes;
