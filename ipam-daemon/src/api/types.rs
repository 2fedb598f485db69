//! Request and response types of the local API (version 1).

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::ipam::Family;

/// Bumped on incompatible changes; the daemon refuses other versions with a clear error.
pub const API_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope<T> {
    pub version: u32,
    pub body: T,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Request {
    /// Addresses for one attachment (container + interface); idempotent.
    Allocate(Attachment),
    /// Releases an attachment's addresses; releasing nothing is not an error.
    Release(Attachment),
    /// Is the attachment's allocation there (CNI CHECK)?
    Check(Attachment),
    /// Releases every pod allocation whose attachment is not in `valid` (CNI GC).
    Gc { valid: Vec<AttachmentId> },
    /// Ready to serve ADD?
    Status,
}

/// The identity CNI uses for an attachment.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachmentId {
    pub container_id: String,
    pub ifname: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attachment {
    #[serde(flatten)]
    pub id: AttachmentId,
    /// `namespace/name` of the pod when the runtime says (K8S_POD_NAMESPACE/K8S_POD_NAME), for
    /// logs and errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
}

impl AttachmentId {
    /// The owner key of the attachment's allocations.
    pub fn owner(&self) -> String {
        format!("{}/{}", self.container_id, self.ifname)
    }

    /// The inverse of `owner`, for pod allocations (infra owners have no slash).
    pub fn from_owner(owner: &str) -> Option<Self> {
        let (container_id, ifname) = owner.rsplit_once('/')?;
        Some(Self {
            container_id: container_id.to_owned(),
            ifname: ifname.to_owned(),
        })
    }
}

/// One allocated address as CNI needs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocatedIp {
    pub family: Family,
    pub address: IpAddr,
    /// Prefix length of the node block the address comes from.
    pub prefix_len: u8,
    /// The node's router address of that family, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "kebab-case")]
pub enum Response {
    Allocated { ips: Vec<AllocatedIp> },
    Released { ips: Vec<IpAddr> },
    Checked { ips: Vec<AllocatedIp> },
    Collected { released: Vec<AttachmentId> },
    Ready,
    Error { code: ErrorCode, message: String },
}

/// Error kinds, mapped onto CNI error codes by the plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorCode {
    /// Try again later: restoring, or no block yet (CNI 11).
    NotReady,
    /// The request is wrong (CNI 7 / 4).
    BadRequest,
    /// The attachment has no allocation (CNI CHECK failure).
    Unknown,
    /// Out of addresses, store failure, ... (CNI 999 with the message).
    Failed,
}
