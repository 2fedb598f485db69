//! What the runtime hands a CNI plugin: environment variables and the network configuration.

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use ipam_api::{DEFAULT_SOCKET, types::AttachmentId};
use serde::Deserialize;

use crate::result::{CniError, Code, PrevResult};

/// CNI_COMMAND values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Version,
    Gc,
    Status,
}

#[derive(Debug, Clone)]
pub struct Invocation {
    pub command: Command,
    pub container_id: Option<String>,
    pub ifname: Option<String>,
    /// CNI_NETNS: the pod's network namespace (a path).
    pub netns: Option<String>,
    /// CNI_ARGS, e.g. K8S_POD_NAMESPACE, K8S_POD_NAME.
    pub args: BTreeMap<String, String>,
}

/// Our section of the network configuration: `"ipam": {"type": "ipam-cni", ...}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IpamSection {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default = "default_socket")]
    pub socket: PathBuf,
    /// The plugin's deadline for an answer from ipamd.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Multi-pool mode: the pool this network's pods take addresses from.
    #[serde(default)]
    pub pool: Option<String>,
}

fn default_socket() -> PathBuf {
    PathBuf::from(DEFAULT_SOCKET)
}

fn default_timeout_ms() -> u64 {
    10_000
}

impl IpamSection {
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }
}

