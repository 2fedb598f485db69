//! The IPAM engine: where every pod, router and service address comes from. A library of its
//! own, with no eBPF and no daemon in it, so its tests (property tests of the allocators
//! included) build and run with the stable toolchain alone.
//!
//! The two kinds of address, each in its own folder, over shared foundations:
//! - `pod`: pod IPAM, pools cut into per-node blocks and addresses inside them (operator and
//!   node agent sides);
//! - `lb`: Service IPs, LB-IPAM (which Service gets which IP) and which node announces each;
//! - `l2`: which node answers each Service IP on its segment;
//! - `dead_nodes`: taking a dead node's pods out of their Services (agents' reports, the
//!   operator's marking);
//! - `resources`: the stored IPAM objects (pools, node records, the cluster configuration);
//!   the LoadBalancer objects are in `lb::resources`;
//! - `meta`: what every kind of object shares (label selectors, status conditions);
//! - `store`: the resource store every controller is written against, and its stores;
//! - `cidr`: CIDR arithmetic and the errors users see for bad ones;
//! - `count`: address counts beyond 64 bits, as JSON;
//! - `names`: object names as Kubernetes allows them, checked by every store;
//! - `spelling`: field names that changed, still read;
//! - `atomic_file`: files replaced whole;
//! - `backoff`: waiting for conditions that time fixes.

pub mod atomic_file;
pub mod backoff;
pub mod cidr;
pub mod count;
pub mod dead_nodes;
pub mod l2;
pub mod lb;
pub mod meta;
pub mod names;
pub mod pod;
pub mod resources;
pub mod spelling;
pub mod store;
#[cfg(test)]
mod test_util;

pub use cidr::{Cidr, CidrError, Family};
