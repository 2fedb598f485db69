//! One plugin invocation: environment + configuration in, (exit status, stdout) out. The binary
//! only wires process I/O to this function, so tests can run it in-process too.

use serde_json::Value;

use super::{
    invocation::{Command, Invocation, NetConf},
    result::{CniError, SUPPORTED_VERSIONS, code, ipam_result, version_result},
};
use crate::api::{
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
        stdout: Some(e.to_json(version)),
    }
}

pub fn run(get_env: impl Fn(&str) -> Option<String>, stdin: &[u8]) -> Outcome {
    let inv = match Invocation::from_env(&get_env) {
        Ok(inv) => inv,
        Err(e) => return failure(e, ""),
    };
    if inv.command == Command::Version {
        return Outcome {
            success: true,
            stdout: Some(version_result()),
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
            code::INCOMPATIBLE_VERSION,
            format!(
                "network {}: cniVersion {:?} is not supported; use one of {}",
                conf.name,
                conf.cni_version,
                SUPPORTED_VERSIONS.join(", ")
            ),
        ));
    }
    let ipam = conf.ipam()?;
    let call = |request: Request| -> Result<Response, CniError> {
        client::call(&ipam.socket, &request, ipam.timeout()).map_err(|e| match e {
            // The daemon is down or slow: the runtime should retry, not give up.
            ClientError::Unreachable { .. } | ClientError::Timeout { .. } => {
                CniError::new(code::TRY_AGAIN_LATER, e.to_string())
            }
            ClientError::Protocol { .. } => CniError::new(code::IO, e.to_string()),
        })
    };
    let attachment = || Attachment {
        id: inv.attachment(),
        pod: inv.pod(),
    };
    match inv.command {
        Command::Add => match call(Request::Allocate(attachment()))? {
            Response::Allocated { ips } => Ok(Some(ipam_result(&conf.cni_version, &ips))),
            other => Err(from_response(other)),
        },
        Command::Del => match call(Request::Release(attachment()))? {
            Response::Released { .. } => Ok(None),
            other => Err(from_response(other)),
        },
        Command::Check => match call(Request::Check(attachment()))? {
            Response::Checked { ips } => {
                check_against_prev_result(
                    conf,
                    &ips.iter()
                        .map(|i| format!("{}/{}", i.address, i.prefix_len))
                        .collect::<Vec<_>>(),
                )?;
                Ok(None)
            }
            other => Err(from_response(other)),
        },
        Command::Gc => {
            let valid = conf.valid_attachments.iter().map(Into::into).collect();
            match call(Request::Gc { valid })? {
                Response::Collected { .. } => Ok(None),
                other => Err(from_response(other)),
            }
        }
        Command::Status => match call(Request::Status) {
            Ok(Response::Ready) => Ok(None),
            Ok(Response::Error { message, .. }) => Err(CniError::new(code::NOT_AVAILABLE, message)),
            Ok(other) => Err(from_response(other)),
            Err(e) => Err(CniError::new(code::NOT_AVAILABLE, e.msg)),
        },
        Command::Version => unreachable!("answered before reading the configuration"),
    }
}

fn from_response(response: Response) -> CniError {
    match response {
        Response::Error { code: c, message } => CniError::new(
            match c {
                ErrorCode::NotReady => code::TRY_AGAIN_LATER,
                ErrorCode::BadRequest => code::INVALID_CONFIG,
                ErrorCode::Unknown => code::CHECK_FAILED,
                ErrorCode::Failed => code::ALLOCATION_FAILED,
            },
            message,
        ),
        other => CniError::new(code::IO, format!("unexpected answer from ipamd: {other:?}")),
    }
}

/// CHECK: the addresses the runtime recorded (prevResult) must be the ones ipamd holds.
fn check_against_prev_result(conf: &NetConf, held: &[String]) -> Result<(), CniError> {
    let Some(prev) = &conf.prev_result else {
        return Ok(());
    };
    let recorded: Vec<String> = prev["ips"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|ip| ip["address"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    for address in &recorded {
        if !held.contains(address) {
            return Err(CniError::new(
                code::CHECK_FAILED,
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
            br#"{"cniVersion":"1.0.0","name":"n","type":"ipam-cni"}"#,
        )
        .stdout
        .unwrap();
        assert_eq!(e["code"], 7);
        assert!(e["msg"].as_str().unwrap().contains("bridge or ptp"));
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
