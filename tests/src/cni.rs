//! Running CNI plugins exactly as a container runtime does: CNI_* environment variables, the
//! network configuration on stdin, the result or error object on stdout.

use std::{
    io::Write as _,
    path::Path,
    process::{Command, Stdio},
};

use serde_json::Value;

use crate::{netns::Netns, workspace_binary};

/// Debian's CNI plugins (containernetworking-plugins).
pub const DEBIAN_CNI: &str = "/usr/lib/cni";

/// Who a CNI call is for: the container, its interface, and the Kubernetes pod
/// (`namespace`, `name`) the runtime passes in `CNI_ARGS`.
pub struct CniTarget<'a> {
    pub container: &'a str,
    pub ifname: &'a str,
    pub pod: (&'a str, &'a str),
}

/// Runs `binary` with `command` for (`container`, `ifname`): in `node_ns` when given (as a
/// runtime on that node would), with `pod_ns` as CNI_NETNS. The pod is named after the
/// container, in namespace `default`. Returns (success, stdout JSON).
pub fn run_cni(
    binary: &Path,
    node_ns: Option<&Netns>,
    command: &str,
    container: &str,
    ifname: &str,
    pod_ns: Option<&Netns>,
    conf: &Value,
) -> (bool, Value) {
    let target = CniTarget {
        container,
        ifname,
        pod: ("default", container),
    };
    run_cni_for(binary, node_ns, command, &target, pod_ns, conf)
}

/// As `run_cni`, for a pod named by `target`.
pub fn run_cni_for(
    binary: &Path,
    node_ns: Option<&Netns>,
    command: &str,
    target: &CniTarget,
    pod_ns: Option<&Netns>,
    conf: &Value,
) -> (bool, Value) {
    let mut cmd = match node_ns {
        // Main plugins act in the node's namespace, as a runtime on the node would run them.
        Some(ns) => ns.command(binary),
        None => Command::new(binary),
    };
    let plugin_dir = workspace_binary("ipam-cni").parent().unwrap().to_owned();
    let (namespace, name) = target.pod;
    cmd.env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", target.container)
        .env("CNI_IFNAME", target.ifname)
        .env(
            "CNI_NETNS",
            pod_ns
                .map(|n| n.path().display().to_string())
                .unwrap_or_default(),
        )
        .env(
            "CNI_ARGS",
            format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name}"),
        )
        .env("CNI_PATH", format!("{}:{DEBIAN_CNI}", plugin_dir.display()))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("run CNI plugin");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(conf.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let json = if text.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(text.trim()).unwrap_or_else(|e| {
            panic!(
                "plugin printed non-JSON ({e}): {text}\nstderr: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
    };
    (out.status.success(), json)
}
