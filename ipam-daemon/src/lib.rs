//! The IPAM node daemon as a library: the binaries (`ipamd`, `ipamctl`), the tests and the
//! benchmarks all call these functions.

pub mod api;
pub mod backoff;
pub mod clock;
pub mod cni;
pub mod config;
pub mod daemon;
pub mod datapath;
pub mod ipam;
pub mod l2;
pub mod net;
pub mod store;
#[cfg(test)]
mod test_util;
