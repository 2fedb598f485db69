//! The CNI plugin `ipam-cni` ("where does a CNI ADD land"), CNI spec 1.0.0 and 1.1.0 (results
//! also in 0.3.x/0.4.0 shape for older runtimes).
//!
//! This version works as an IPAM plugin: a main plugin (`bridge`, `ptp`, Multus setups) names
//! it in its `ipam` section and calls it with the same environment and configuration; it asks
//! `ipamd` over the local API for the attachment's addresses. Main-plugin mode (veth + TC
//! datapath) comes with the pod datapath.

pub mod invocation;
pub mod plugin;
pub mod result;
