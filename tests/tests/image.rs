//! The container image, checked with podman: its binaries start, and the agent DaemonSet's init
//! step, run from the image exactly as deploy/base/agent.yaml writes it with the ConfigMap of
//! deploy/base/config.yaml mounted, installs a working `ipam-cni` and the network configuration.
//!
//! Ignored by default: it needs an image, which `cargo xtask image` builds before it runs this
//! (with `IPAM_IMAGE` naming the image).

use std::process::{Command, Output};

use ipam_tests::{TempDir, deploy::documents};
use serde_json::Value;

fn image() -> String {
    std::env::var("IPAM_IMAGE").expect("IPAM_IMAGE names the image to check (cargo xtask image)")
}

/// `podman run --rm` of the image, with the runtime `cargo xtask image` uses. The limits are
/// set low on purpose: podman's defaults are above the current ones, and raising a limit needs
/// CAP_SYS_RESOURCE, which root does not have on the machines the tests run on.
fn podman_run(args: &[&str]) -> Output {
    let out = Command::new("podman")
        .args(["--runtime", "runc", "run", "--rm", "--network", "none"])
        .args([
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=1024:1024",
        ])
        .args(args)
        .output()
        .expect("run podman");
    assert!(
        out.status.success(),
        "podman run {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
#[ignore = "needs the image: cargo xtask image builds it and runs this"]
fn binaries_start_and_the_init_step_installs_the_cni_plugin() {
    let image = image();
    let version = text(&podman_run(&[&image, "--version"]));
    assert!(version.contains(env!("CARGO_PKG_VERSION")), "{version}");
    let help = text(&podman_run(&["--entrypoint", "ipamctl", &image, "--help"]));
    assert!(help.contains("Usage"), "{help}");

    // The ConfigMap's files, as the kubelet mounts them at /etc/ipam.
    let config = documents(&ipam_tests::deploy::dir().join("config.yaml"))
        .into_iter()
        .find(|d| d["kind"] == "ConfigMap")
        .expect("a ConfigMap in deploy/base/config.yaml");
    let dir = TempDir::new("image-");
    let (etc, bin, net) = (dir.0.join("etc"), dir.0.join("bin"), dir.0.join("net.d"));
    for d in [&etc, &bin, &net] {
        std::fs::create_dir_all(d).unwrap();
    }
    for (name, content) in config["data"].as_object().expect("data") {
        std::fs::write(etc.join(name), content.as_str().expect("text")).unwrap();
    }

    // The init container, as deploy/base/agent.yaml writes it.
    let daemonset = documents(&ipam_tests::deploy::dir().join("agent.yaml"))
        .into_iter()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("the agent DaemonSet");
    let init = &daemonset["spec"]["template"]["spec"]["initContainers"][0];
    let command: Vec<&str> = init["command"]
        .as_array()
        .into_iter()
        .chain(init["args"].as_array())
        .flatten()
        .map(|v| v.as_str().expect("a string"))
        .collect();
    let volume = |host: &std::path::Path, path: &str| format!("{}:{path}", host.display());
    let mut run: Vec<String> = Vec::new();
    for mount in init["volumeMounts"].as_array().expect("volumeMounts") {
        let path = mount["mountPath"].as_str().expect("mountPath");
        let host = match path {
            "/etc/ipam" => &etc,
            "/host/opt/cni/bin" => &bin,
            "/host/etc/cni/net.d" => &net,
            other => panic!("the init container mounts {other}, which this test does not know"),
        };
        run.extend(["-v".to_owned(), volume(host, path)]);
    }
    run.extend([
        "--entrypoint".to_owned(),
        command[0].to_owned(),
        image.clone(),
    ]);
    run.extend(command[1..].iter().map(|s| (*s).to_owned()));
    podman_run(&run.iter().map(String::as_str).collect::<Vec<_>>());

    // The network configuration is the ConfigMap's, and the plugin runs on the host (static).
    let conflist = std::fs::read_to_string(net.join("10-ipam.conflist")).expect("conflist");
    assert_eq!(
        conflist,
        config["data"]["10-ipam.conflist"].as_str().unwrap()
    );
    let out = Command::new(bin.join("ipam-cni"))
        .env("CNI_COMMAND", "VERSION")
        .output()
        .expect("run the installed ipam-cni");
    let version: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "ipam-cni VERSION: {e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(
        version["supportedVersions"]
            .as_array()
            .is_some_and(|v| v.iter().any(|v| v == "1.1.0")),
        "{version}"
    );
}
