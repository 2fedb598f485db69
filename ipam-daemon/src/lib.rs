//! The IPAM node daemon as a library: the binaries (`ipamd`, `ipamctl`), the tests and the
//! benchmarks all call these functions.

pub mod api;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod daemon;
pub mod datapath;
pub mod l2;
pub mod logging;
pub mod metrics;
pub mod net;
