//! The resource store over etcd v3, for clusters of many nodes: the same `Store` trait as the
//! embedded store, so the operator and the agents run on it unchanged.
//!
//! - `config`: the `[store.etcd]` section (endpoints, prefix, timeouts, TLS files);
//! - `store`: get, list, create, update-if-revision and delete as etcd transactions;
//! - `watch`: watches that resume after a broken stream and relist after a compaction;
//! - `error`: which endpoint failed and why (refused, TLS, credentials, timeout, no leader);
//! - `testing` (feature `testing`): real etcd members on loopback for tests and benchmarks.

pub mod config;
pub mod error;
pub mod store;
#[cfg(feature = "testing")]
pub mod testing;
mod watch;

pub use config::{EtcdConfig, TlsFiles};
pub use error::EtcdError;
pub use store::EtcdStore;
