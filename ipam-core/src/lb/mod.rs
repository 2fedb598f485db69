//! Service IPs: the load-balancer resources, LB-IPAM (which Service gets which IP), and which
//! node announces each IP.

pub mod annotations;
pub mod announce;
pub mod assign;
#[cfg(test)]
mod assign_tests;
pub mod bgp;
pub mod controller;
pub mod external;
#[cfg(test)]
pub(crate) mod fixtures;
pub mod resources;
pub mod rows;
