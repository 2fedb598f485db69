//! The manifests in deploy/, checked offline (no Kubernetes API server runs here): every
//! document parses and names itself, kustomize's files exist, the configurations in the
//! ConfigMaps are valid for ipamd, the CNI configuration names the plugin, and the workloads
//! refer to service accounts, config keys and mounts that exist. Which RBAC rights the operator
//! needs is checked against the requests it makes (tests/tests/kubernetes.rs); the CRDs against
//! the Rust types (ipam-kube/tests/crds.rs).

use ipam_tests::deploy::{dir as deploy, documents, overlay};
use serde_json::Value;

fn all_objects() -> Vec<Value> {
    let kustomization = &documents(&deploy().join("kustomization.yaml"))[0];
    kustomization["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .flat_map(|r| documents(&deploy().join(r.as_str().expect("a file name"))))
        .collect()
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in deploy/"))
}

#[test]
fn every_document_parses_and_names_itself() {
    let objects = all_objects();
    assert!(objects.len() > 15, "{}", objects.len());
    for o in &objects {
        assert!(
            o["apiVersion"].is_string()
                && o["kind"].is_string()
                && o["metadata"]["name"].is_string(),
            "{o}"
        );
    }
    // `kubectl apply -k deploy` installs the base.
    let top = &documents(&ipam_tests::deploy::root().join("kustomization.yaml"))[0];
    assert_eq!(top["resources"], serde_json::json!(["base"]));
    // Each overlay builds on the base (not on deploy/, which contains it: kustomize refuses
    // that cycle) and patches objects that exist.
    for name in ["example", "add-on"] {
        let dir = overlay(name);
        let k = &documents(&dir.join("kustomization.yaml"))[0];
        assert_eq!(k["resources"], serde_json::json!(["../../base"]), "{name}");
        for patch in k["patches"].as_array().unwrap() {
            let doc = &documents(&dir.join(patch["path"].as_str().unwrap()))[0];
            find(
                &objects,
                doc["kind"].as_str().unwrap(),
                doc["metadata"]["name"].as_str().unwrap(),
            );
        }
    }
}

/// The add-on overlay: both roles without `[ipam]` (LB-IPAM and L2 announcements only, on the
/// shared store), and an agent that installs no CNI plugin: its patch deletes the init
/// container and the CNI directories by name and mounts the agent's configuration alone. (What
/// kustomize makes of the patch was checked with `kubectl kustomize deploy/overlays/add-on`;
/// kubectl does not run here.)
#[test]
fn the_add_on_overlay_runs_no_pod_ipam_and_installs_no_cni() {
    let dir = overlay("add-on");
    let config = &documents(&dir.join("config.yaml"))[0];
    for key in ["operator.toml", "agent.toml"] {
        let file = ipam_tests::TempFile::new("deploy-add-on", "toml");
        std::fs::write(&file.0, config["data"][key].as_str().unwrap()).unwrap();
        let config = ipam_config::Config::load(&file.0).unwrap_or_else(|e| panic!("{key}: {e}"));
        assert!(config.is_add_on(), "{key}: no [ipam] on a shared store");
    }
    assert!(
        config["data"]["10-ipam.conflist"].is_null(),
        "the conflist is removed"
    );
    let agent = &documents(&dir.join("agent.yaml"))[0]["spec"]["template"]["spec"];
    assert_eq!(agent["initContainers"][0]["name"], "install-cni");
    assert_eq!(agent["initContainers"][0]["$patch"], "delete");
    let volumes = agent["volumes"].as_array().unwrap();
    for name in ["cni-bin", "cni-conf"] {
        assert!(
            volumes
                .iter()
                .any(|v| v["name"] == name && v["$patch"] == "delete"),
            "{name} deleted"
        );
    }
    let config_volume = volumes.iter().find(|v| v["name"] == "config").unwrap();
    assert_eq!(
        config_volume["configMap"]["items"],
        serde_json::json!([{ "key": "agent.toml", "path": "agent.toml" }])
    );
    // The base's agent container mounts no CNI directory itself: deleting the volumes leaves
    // no mount without its volume.
    let base = all_objects();
    let container =
        &find(&base, "DaemonSet", "ipam-agent")["spec"]["template"]["spec"]["containers"][0];
    for mount in container["volumeMounts"].as_array().unwrap() {
        assert!(
            !mount["name"].as_str().unwrap().starts_with("cni-"),
            "{mount}"
        );
    }
}

#[test]
fn configurations_are_valid_for_ipamd() {
    let base = all_objects();
    let overlay = documents(&overlay("example").join("config.yaml"));
    for config_map in [find(&base, "ConfigMap", "ipam-config"), &overlay[0]] {
        for key in ["operator.toml", "agent.toml"] {
            let text = config_map["data"][key]
                .as_str()
                .unwrap_or_else(|| panic!("no {key}"));
            let file = ipam_tests::TempFile::new("deploy-config", "toml");
            std::fs::write(&file.0, text).unwrap();
            let config =
                ipam_config::Config::load(&file.0).unwrap_or_else(|e| panic!("{key}: {e}"));
            assert!(config.store.kind.is_shared(), "{key}");
        }
    }
    let conflist: Value = serde_json::from_str(
        find(&base, "ConfigMap", "ipam-config")["data"]["10-ipam.conflist"]
            .as_str()
            .unwrap(),
    )
    .expect("the CNI configuration is JSON");
    assert_eq!(conflist["plugins"][0]["type"], "ipam-cni");
    assert_eq!(conflist["plugins"][0]["socket"], "/run/ipam/ipamd.sock");
}

#[test]
fn workloads_refer_to_what_exists() {
    let objects = all_objects();
    let config = find(&objects, "ConfigMap", "ipam-config");
    for (kind, name, account) in [
        ("DaemonSet", "ipam-agent", "ipam-agent"),
        ("Deployment", "ipam-operator", "ipam-operator"),
    ] {
        let spec = &find(&objects, kind, name)["spec"]["template"]["spec"];
        assert_eq!(spec["serviceAccountName"], account);
        find(&objects, "ServiceAccount", account);
        assert_eq!(spec["hostNetwork"], true, "{name}");
        for volume in spec["volumes"].as_array().unwrap() {
            for item in volume["configMap"]["items"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let key = item["key"].as_str().unwrap();
                assert!(
                    config["data"][key].is_string(),
                    "{name} mounts missing key {key}"
                );
            }
        }
    }
    let agent = &find(&objects, "DaemonSet", "ipam-agent")["spec"]["template"]["spec"];
    let container = &agent["containers"][0];
    let bpffs = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == "/sys/fs/bpf")
        .expect("bpffs mounted");
    assert_eq!(bpffs["mountPropagation"], "Bidirectional");
    assert_eq!(container["env"][0]["name"], "NODE_NAME");
    assert_eq!(
        container["env"][0]["valueFrom"]["fieldRef"]["fieldPath"],
        "spec.nodeName"
    );
    assert_eq!(agent["initContainers"][0]["name"], "install-cni");
    let operator = find(&objects, "Deployment", "ipam-operator");
    assert_eq!(operator["spec"]["replicas"], 2);
    // The admission policy keeps the agent's account to its own node's objects.
    let policy = find(&objects, "ValidatingAdmissionPolicy", "ipam-agent-own-node");
    assert!(
        policy["spec"]["matchConditions"][0]["expression"]
            .as_str()
            .unwrap()
            .contains("system:serviceaccount:ipam-system:ipam-agent")
    );
}

