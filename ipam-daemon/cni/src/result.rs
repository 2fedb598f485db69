//! CNI results and error objects, as JSON the runtime parses.

use serde_json::{Value, json};

use ipam_api::types::AllocatedIp;
use ipam_common::Family;

/// Versions whose results this plugin can produce.
pub const SUPPORTED_VERSIONS: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];
pub const LATEST: &str = "1.1.0";

/// A CNI error object: `code` (spec: 1-99 well-known, 100+ plugin-specific), message, details.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    pub details: String,
}

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>) -> Self {
        Self {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    pub fn to_json(&self, cni_version: &str) -> Value {
        json!({
            "cniVersion": if cni_version.is_empty() { LATEST } else { cni_version },
            "code": self.code,
            "msg": self.msg,
            "details": self.details,
        })
    }
}

/// Well-known CNI error codes used here.
pub mod code {
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    pub const IO: u32 = 5;
    pub const INVALID_CONFIG: u32 = 7;
    pub const TRY_AGAIN_LATER: u32 = 11;
    pub const NOT_AVAILABLE: u32 = 50;
    /// Plugin-specific: ipamd could not allocate (exhausted, store failure).
    pub const ALLOCATION_FAILED: u32 = 100;
    /// Plugin-specific: CHECK found no or other addresses.
    pub const CHECK_FAILED: u32 = 101;
}

/// The IPAM result of an ADD: addresses with their gateway, and a default route per family.
pub fn ipam_result(cni_version: &str, ips: &[AllocatedIp]) -> Value {
    let legacy = cni_version.starts_with("0.");
    let ip_entries: Vec<Value> = ips
        .iter()
        .map(|ip| {
            let mut entry = json!({ "address": format!("{}/{}", ip.address, ip.prefix_len) });
            if let Some(gw) = ip.gateway {
                entry["gateway"] = json!(gw.to_string());
            }
            if legacy {
                entry["version"] = json!(if ip.family == Family::V4 { "4" } else { "6" });
            }
            entry
        })
        .collect();
    let routes: Vec<Value> = ips
        .iter()
        .filter_map(|ip| {
            let gw = ip.gateway?;
            let dst = if ip.family == Family::V4 {
                "0.0.0.0/0"
            } else {
                "::/0"
            };
            Some(json!({ "dst": dst, "gw": gw.to_string() }))
        })
        .collect();
    json!({
        "cniVersion": cni_version,
        "ips": ip_entries,
        "routes": routes,
        "dns": {},
    })
}

pub fn version_result() -> Value {
    json!({ "cniVersion": LATEST, "supportedVersions": SUPPORTED_VERSIONS })
}