/// The parts of the network configuration the plugin uses.
#[derive(Debug, Clone, Deserialize)]
pub struct NetConf {
    #[serde(rename = "cniVersion", default)]
    pub cni_version: String,
    #[serde(default)]
    pub name: String,
    #[serde(rename = "type", default)]
    pub kind: String,
    pub ipam: Option<IpamSection>,
    /// Main-plugin mode: ipamd's API socket (default /run/ipam/ipamd.sock).
    #[serde(default)]
    pub socket: Option<PathBuf>,
    /// Main-plugin mode: the deadline for an answer from ipamd.
    #[serde(rename = "timeoutMs", default)]
    pub timeout_ms: Option<u64>,
    /// Main-plugin mode: MTU of the pod's interface and its host side (default 1500).
    #[serde(default)]
    pub mtu: Option<u32>,
    /// Main-plugin mode, multi-pool mode: the pool this network's pods take addresses from.
    #[serde(default)]
    pub pool: Option<String>,
    #[serde(rename = "prevResult", default)]
    pub prev_result: Option<PrevResult>,
    #[serde(rename = "cni.dev/valid-attachments", default)]
    pub valid_attachments: Vec<ValidAttachment>,
    /// What the runtime passes through capabilities: `ips` (fixed addresses).
    #[serde(rename = "runtimeConfig", default)]
    pub runtime_config: RuntimeConfig,
    /// Per-attachment arguments in the configuration (`args.cni.ips`, the CNI convention).
    #[serde(default)]
    pub args: Option<ConfArgs>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct RuntimeConfig {
    #[serde(default)]
    pub ips: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ConfArgs {
    #[serde(default)]
    pub cni: Option<CniArgs>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct CniArgs {
    #[serde(default)]
    pub ips: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ValidAttachment {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
}

impl ValidAttachment {
    /// The attachment in `network`, the network being collected.
    pub fn in_network(&self, network: &str) -> AttachmentId {
        AttachmentId {
            network: network.to_owned(),
            container_id: self.container_id.clone(),
            ifname: self.ifname.clone(),
        }
    }
}

impl Invocation {
    /// Reads the invocation from environment variables (`get` returns one by name).
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Self, CniError> {
        let command = match get("CNI_COMMAND").as_deref() {
            Some("ADD") => Command::Add,
            Some("DEL") => Command::Del,
            Some("CHECK") => Command::Check,
            Some("VERSION") => Command::Version,
            Some("GC") => Command::Gc,
            Some("STATUS") => Command::Status,
            other => {
                return Err(CniError::new(
                    Code::InvalidEnvironment,
                    format!(
                        "CNI_COMMAND is {}; it must be ADD, DEL, CHECK, VERSION, GC or STATUS",
                        other.map_or_else(|| "not set".to_owned(), |c| format!("{c:?}"))
                    ),
                ));
            }
        };
        let args = get("CNI_ARGS")
            .unwrap_or_default()
            .split(';')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let inv = Self {
            command,
            container_id: get("CNI_CONTAINERID").filter(|s| !s.is_empty()),
            ifname: get("CNI_IFNAME").filter(|s| !s.is_empty()),
            netns: get("CNI_NETNS").filter(|s| !s.is_empty()),
            args,
        };
        if matches!(command, Command::Add | Command::Del | Command::Check) {
            for (name, value) in [
                ("CNI_CONTAINERID", &inv.container_id),
                ("CNI_IFNAME", &inv.ifname),
            ] {
                if value.is_none() {
                    return Err(CniError::new(
                        Code::InvalidEnvironment,
                        format!("{name} is not set; the runtime must pass it for {command:?}"),
                    ));
                }
            }
        }
        Ok(inv)
    }

    /// The attachment of ADD/DEL/CHECK in `network` (the configuration's name); container and
    /// interface were checked present in `from_env`.
    pub fn attachment(&self, network: &str) -> AttachmentId {
        AttachmentId {
            network: network.to_owned(),
            container_id: self.container_id.clone().unwrap_or_default(),
            ifname: self.ifname.clone().unwrap_or_default(),
        }
    }

    /// `namespace/name` when the runtime passed the Kubernetes pod.
    pub fn pod(&self) -> Option<String> {
        Some(format!(
            "{}/{}",
            self.args.get("K8S_POD_NAMESPACE")?,
            self.args.get("K8S_POD_NAME")?
        ))
    }
}

impl NetConf {
    /// The addresses the runtime asks for: the `ips` capability, else `args.cni.ips`, else
    /// CNI_ARGS `IP` (comma-separated, as host-local reads it); prefix lengths are dropped.
    pub fn requested_ips(&self, inv: &Invocation) -> Result<Vec<std::net::IpAddr>, CniError> {
        let from_args = self
            .args
            .as_ref()
            .and_then(|a| a.cni.as_ref())
            .map(|c| c.ips.clone())
            .unwrap_or_default();
        let from_env: Vec<String> = inv
            .args
            .get("IP")
            .map(|v| v.split(',').map(str::to_owned).collect())
            .unwrap_or_default();
        let (source, items) = [
            ("runtimeConfig.ips", &self.runtime_config.ips),
            ("args.cni.ips", &from_args),
            ("CNI_ARGS IP", &from_env),
        ]
        .into_iter()
        .find(|(_, items)| !items.is_empty())
        .unwrap_or(("", &self.runtime_config.ips));
        items
            .iter()
            .map(|item| {
                parse_requested(item).ok_or_else(|| {
                    CniError::new(
                        Code::InvalidConfig,
                        format!(
                            "network {}: container {}: {source} holds {item:?}, which is not an \
                             IP address; give one address per family, as 10.0.5.7 or \
                             10.0.5.7/24",
                            self.name,
                            inv.container_id.as_deref().unwrap_or("?"),
                        ),
                    )
                })
            })
            .collect()
    }

    pub fn parse(stdin: &[u8]) -> Result<Self, CniError> {
        serde_json::from_slice(stdin).map_err(|e| {
            CniError::new(
                Code::Decoding,
                format!("the network configuration on stdin is not valid JSON: {e}"),
            )
        })
    }

    /// How the plugin is used, with its settings, or an error saying how to configure it.
    pub fn settings(&self) -> Result<PluginSettings, CniError> {
        if self.kind == "ipam-cni" {
            if let Some(ipam) = &self.ipam {
                return Err(CniError::new(
                    Code::InvalidConfig,
                    format!(
                        "network {}: as the main plugin, ipam-cni allocates addresses itself; \
                         remove the \"ipam\" section (type {:?})",
                        self.name, ipam.kind
                    ),
                ));
            }
            let mtu = self.mtu.unwrap_or(DEFAULT_MTU);
            if !(68..=65_535).contains(&mtu) {
                return Err(CniError::new(
                    Code::InvalidConfig,
                    format!(
                        "network {}: mtu {mtu} is out of range (68-65535)",
                        self.name
                    ),
                ));
            }
            return Ok(PluginSettings {
                role: Role::Main { mtu },
                socket: self.socket.clone().unwrap_or_else(default_socket),
                timeout: Duration::from_millis(self.timeout_ms.unwrap_or_else(default_timeout_ms)),
                pool: self.pool.clone(),
            });
        }
        match &self.ipam {
            Some(section) if section.kind == "ipam-cni" => Ok(PluginSettings {
                role: Role::Ipam,
                socket: section.socket.clone(),
                timeout: section.timeout(),
                pool: section.pool.clone(),
            }),
            _ => Err(CniError::new(
                Code::InvalidConfig,
                format!(
                    "network {}: no \"ipam\" section with \"type\": \"ipam-cni\"; use \
                     \"type\": \"ipam-cni\" for the whole network, or name it in the \"ipam\" \
                     section of a main plugin such as bridge or ptp",
                    self.name
                ),
            )),
        }
    }
}

/// One requested address, with or without a prefix length (the plugin does not link the
/// engine crate: the daemon checks the rest).
fn parse_requested(item: &str) -> Option<std::net::IpAddr> {
    let item = item.trim();
    item.split_once('/').map_or(item, |(a, _)| a).parse().ok()
}

/// MTU of pod interfaces when the configuration does not say.
pub const DEFAULT_MTU: u32 = 1500;

/// How the plugin is used in this network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `"type": "ipam-cni"`: creates the pod's interface and programs the datapath.
    Main { mtu: u32 },
    /// `"ipam": {"type": "ipam-cni"}` under another main plugin: addresses only.
    Ipam,
}

#[derive(Debug, Clone)]
pub struct PluginSettings {
    pub role: Role,
    pub socket: PathBuf,
    pub timeout: Duration,
    /// The pool the network names, if any.
    pub pool: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(conf: serde_json::Value) -> Result<PluginSettings, CniError> {
        NetConf::parse(conf.to_string().as_bytes())?.settings()
    }

    #[test]
    fn the_network_names_its_pool_in_either_role() {
        let main = settings(serde_json::json!({"name": "n", "type": "ipam-cni", "pool": "tenant"}))
            .unwrap();
        assert_eq!(main.pool.as_deref(), Some("tenant"));
        let delegated = settings(serde_json::json!({
            "name": "n", "type": "bridge", "ipam": {"type": "ipam-cni", "pool": "tenant"},
        }))
        .unwrap();
        assert_eq!(delegated.role, Role::Ipam);
        assert_eq!(delegated.pool.as_deref(), Some("tenant"));
        let none = settings(serde_json::json!({"name": "n", "type": "ipam-cni"})).unwrap();
        assert_eq!(none.pool, None);
    }

    #[test]
    fn an_ipam_section_under_the_main_plugin_is_refused_with_the_fix() {
        let e = settings(serde_json::json!({
            "name": "n", "type": "ipam-cni", "ipam": {"type": "host-local"},
        }))
        .unwrap_err();
        assert_eq!(
            e.msg,
            "network n: as the main plugin, ipam-cni allocates addresses itself; remove the \
             \"ipam\" section (type \"host-local\")"
        );
    }

    /// The runtime's fixed addresses: the `ips` capability first, then `args.cni.ips`, then
    /// CNI_ARGS `IP`; prefix lengths dropped; a value that is no address names the container.
    #[test]
    fn requested_addresses_come_from_the_runtime_in_cni_order() {
        let inv = |args: &[(&str, &str)]| Invocation {
            command: Command::Add,
            container_id: Some("c1".into()),
            ifname: Some("eth0".into()),
            netns: None,
            args: args
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        };
        let conf = |extra: serde_json::Value| {
            let mut c = serde_json::json!({"name": "n", "type": "ipam-cni"});
            c.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            NetConf::parse(c.to_string().as_bytes()).unwrap()
        };
        let ips = |v: &[&str]| -> Vec<std::net::IpAddr> {
            v.iter().map(|s| s.parse().unwrap()).collect()
        };
        let both = conf(serde_json::json!({
            "runtimeConfig": {"ips": ["10.0.5.7/24", "fd00::7/64"]},
            "args": {"cni": {"ips": ["10.0.5.8"]}},
        }));
        assert_eq!(
            both.requested_ips(&inv(&[("IP", "10.0.5.9")])).unwrap(),
            ips(&["10.0.5.7", "fd00::7"])
        );
        let args = conf(serde_json::json!({"args": {"cni": {"ips": ["10.0.5.8"]}}}));
        assert_eq!(args.requested_ips(&inv(&[])).unwrap(), ips(&["10.0.5.8"]));
        let none = conf(serde_json::json!({}));
        assert_eq!(
            none.requested_ips(&inv(&[("IP", "10.0.5.9,fd00::9")]))
                .unwrap(),
            ips(&["10.0.5.9", "fd00::9"])
        );
        assert!(none.requested_ips(&inv(&[])).unwrap().is_empty());
        let bad = conf(serde_json::json!({"runtimeConfig": {"ips": ["ten"]}}));
        let e = bad.requested_ips(&inv(&[])).unwrap_err();
        assert!(
            e.msg.contains("container c1")
                && e.msg.contains("runtimeConfig.ips")
                && e.msg.contains("\"ten\""),
            "{}",
            e.msg
        );
    }
}
