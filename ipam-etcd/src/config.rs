//! How to reach etcd: the `[store.etcd]` section of ipamd's configuration.

use std::{path::PathBuf, time::Duration};

use serde::Deserialize;

/// Where the cluster's state lives in etcd, and how to connect.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtcdConfig {
    /// Client URLs of the members (`http://host:2379`, or `https://…` with `tls`).
    pub endpoints: Vec<String>,
    /// Every key lives under this prefix, so several clusters (or tests) can share one etcd.
    #[serde(default = "default_prefix")]
    pub prefix: String,
    /// How long to wait for a connection to a member.
    #[serde(default = "default_dial_timeout_ms")]
    pub dial_timeout_ms: u64,
    /// How long one request may take before it counts as failed and is retried elsewhere.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    #[serde(default)]
    pub tls: Option<TlsFiles>,
}

/// PEM files for TLS with client certificates, as etcd's `--client-cert-auth` asks for.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    /// The CA that signed the members' serving certificates.
    pub ca: PathBuf,
    /// This client's certificate and key; both or neither.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// The name to check the members' certificates against, when it is not the endpoint's host.
    pub server_name: Option<String>,
}

fn default_prefix() -> String {
    "/ipam".to_owned()
}

fn default_dial_timeout_ms() -> u64 {
    2000
}

fn default_request_timeout_ms() -> u64 {
    3000
}

impl EtcdConfig {
    /// A configuration with the defaults, for `endpoints`.
    pub fn new(endpoints: Vec<String>) -> Self {
        Self {
            endpoints,
            prefix: default_prefix(),
            dial_timeout_ms: default_dial_timeout_ms(),
            request_timeout_ms: default_request_timeout_ms(),
            tls: None,
        }
    }

    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    pub fn dial_timeout(&self) -> Duration {
        Duration::from_millis(self.dial_timeout_ms)
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }

    /// The endpoints as one string, for messages.
    pub fn endpoint_list(&self) -> String {
        self.endpoints.join(",")
    }
}