/// The agents gossip as deploy/ configures them: the key file is where the DaemonSet mounts
/// the Secret's key, the port is the one it declares, and the responders' timeout is below
/// the suspicion delay (the configuration check a node runs at start).
#[test]
fn the_agents_gossip_with_the_mounted_key_on_the_declared_port() {
    let objects = all_objects();
    let text = find(&objects, "ConfigMap", "ipam-config")["data"]["agent.toml"]
        .as_str()
        .unwrap()
        .to_owned();
    let file = ipam_tests::TempFile::new("deploy-agent", "toml");
    std::fs::write(&file.0, &text).unwrap();
    let config = ipam_config::Config::load(&file.0).unwrap();
    config.check_fencing(&file.0).unwrap();
    let gossip = config.gossip.expect("the agents gossip");
    let agent = &find(&objects, "DaemonSet", "ipam-agent")["spec"]["template"]["spec"];
    let container = &agent["containers"][0];
    let port = container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "gossip")
        .expect("the gossip port declared");
    assert_eq!(
        (port["containerPort"].as_u64(), port["protocol"].as_str()),
        (Some(u64::from(gossip.port)), Some("UDP"))
    );
    let mount = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| {
            gossip
                .key_file
                .starts_with(m["mountPath"].as_str().unwrap())
                && m["mountPath"] != "/etc/ipam"
        })
        .expect("the key file's directory is mounted");
    let volume = agent["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    assert_eq!(volume["secret"]["secretName"], "ipam-gossip");
    let item = &volume["secret"]["items"][0];
    assert_eq!(
        std::path::Path::new(mount["mountPath"].as_str().unwrap())
            .join(item["path"].as_str().unwrap()),
        gossip.key_file
    );
}

