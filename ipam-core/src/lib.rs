//! The IPAM engine: where every pod, router and service address comes from. A library of its
//! own, with no eBPF and no daemon in it, so its tests (property tests of the allocators
//! included) build and run with the stable toolchain alone.
//!
//! - `cidr`: CIDR arithmetic and the errors users see for bad ones;
//! - `pool`: pod IP pools, their validation and the rules for changing them;
//! - `blocks`: the operator side, cutting pools into per-node blocks;
//! - `node`: the agent side, handing out addresses inside a node's blocks;
//! - `store`: the resource store every controller is written against, and its stores;
//! - `backoff`: waiting for conditions that time fixes.

pub mod agent;
pub mod alloclog;
pub mod atomic_file;
pub mod backoff;
pub mod blocks;
pub mod cidr;
pub mod count;
pub mod durable;
pub mod infra;
pub mod lb;
pub mod multipool;
pub mod node;
pub mod operator;
pub mod owners;
pub mod pool;
pub mod resources;
pub mod spelling;
pub mod store;
#[cfg(test)]
mod test_util;

pub use cidr::{Cidr, CidrError, Family};
