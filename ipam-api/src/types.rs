//! Request and response types of the local API (version 1).

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

pub use ipam_common::Family;

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
    /// Releases every pod allocation of `network` whose attachment is not in `valid` (CNI GC).
    /// Allocations of other networks are never touched: the runtime lists one network's
    /// attachments at a time.
    Gc {
        /// The CNI network being collected (its configuration's `name`); empty from plugins
        /// older than per-network attachments.
        #[serde(default)]
        network: String,
        valid: Vec<AttachmentId>,
    },
    /// Ready to serve ADD?
    Status,
    /// A pod interface was set up (CNI ADD, main plugin): program the datapath for it.
    RegisterEndpoint(Endpoint),
    /// A pod interface goes away (CNI DEL): forget it in the datapath. Idempotent.
    RemoveEndpoint(AttachmentId),
    /// The registered endpoints, with the datapath's counters (ipamctl).
    Endpoints,
    /// The gossip members as this node sees them (ipamctl members).
    Members,
}

/// A pod interface set up by the main plugin: its addresses and where it is attached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    #[serde(flatten)]
    pub id: AttachmentId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The pod's network namespace (CNI_NETNS).
    pub netns: String,
    /// The host side of the pod's veth pair.
    pub host_ifname: String,
    pub host_ifindex: u32,
    pub host_mac: Mac,
    /// MAC of the interface inside the pod.
    pub pod_mac: Mac,
    /// The pod's addresses on this interface (allocated by the daemon to this attachment).
    pub ips: Vec<IpAddr>,
}

/// A MAC address, written `aa:bb:cc:dd:ee:ff` in JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Mac(pub [u8; 6]);

impl std::fmt::Display for Mac {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl std::str::FromStr for Mac {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for byte in &mut out {
            let part = parts
                .next()
                .ok_or_else(|| format!("MAC {s:?} is too short"))?;
            *byte = u8::from_str_radix(part, 16)
                .map_err(|_| format!("MAC {s:?}: bad byte {part:?}"))?;
        }
        if parts.next().is_some() {
            return Err(format!("MAC {s:?} is too long"));
        }
        Ok(Self(out))
    }
}

impl Serialize for Mac {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Mac {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The identity CNI uses for an attachment: the network (the configuration's `name`), the
/// container and the interface in it.
///
/// Container and interface alone are unique among live attachments (an interface name is unique
/// in its network namespace), but a GC lists the attachments of one network only: without the
/// network, the GC of one network would free the addresses of every other.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachmentId {
    /// Empty for attachments made before they carried their network (see `legacy_owner`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub network: String,
    pub container_id: String,
    pub ifname: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attachment {
    #[serde(flatten)]
    pub id: AttachmentId,
    /// `namespace/name` of the pod when the runtime says (K8S_POD_NAMESPACE/K8S_POD_NAME): for
    /// logs and errors, and in multi-pool mode on Kubernetes for the pod's pool annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The pool the network configuration names (`"pool"`), multi-pool mode: what pods that
    /// name no pool by annotation take their address from instead of the node's pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// Addresses the runtime asks for (the CNI `ips` capability, `args.cni.ips` or CNI_ARGS
    /// `IP`), at most one per family; empty: the pod's annotations decide, else any address.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<IpAddr>,
}

impl AttachmentId {
    /// The owner key of the attachment's allocations: `<network>/<container id>/<ifname>`, or
    /// the legacy `<container id>/<ifname>` when the network is empty. None of the three holds
    /// a slash (CNI restricts network names, container ids and interface names).
    pub fn owner(&self) -> String {
        if self.network.is_empty() {
            self.legacy_owner()
        } else {
            format!("{}/{}/{}", self.network, self.container_id, self.ifname)
        }
    }

    /// The key the same attachment had before attachments carried their network. A daemon
    /// finding an allocation under it hands it to the first network that names the attachment.
    pub fn legacy_owner(&self) -> String {
        format!("{}/{}", self.container_id, self.ifname)
    }

    /// The inverse of `owner`, for pod allocations (infra owners have no slash).
    pub fn from_owner(owner: &str) -> Option<Self> {
        let mut parts = owner.split('/');
        let (network, container_id, ifname) =
            match (parts.next()?, parts.next()?, parts.next(), parts.next()) {
                (container, ifname, None, _) => ("", container, ifname),
                (network, container, Some(ifname), None) => (network, container, ifname),
                _ => return None,
            };
        Some(Self {
            network: network.to_owned(),
            container_id: container_id.to_owned(),
            ifname: ifname.to_owned(),
        })
    }

    /// This attachment in `network`.
    pub fn in_network(&self, network: &str) -> Self {
        Self {
            network: network.to_owned(),
            ..self.clone()
        }
    }
}

/// Why a CNI network name cannot be used: CNI allows `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`, and
/// the name is part of every allocation's key.
pub fn check_network_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')) {
        return Err(format!(
            "network name {name:?} is not a valid CNI network name: it must start with a letter \
             or digit and hold only letters, digits, '_', '.' and '-'; set \"name\" in the \
             network configuration"
        ));
    }
    Ok(())
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
    Allocated {
        ips: Vec<AllocatedIp>,
    },
    Released {
        ips: Vec<IpAddr>,
    },
    Checked {
        ips: Vec<AllocatedIp>,
    },
    Collected {
        released: Vec<AttachmentId>,
    },
    Ready,
    Registered,
    /// The endpoint that was removed, if there was one.
    EndpointRemoved {
        endpoint: Option<Endpoint>,
    },
    Endpoints {
        endpoints: Vec<Endpoint>,
        stats: Vec<(String, u64)>,
    },
    Members(GossipMembers),
    Error {
        code: ErrorCode,
        message: String,
    },
}

impl Response {
    /// An error answer.
    pub fn error(code: ErrorCode, message: impl Into<String>) -> Self {
        Self::Error {
            code,
            message: message.into(),
        }
    }
}

/// The gossip as one node sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GossipMembers {
    /// This node's gossip address, once it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    pub generation: u32,
    /// Why this node may not answer for its service IPs now; `None` while it may.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub silenced: Option<String>,
    pub members: Vec<GossipMember>,
    /// Node records whose gossip this node refuses, each with why and what to do: an address
    /// two records list, a key that cannot be read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<String>,
}

/// One member as this node sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GossipMember {
    /// The node whose record lists the member's address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    pub address: String,
    pub generation: u32,
    /// alive, suspect or down.
    pub state: String,
    /// How long ago a packet from it was last received here; `None`: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heard_ms: Option<u64>,
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

impl ErrorCode {
    /// As written on the wire (and in metrics' labels).
    pub const fn name(self) -> &'static str {
        match self {
            Self::NotReady => "not-ready",
            Self::BadRequest => "bad-request",
            Self::Unknown => "unknown",
            Self::Failed => "failed",
        }
    }
}
