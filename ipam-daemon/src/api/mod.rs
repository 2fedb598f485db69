//! The daemon's local API: a Unix socket only root can use, one JSON request and one JSON
//! response per connection. `ipam-cni` and `ipamctl` speak it through `client`; the daemon
//! serves it with `server`. Types are versioned (`types::API_VERSION`).

pub mod client;
pub mod server;
pub mod types;

/// Default path of the daemon's socket.
pub const DEFAULT_SOCKET: &str = "/run/ipam/ipamd.sock";
