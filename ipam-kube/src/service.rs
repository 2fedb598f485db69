//! Kubernetes Services (core/v1) as the engine's `Service`, named `<namespace>/<name>`. The
//! engine only reads a Service's spec and writes its status (the IPs in
//! `status.loadBalancer.ingress`, and conditions); Services are created and changed with the
//! Kubernetes tools, never through this store.
//!
//! Annotations: `ipam-ebpf.io/ips` (comma-separated IPs asked for) and
//! `ipam-ebpf.io/sharing-key`. The deprecated `spec.loadBalancerIP` is honoured as one more IP
//! asked for.

use serde_json::{Value, json};

pub const IPS_ANNOTATION: &str = "ipam-ebpf.io/ips";
pub const SHARING_KEY_ANNOTATION: &str = "ipam-ebpf.io/sharing-key";

/// The engine's `{spec, status}` of a Service object.
pub(crate) fn to_engine(object: &Value) -> Value {
    let meta = &object["metadata"];
    let spec = &object["spec"];
    let annotations = &meta["annotations"];
    let mut requested: Vec<Value> = annotations[IPS_ANNOTATION]
        .as_str()
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|ip| !ip.is_empty())
        .map(|ip| json!(ip))
        .collect();
    if let Some(ip) = spec["loadBalancerIP"].as_str().filter(|ip| !ip.is_empty()) {
        requested.push(json!(ip));
        note_deprecated_ip(meta, ip);
    }
    let service_type = match spec["type"].as_str() {
        Some("LoadBalancer") => "LoadBalancer",
        Some("NodePort") => "NodePort",
        _ => "ClusterIP",
    };
    let families: Vec<Value> = spec["ipFamilies"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| match f.as_str() {
            Some("IPv4") => Some(json!("v4")),
            Some("IPv6") => Some(json!("v6")),
            _ => None,
        })
        .collect();
    let ports: Vec<Value> = spec["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| json!({ "port": p["port"], "protocol": p["protocol"].as_str().unwrap_or("TCP") }))
        .collect();
    let mut engine_spec = json!({
        "type": service_type,
        "labels": meta["labels"].as_object().cloned().unwrap_or_default(),
        "ports": ports,
        "requestedIPs": requested,
        "ipFamilies": families,
        "ipFamilyPolicy": spec["ipFamilyPolicy"].as_str().unwrap_or("SingleStack"),
        "externalIPs": spec["externalIPs"].as_array().cloned().unwrap_or_default(),
    });
    if let Some(class) = spec["loadBalancerClass"].as_str() {
        engine_spec["loadBalancerClass"] = json!(class);
    }
    if let Some(key) = annotations[SHARING_KEY_ANNOTATION].as_str() {
        engine_spec["sharingKey"] = json!(key);
    }
    let status = &object["status"];
    let ingress: Vec<Value> = status["loadBalancer"]["ingress"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i.get("ip").cloned())
        .collect();
    let mut engine_status = crate::conditions::to_engine(&json!({
        "conditions": status["conditions"].as_array().cloned().unwrap_or_default(),
    }));
    engine_status["ingress"] = json!(ingress);
    json!({ "spec": engine_spec, "status": engine_status })
}

/// Says once per Service and process that `spec.loadBalancerIP` is deprecated (Kubernetes
/// deprecated it in 1.24): it is honoured, and the annotation is the way to ask for IPs.
fn note_deprecated_ip(meta: &Value, ip: &str) {
    static NOTED: std::sync::Mutex<std::collections::BTreeSet<String>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let service = format!(
        "{}/{}",
        meta["namespace"].as_str().unwrap_or("default"),
        meta["name"].as_str().unwrap_or("")
    );
    if NOTED
        .lock()
        .is_ok_and(|mut noted| noted.insert(service.clone()))
    {
        tracing::warn!(
            service = service.as_str(),
            "Service {service} asks for {ip} in spec.loadBalancerIP, which Kubernetes deprecated: \
             it is honoured; use the annotation {IPS_ANNOTATION}: {ip} instead"
        );
    }
}

/// The Service status to write from the engine's: the ingress IPs and Kubernetes conditions
/// (times carried over from `current`, the object's status), the rest of `current` kept.
pub(crate) fn status_to_kubernetes(engine: &Value, current: &Value) -> Value {
    let conditions =
        crate::conditions::to_kubernetes(&json!({ "conditions": engine["conditions"] }), current);
    let mut status = if current.is_object() {
        current.clone()
    } else {
        json!({})
    };
    let ingress: Vec<Value> = engine["ingress"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|ip| json!({ "ip": ip, "ipMode": "VIP" }))
        .collect();
    status["loadBalancer"] = if ingress.is_empty() {
        json!({})
    } else {
        json!({ "ingress": ingress })
    };
    match conditions.get("conditions") {
        Some(c) => status["conditions"] = c.clone(),
        None => {
            if let Some(map) = status.as_object_mut() {
                map.remove("conditions");
            }
        }
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kubernetes_service_reads_as_the_engine_s_and_its_status_writes_back() {
        let object = json!({
            "metadata": {"name": "web", "namespace": "shop", "labels": {"app": "web"},
                "annotations": {"ipam-ebpf.io/ips": "10.77.0.10, 10.77.0.11", "ipam-ebpf.io/sharing-key": "k"}},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP", "targetPort": 8080}],
                "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack", "loadBalancerIP": "10.77.0.12"},
        });
        let engine = to_engine(&object);
        let spec: ipam_core::lb::resources::ServiceSpec =
            serde_json::from_value(engine["spec"].clone()).expect("the engine reads it");
        assert_eq!(spec.requested_ips.len(), 3);
        assert_eq!(spec.sharing_key.as_deref(), Some("k"));
        assert!(spec.is_ours());
        let status = status_to_kubernetes(
            &json!({"ingress": ["10.77.0.10"], "conditions": [{"type": "Ready", "status": true, "message": "assigned"}]}),
            &Value::Null,
        );
        assert_eq!(status["loadBalancer"]["ingress"][0]["ip"], "10.77.0.10");
        assert_eq!(status["conditions"][0]["status"], "True");
    }
}