/// Every `ipam-ebpf.io/...` name a user reads in the README, docs/ or deploy/ is one the code
/// serves: the load-balancer class, an annotation, or the API group. A name that drifted (the
/// docs once named the class `ipam-ebpf.io/lb`) is a Service no one serves.
#[test]
fn every_project_name_in_the_docs_and_manifests_is_one_the_code_serves() {
    let served = [
        ipam_core::lb::resources::LB_CLASS.to_owned(),
        ipam_core::pod::multipool::POOL_ANNOTATION.to_owned(),
        ipam_core::pod::fixed::IP_ADDRESSES_ANNOTATION.to_owned(),
        ipam_kube::IPS_ANNOTATION.to_owned(),
        ipam_kube::SHARING_KEY_ANNOTATION.to_owned(),
        ipam_kube::SHARING_CROSS_NAMESPACE_ANNOTATIONS[0].to_owned(),
        ipam_kube::POOL_ANNOTATIONS[0].to_owned(),
        format!("{}/{}", ipam_kube::crd::GROUP, ipam_kube::crd::VERSION),
    ];
    let root = ipam_tests::deploy::root().join("..");
    let mut files = vec![root.join("README.md")];
    for dir in [
        "docs",
        "deploy",
        "deploy/base",
        "deploy/overlays/example",
        "deploy/overlays/add-on",
    ] {
        for entry in std::fs::read_dir(root.join(dir))
            .into_iter()
            .flatten()
            .flatten()
        {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "md" || e == "yaml") {
                files.push(path);
            }
        }
    }
    let mut seen = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for (at, _) in text.match_indices("ipam-ebpf.io/") {
            let name: String = text[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || "./-_".contains(*c))
                .collect();
            let name = name.trim_end_matches(['.', '-']);
            assert!(
                served.iter().any(|s| s == name),
                "{} names {name}, which the code does not serve (it serves {served:?})",
                file.display()
            );
            seen += 1;
        }
    }
    assert!(
        seen >= 5,
        "the docs name the class and the annotations ({seen} found)"
    );
}

/// A second `kubectl apply -k deploy` is a no-op only when the manifest already holds what the
/// API server defaults: kubectl replaces a list of rules as a whole, so a rule without the
/// `scope` the server fills in differs from the stored one on every apply. (What the server
/// defaults is Kubernetes' SetDefaults for admissionregistration/v1; a real API server is the
/// judge, this test keeps the manifest from losing the fields again.)
#[test]
fn the_admission_policy_spells_out_what_the_api_server_defaults() {
    let objects = all_objects();
    for name in ["ipam-agent-own-node", "ipam-agent-own-bgp-session"] {
        spells_out_the_defaults(find(&objects, "ValidatingAdmissionPolicy", name));
    }
}

fn spells_out_the_defaults(policy: &Value) {
    let constraints = &policy["spec"]["matchConstraints"];
    assert_eq!(constraints["matchPolicy"], "Equivalent");
    assert!(
        constraints["namespaceSelector"].is_object(),
        "{constraints}"
    );
    assert!(constraints["objectSelector"].is_object(), "{constraints}");
    let rules = constraints["resourceRules"]
        .as_array()
        .expect("resourceRules");
    assert!(!rules.is_empty());
    for rule in rules {
        assert_eq!(
            rule["scope"], "*",
            "a rule without the defaulted scope: {rule}"
        );
    }
    assert_eq!(policy["spec"]["failurePolicy"], "Fail");
}
