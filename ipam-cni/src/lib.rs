//! The CNI plugin `ipam-cni` ("where does a CNI ADD land"), CNI spec 1.0.0 and 1.1.0 (results
//! also in 0.3.x/0.4.0 shape for older runtimes).
//!
//! Two roles, chosen by the network configuration:
//! - main plugin (`"type": "ipam-cni"`): creates the pod's veth, addresses, routes and MTU, and
//!   registers the endpoint with `ipamd`, which programs the TC datapath (`pod_network`);
//! - IPAM plugin (`"ipam": {"type": "ipam-cni"}`): another main plugin (`bridge`, `ptp`, Multus
//!   setups) calls it for the attachment's addresses only.

pub mod invocation;
pub mod plugin;
pub mod pod_network;
pub mod result;
