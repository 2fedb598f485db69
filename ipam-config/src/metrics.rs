//! `[metrics]`: the Prometheus metrics and health endpoints.

use serde::Deserialize;

/// The `[metrics]` section: off unless `listen` is set (loopback is the usual choice; a
/// DaemonSet's probes reach the host's loopback).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSettings {
    /// Where to serve `/metrics`, `/healthz` and `/readyz`, e.g. `127.0.0.1:9963`.
    #[serde(default)]
    pub listen: Option<std::net::SocketAddr>,
}
