//! The daemon's side of the local API: the socket server. The request and response types and the
//! client are the `ipam-api` crate, which `ipam-cni` links without the daemon.

pub mod server;
