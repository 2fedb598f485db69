//! IP address management: where every pod, router and service address comes from.
//!
//! - `cidr`: CIDR arithmetic and the errors users see for bad ones;
//! - `pool`: pod IP pools, their validation and the rules for changing them;
//! - `blocks`: the operator side, cutting pools into per-node blocks;
//! - `node`: the agent side, handing out addresses inside a node's blocks.

pub mod agent;
pub mod alloclog;
pub mod blocks;
pub mod cidr;
pub mod durable;
pub mod infra;
pub mod multipool;
pub mod node;
pub mod operator;
pub mod owners;
pub mod pool;
pub mod resources;

pub use cidr::{Cidr, CidrError, Family};
