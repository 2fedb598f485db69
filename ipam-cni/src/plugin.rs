//! One plugin invocation: environment + configuration in, (exit status, stdout) out. The binary
//! only wires process I/O to this function, so tests can run it in-process too.

use serde_json::Value;

use crate::{
    invocation::{Command, Invocation, NetConf, PluginSettings, Role},
    pod_network,
    result::{CniError, Code, SUPPORTED_VERSIONS, ipam_result, version_result},
};
use ipam_api::{
    client::{self, ClientError},
    types::{Attachment, ErrorCode, Request, Response},
};

/// What the process prints and how it exits.
pub struct Outcome {
    pub success: bool,
    pub stdout: Option<Value>,
}

fn failure(e: CniError, version: &str) -> Outcome {
    Outcome {
        success: false,
        stdout: Some(printed(&e.output(version))),
    }
}

/// The JSON of a typed result, error or version answer.
fn printed(output: &impl serde::Serialize) -> Value {
    serde_json::to_value(output).expect("CNI outputs serialise")
}

pub fn run(get_env: impl Fn(&str) -> Option<String>, stdin: &[u8]) -> Outcome {
    let inv = match Invocation::from_env(&get_env) {
        Ok(inv) => inv,
        Err(e) => return failure(e, ""),
    };
    if inv.command == Command::Version {
        return Outcome {
            success: true,
            stdout: Some(printed(&version_result())),
        };
    }
    let conf = match NetConf::parse(stdin) {
        Ok(c) => c,
        Err(e) => return failure(e, ""),
    };
    let version = conf.cni_version.clone();
    match handle(&inv, &conf) {
        Ok(stdout) => Outcome {
            success: true,
            stdout,
        },
        Err(e) => failure(e, &version),
    }
}

fn handle(inv: &Invocation, conf: &NetConf) -> Result<Option<Value>, CniError> {
    if !SUPPORTED_VERSIONS.contains(&conf.cni_version.as_str()) {
        return Err(CniError::new(
            Code::IncompatibleVersion,
            format!(
                "network {}: cniVersion {:?} is not supported; use one of {}",
                conf.name,
                conf.cni_version,
                SUPPORTED_VERSIONS.join(", ")
            ),
        ));
    }
    let settings = conf.settings()?;
    if matches!(
        inv.command,
        Command::Add | Command::Del | Command::Check | Command::Gc
    ) {
        // The name keys every allocation of the network: GC frees only its own network's.
        ipam_api::types::check_network_name(&conf.name)
            .map_err(|why| CniError::new(Code::InvalidConfig, why))?;
    }
    let run = Run {
        inv,
        conf,
        network: conf.name.as_str(),
        requested: match inv.command {
            Command::Add => conf.requested_ips(inv)?,
            _ => Vec::new(),
        },
        main_mtu: match settings.role {
            Role::Main { mtu } => Some(mtu),
            Role::Ipam => None,
        },
        settings,
    };
    match inv.command {
        Command::Add => run.add(),
        Command::Del => run.del(),
        Command::Check => run.check(),
        Command::Gc => run.gc(),
        Command::Status => run.status(),
        Command::Version => unreachable!("answered before reading the configuration"),
    }
}

/// One invocation, carried out against the daemon's local API.
struct Run<'a> {
    inv: &'a Invocation,
    conf: &'a NetConf,
    /// The network's name, which keys its allocations.
    network: &'a str,
    settings: PluginSettings,
    /// The addresses the runtime asks for (ADD only).
    requested: Vec<std::net::IpAddr>,
    /// The pod interface's MTU when this is the main plugin; `None` as an IPAM plugin.
    main_mtu: Option<u32>,
}

