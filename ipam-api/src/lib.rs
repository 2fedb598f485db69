//! The daemon's local API: a Unix socket only root can use, one JSON request and one JSON
//! response per connection. `ipam-cni` and `ipamctl` speak it through [`client`]; the daemon
//! serves it (`ipam_daemon::api`). Types are versioned ([`types::API_VERSION`]).
//!
//! This crate is deliberately small: no async runtime and no eBPF loader, so the CNI plugin that
//! links it starts fast.

pub mod client;
pub mod endpoint_table;
pub mod types;

/// Default path of the daemon's socket.
pub const DEFAULT_SOCKET: &str = "/run/ipam/ipamd.sock";
