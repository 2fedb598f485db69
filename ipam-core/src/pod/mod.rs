//! Pod IPAM: pod IP pools cut into per-node blocks by the operator, and addresses handed out
//! inside a node's blocks by its agent, durably.
//!
//! - `pool`: the pools users write, their validation, and the rules for changing one in use;
//! - `blocks`: the operator side, cutting pools into per-node blocks;
//! - `operator`: the operator's controller over pools and node records;
//! - `node`: the agent side, handing out addresses inside a node's blocks;
//! - `owners`: the node allocator's index from owner to address;
//! - `alloclog`, `durable`: the node's allocation log, and allocations acknowledged only once
//!   written;
//! - `agent`: the node agent's controller over its record and its allocator;
//! - `multipool`: which pool a pod's address comes from, and when a node asks for a block;
//! - `fixed`: the addresses a pod asks for (annotations, the CNI `ips` capability);
//! - `infra`: the router, health and ingress addresses a node needs before any pod;
//! - `published`: the status a node's agent publishes for `ipamctl ipam status`.

pub mod agent;
pub mod alloclog;
pub mod blocks;
pub mod durable;
pub mod fixed;
pub mod infra;
pub mod multipool;
pub mod node;
pub mod operator;
pub mod owners;
pub mod pool;
pub mod published;