impl Run<'_> {
    fn call(&self, request: Request) -> Result<Response, CniError> {
        client::call(&self.settings.socket, &request, self.settings.timeout).map_err(|e| match e {
            // The daemon is down, slow or went away mid-request: the runtime should retry,
            // not give up.
            ClientError::Unreachable { .. }
            | ClientError::Timeout { .. }
            | ClientError::Disconnected { .. } => CniError::new(Code::TryAgainLater, e.to_string()),
            ClientError::Protocol { .. } => CniError::new(Code::Io, e.to_string()),
        })
    }

    fn attachment(&self) -> Attachment {
        Attachment {
            id: self.inv.attachment(self.network),
            pod: self.inv.pod(),
            pool: self.settings.pool.clone(),
            ips: self.requested.clone(),
        }
    }

    /// ADD: the addresses; as the main plugin also the pod's interface and its endpoint in the
    /// datapath, undone if the datapath does not take it.
    fn add(&self) -> Result<Option<Value>, CniError> {
        let ips = match self.call(Request::Allocate(self.attachment()))? {
            Response::Allocated { ips } => ips,
            other => return Err(from_response(other)),
        };
        let cni_version = &self.conf.cni_version;
        let Some(mtu) = self.main_mtu else {
            return Ok(Some(printed(&ipam_result(cni_version, &ips))));
        };
        let id = self.inv.attachment(self.network);
        let netns = netns(self.inv)?;
        let iface = pod_network::set_up(&id, netns, mtu, &ips)?;
        let endpoint = pod_network::endpoint(self.inv, self.network, netns, &iface, &ips);
        match self.call(Request::RegisterEndpoint(endpoint)) {
            Ok(Response::Registered) => Ok(Some(printed(&pod_network::result(
                cni_version,
                netns,
                &iface,
                &ips,
            )))),
            other => {
                // The datapath does not know the pod: do not leave it half connected.
                let _ = pod_network::tear_down(&id);
                Err(match other {
                    Ok(response) => from_response(response),
                    Err(e) => e,
                })
            }
        }
    }

    /// DEL: the endpoint and interface (main plugin), then the addresses.
    fn del(&self) -> Result<Option<Value>, CniError> {
        if self.main_mtu.is_some() {
            let id = self.inv.attachment(self.network);
            match self.call(Request::RemoveEndpoint(id.clone()))? {
                Response::EndpointRemoved { .. } => {}
                other => return Err(from_response(other)),
            }
            pod_network::tear_down(&id)?;
        }
        match self.call(Request::Release(self.attachment()))? {
            Response::Released { .. } => Ok(None),
            other => Err(from_response(other)),
        }
    }

    /// CHECK: the daemon's addresses against the previous result, and the pod's interface.
    fn check(&self) -> Result<Option<Value>, CniError> {
        match self.call(Request::Check(self.attachment()))? {
            Response::Checked { ips } => {
                check_against_prev_result(
                    self.conf,
                    &ips.iter()
                        .map(|i| format!("{}/{}", i.address, i.prefix_len))
                        .collect::<Vec<_>>(),
                )?;
                if self.main_mtu.is_some() {
                    pod_network::check(&self.inv.attachment(self.network), netns(self.inv)?, &ips)?;
                }
                Ok(None)
            }
            other => Err(from_response(other)),
        }
    }

    /// GC: this network's allocations the runtime no longer lists are freed.
    fn gc(&self) -> Result<Option<Value>, CniError> {
        let valid = self
            .conf
            .valid_attachments
            .iter()
            .map(|v| v.in_network(self.network))
            .collect();
        match self.call(Request::Gc {
            network: self.network.to_owned(),
            valid,
        })? {
            Response::Collected { .. } => Ok(None),
            other => Err(from_response(other)),
        }
    }

    /// STATUS: whether the daemon can hand out addresses.
    fn status(&self) -> Result<Option<Value>, CniError> {
        match self.call(Request::Status) {
            Ok(Response::Ready) => Ok(None),
            Ok(Response::Error { message, .. }) => Err(CniError::new(Code::NotAvailable, message)),
            Ok(other) => Err(from_response(other)),
            Err(e) => Err(CniError::new(Code::NotAvailable, e.msg)),
        }
    }
}

/// CNI_NETNS, which the main plugin needs for ADD and CHECK.
fn netns(inv: &Invocation) -> Result<&str, CniError> {
    inv.netns.as_deref().ok_or_else(|| {
        CniError::new(
            Code::InvalidEnvironment,
            format!(
                "CNI_NETNS is not set; the runtime must pass the pod's network namespace for {:?}",
                inv.command
            ),
        )
    })
}

