//! What went wrong talking to etcd, in the terms an operator acts on: which endpoint, and
//! whether it refused, failed TLS, refused the credentials or did not answer in time.

use std::error::Error as _;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum EtcdError {
    #[error(
        "{endpoint}: connection refused; is an etcd member running there and listening on that \
         port?"
    )]
    Refused { endpoint: String },
    #[error(
        "{endpoint}: TLS failed ({detail}); check that [store.etcd.tls] ca signed the \
         members' certificates and that cert and key are the client pair the members trust"
    )]
    Tls { endpoint: String, detail: String },
    #[error(
        "{endpoint}: credentials refused ({detail}); check the client certificate and the \
         etcd user's roles"
    )]
    Auth { endpoint: String, detail: String },
    #[error(
        "{endpoint}: no answer within {timeout_ms} ms; check that the members are up and \
         have a leader (a majority of them must be reachable)"
    )]
    Timeout { endpoint: String, timeout_ms: u64 },
    #[error(
        "{endpoint}: the cluster has no leader ({detail}); a majority of the members must \
         be up and reach each other"
    )]
    NoLeader { endpoint: String, detail: String },
    #[error("{endpoint}: {detail}")]
    Other { endpoint: String, detail: String },
    #[error(
        "no member could serve the request ({}); a majority of the members must be up and \
         reach each other",
        members.iter().map(|(m, e)| format!("{m}: {}", e.reason())).collect::<Vec<_>>().join("; ")
    )]
    Unavailable { members: Vec<(String, EtcdError)> },
    #[error("etcd configuration: {0}")]
    Config(String),
    #[error("cannot read {path}: {source}; check [store.etcd.tls]")]
    File {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

impl EtcdError {
    /// Sorts an etcd client error into the cases above. `endpoint` names what was asked (one
    /// member, or the list when the client balanced over all of them).
    pub fn classify(e: &etcd_client::Error, endpoint: &str, timeout_ms: u64) -> Self {
        let endpoint = endpoint.to_owned();
        let detail = chain(e);
        let lower = detail.to_lowercase();
        if let etcd_client::Error::GRpcStatus(status) = e {
            use tonic_code::*;
            match status.code() as i32 {
                UNAUTHENTICATED | PERMISSION_DENIED => return Self::Auth { endpoint, detail },
                DEADLINE_EXCEEDED => {
                    return Self::Timeout {
                        endpoint,
                        timeout_ms,
                    };
                }
                _ => {}
            }
        }
        if lower.contains("no leader") || lower.contains("leader changed") {
            Self::NoLeader { endpoint, detail }
        } else if lower.contains("connection refused") {
            Self::Refused { endpoint }
        } else if lower.contains("certificate")
            || lower.contains("tls")
            || lower.contains("handshake")
            || lower.contains("unknownissuer")
        {
            Self::Tls { endpoint, detail }
        } else if lower.contains("timed out") || lower.contains("timeout") {
            Self::Timeout {
                endpoint,
                timeout_ms,
            }
        } else {
            Self::Other { endpoint, detail }
        }
    }

    /// What went wrong in a few words, without the endpoint and the advice.
    pub fn reason(&self) -> String {
        match self {
            Self::Refused { .. } => "connection refused".into(),
            Self::Tls { detail, .. } => format!("TLS failed ({detail})"),
            Self::Auth { detail, .. } => format!("credentials refused ({detail})"),
            Self::Timeout { timeout_ms, .. } => format!("no answer within {timeout_ms} ms"),
            Self::NoLeader { .. } => "no leader".into(),
            Self::Other { detail, .. } => detail.clone(),
            other => other.to_string(),
        }
    }

    /// Worth trying again (another member may answer, or this one may come back).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Refused { .. }
                | Self::Timeout { .. }
                | Self::NoLeader { .. }
                | Self::Other { .. }
                | Self::Unavailable { .. }
        )
    }
}

/// gRPC status codes (the numbers are the protocol's, fixed by the gRPC specification).
mod tonic_code {
    pub(super) const DEADLINE_EXCEEDED: i32 = 4;
    pub(super) const PERMISSION_DENIED: i32 = 7;
    pub(super) const UNAUTHENTICATED: i32 = 16;
}

/// The error and all its causes on one line: transport errors hide the useful part (refused,
/// certificate unknown) a few sources down.
fn chain(e: &etcd_client::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}
