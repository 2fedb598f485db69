//! CNI results and error objects: typed structures serialised to the JSON the runtime parses
//! (CNI spec, "Result" and "Error" sections).

use std::net::IpAddr;

use serde::{Deserialize, Serialize, Serializer};

use ipam_api::types::{AllocatedIp, Mac};
use ipam_common::Family;

/// Versions whose results this plugin can produce.
pub const SUPPORTED_VERSIONS: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];
pub const LATEST: &str = "1.1.0";

/// CNI error codes: 1-99 are the specification's, 100 and up this plugin's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    IncompatibleVersion = 1,
    /// A required environment variable is missing or wrong.
    InvalidEnvironment = 4,
    Io = 5,
    /// The network configuration is not valid JSON of the expected shape.
    Decoding = 6,
    InvalidConfig = 7,
    TryAgainLater = 11,
    /// STATUS: the plugin cannot serve ADD now.
    NotAvailable = 50,
    /// ipamd could not allocate (exhausted, store failure).
    AllocationFailed = 100,
    /// CHECK found no or other addresses.
    CheckFailed = 101,
}

impl Code {
    pub const fn number(self) -> u32 {
        self as u32
    }
}

impl Serialize for Code {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u32(self.number())
    }
}

/// A CNI error: `code`, message, details.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniError {
    pub code: Code,
    pub msg: String,
    pub details: String,
}

impl CniError {
    pub fn new(code: Code, msg: impl Into<String>) -> Self {
        Self {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    /// The error object printed on stdout.
    pub fn output<'a>(&'a self, cni_version: &'a str) -> ErrorOutput<'a> {
        ErrorOutput {
            cni_version: if cni_version.is_empty() {
                LATEST
            } else {
                cni_version
            },
            code: self.code,
            msg: &self.msg,
            details: &self.details,
        }
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorOutput<'a> {
    pub cni_version: &'a str,
    pub code: Code,
    pub msg: &'a str,
    pub details: &'a str,
}

/// The answer to VERSION.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VersionOutput {
    pub cni_version: &'static str,
    pub supported_versions: &'static [&'static str],
}

pub fn version_result() -> VersionOutput {
    VersionOutput {
        cni_version: LATEST,
        supported_versions: SUPPORTED_VERSIONS,
    }
}

/// The result of an ADD.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AddResult {
    pub cni_version: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<Interface>,
    pub ips: Vec<IpConfig>,
    pub routes: Vec<Route>,
    pub dns: Dns,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Interface {
    pub name: String,
    pub mac: Mac,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IpConfig {
    /// `address/prefix`.
    pub address: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    /// Index into `interfaces`, when the plugin made the interface.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interface: Option<usize>,
    /// `4` or `6`: results of spec versions before 1.0.0 carry it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<&'static str>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Route {
    pub dst: &'static str,
    pub gw: IpAddr,
}

/// No DNS settings: the runtime keeps its own.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Dns {}

/// The IPAM result of an ADD: addresses with their gateway, and a default route per family.
pub fn ipam_result(cni_version: &str, ips: &[AllocatedIp]) -> AddResult {
    let legacy = cni_version.starts_with("0.");
    AddResult {
        cni_version: cni_version.to_owned(),
        interfaces: Vec::new(),
        ips: ips
            .iter()
            .map(|ip| IpConfig {
                address: format!("{}/{}", ip.address, ip.prefix_len),
                gateway: ip.gateway,
                interface: None,
                version: legacy.then_some(match ip.family {
                    Family::V4 => "4",
                    Family::V6 => "6",
                }),
            })
            .collect(),
        routes: ips
            .iter()
            .filter_map(|ip| {
                Some(Route {
                    dst: match ip.family {
                        Family::V4 => "0.0.0.0/0",
                        Family::V6 => "::/0",
                    },
                    gw: ip.gateway?,
                })
            })
            .collect(),
        dns: Dns {},
    }
}

/// What CHECK reads of the result the runtime recorded (`prevResult`): the addresses. Every other
/// field is ignored, so results of any plugin version parse.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct PrevResult {
    #[serde(default)]
    pub ips: Vec<PrevIp>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct PrevIp {
    pub address: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(address: &str, prefix_len: u8, gateway: Option<&str>) -> AllocatedIp {
        let address: IpAddr = address.parse().unwrap();
        AllocatedIp {
            family: Family::of(address),
            address,
            prefix_len,
            gateway: gateway.map(|g| g.parse().unwrap()),
        }
    }

    #[test]
    fn ipam_results_have_the_spec_shape_in_every_version() {
        let ips = [
            ip("10.0.0.5", 24, Some("10.0.0.1")),
            ip("fd00::5", 120, None),
        ];
        let current = serde_json::to_value(ipam_result("1.1.0", &ips)).unwrap();
        assert_eq!(
            current,
            serde_json::json!({
                "cniVersion": "1.1.0",
                "ips": [
                    {"address": "10.0.0.5/24", "gateway": "10.0.0.1"},
                    {"address": "fd00::5/120"}
                ],
                "routes": [{"dst": "0.0.0.0/0", "gw": "10.0.0.1"}],
                "dns": {}
            })
        );
        let legacy = serde_json::to_value(ipam_result("0.4.0", &ips)).unwrap();
        assert_eq!(legacy["ips"][0]["version"], "4");
        assert_eq!(legacy["ips"][1]["version"], "6");
    }

    #[test]
    fn errors_print_their_number_and_a_version() {
        let e = CniError::new(Code::TryAgainLater, "ipamd is restarting");
        let printed = serde_json::to_value(e.output("")).unwrap();
        assert_eq!(
            printed,
            serde_json::json!({
                "cniVersion": LATEST, "code": 11, "msg": "ipamd is restarting", "details": ""
            })
        );
    }
}