fn from_response(response: Response) -> CniError {
    match response {
        Response::Error { code: c, message } => CniError::new(
            match c {
                ErrorCode::NotReady => Code::TryAgainLater,
                ErrorCode::BadRequest => Code::InvalidConfig,
                ErrorCode::Unknown => Code::CheckFailed,
                ErrorCode::Failed => Code::AllocationFailed,
            },
            message,
        ),
        other => CniError::new(Code::Io, format!("unexpected answer from ipamd: {other:?}")),
    }
}

/// CHECK: the addresses the runtime recorded (prevResult) must be the ones ipamd holds.
fn check_against_prev_result(conf: &NetConf, held: &[String]) -> Result<(), CniError> {
    let Some(prev) = &conf.prev_result else {
        return Ok(());
    };
    let recorded: Vec<&str> = prev.ips.iter().map(|ip| ip.address.as_str()).collect();
    // Compare addresses only: the main plugin records host routes (/32, /128), the IPAM role
    // the block's prefix.
    let address_of = |a: &str| a.split('/').next().unwrap_or_default().to_owned();
    let held_addresses: Vec<String> = held.iter().map(|h| address_of(h)).collect();
    for address in recorded {
        if !held_addresses.contains(&address_of(address)) {
            return Err(CniError::new(
                Code::CheckFailed,
                format!(
                    "the attachment's recorded address {address} is not held by ipamd (it holds {})",
                    held.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn version_needs_no_configuration() {
        let out = run(env(&[("CNI_COMMAND", "VERSION")]), b"");
        assert!(out.success);
        assert_eq!(out.stdout.unwrap()["supportedVersions"][3], "1.0.0");
    }

    #[test]
    fn bad_invocations_get_error_objects_with_codes() {
        let out = run(env(&[("CNI_COMMAND", "ADD")]), b"{}");
        assert!(!out.success);
        let e = out.stdout.unwrap();
        assert_eq!(e["code"], 4);
        assert!(e["msg"].as_str().unwrap().contains("CNI_CONTAINERID"));

        let add = [
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_IFNAME", "eth0"),
        ];
        let e = run(env(&add), b"not json").stdout.unwrap();
        assert_eq!(e["code"], 6);
        let e = run(
            env(&add),
            br#"{"cniVersion":"1.0.0","name":"n","type":"bridge"}"#,
        )
        .stdout
        .unwrap();
        assert_eq!(e["code"], 7);
        assert!(e["msg"].as_str().unwrap().contains("bridge or ptp"));
        let e = run(
            env(&add),
            br#"{"cniVersion":"1.0.0","name":"n","type":"ipam-cni","ipam":{"type":"host-local"}}"#,
        )
        .stdout
        .unwrap();
        assert_eq!(e["code"], 7);
        assert!(
            e["msg"]
                .as_str()
                .unwrap()
                .contains("remove the \"ipam\" section")
        );
        let e = run(
            env(&add),
            br#"{"cniVersion":"9.9.9","name":"n","type":"bridge","ipam":{"type":"ipam-cni"}}"#,
        )
        .stdout
        .unwrap();
        assert_eq!(e["code"], 1);
    }

    #[test]
    fn daemon_down_is_try_again_later_at_once() {
        let add = [
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_IFNAME", "eth0"),
        ];
        let conf = br#"{"cniVersion":"1.0.0","name":"n","type":"bridge","ipam":{"type":"ipam-cni","socket":"/nonexistent/ipamd.sock"}}"#;
        let start = std::time::Instant::now();
        let out = run(env(&add), conf);
        assert!(start.elapsed() < std::time::Duration::from_secs(1));
        let e = out.stdout.unwrap();
        assert_eq!(e["code"], 11);
        assert!(
            e["msg"]
                .as_str()
                .unwrap()
                .contains("/nonexistent/ipamd.sock"),
            "{e}"
        );
    }
}
