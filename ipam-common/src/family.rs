//! The address family, the one vocabulary type every crate of the project shares: the engine
//! keys pools and blocks by it, the API carries it, the CNI plugin writes it into results.

use core::net::IpAddr;

/// IPv4 or IPv6. Written `v4` / `v6` in configuration files, resources and the local API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "lowercase")
)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum Family {
    V4,
    V6,
}

impl Family {
    /// Address width in bits.
    pub const fn bits(self) -> u8 {
        match self {
            Self::V4 => 32,
            Self::V6 => 128,
        }
    }

    pub const fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => Self::V4,
            IpAddr::V6(_) => Self::V6,
        }
    }

    /// `IPv4` / `IPv6`, for messages.
    pub const fn name(self) -> &'static str {
        match self {
            Self::V4 => "IPv4",
            Self::V6 => "IPv6",
        }
    }
}
