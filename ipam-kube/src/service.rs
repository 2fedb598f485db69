//! Kubernetes Services (core/v1) as the engine's `Service`, named `<namespace>/<name>`. The
//! engine only reads a Service's spec and writes its status (the IPs in
//! `status.loadBalancer.ingress`, and conditions); Services are created and changed with the
//! Kubernetes tools, never through this store.
//!
//! Annotations (`ipam_core::lb::annotations`): this project's, and for users coming from Cilium
//! or MetalLB the ones their Services already carry, those of the store's setting
//! (`KubeStore::with_service_annotations`). Two that disagree are reported on the Service
//! (`spec.conflict`). The deprecated
//! `spec.loadBalancerIP` is honoured as one more IP asked for.

use k8s_openapi::api::core::v1::{
    LoadBalancerIngress, LoadBalancerStatus, Service, ServiceSpec, ServiceStatus,
};
use serde_json::{Value, json};

use crate::conditions::{EngineCondition, engine_conditions, kubernetes_conditions};

use ipam_core::lb::annotations::{self, AnnotationSources};
pub use ipam_core::lb::annotations::{
    IPS_ANNOTATION, IPS_ANNOTATIONS, POOL_ANNOTATIONS, SHARING_ANNOTATIONS,
    SHARING_CROSS_NAMESPACE_ANNOTATIONS, SHARING_KEY_ANNOTATION,
};

/// The engine's `{spec, status}` of a Service. Values the engine cannot read (an IP that is not
/// one) are passed on as written, so the engine's decoding names the Service and the field.
pub(crate) fn to_engine(service: &Service, sources: &AnnotationSources) -> Value {
    let meta = &service.metadata;
    let empty = ServiceSpec::default();
    let spec = service.spec.as_ref().unwrap_or(&empty);
    let none = std::collections::BTreeMap::new();
    let asked = annotations::read(meta.annotations.as_ref().unwrap_or(&none), sources);
    let mut requested = asked.requested_ips;
    if let Some(ip) = spec.load_balancer_ip.as_deref().filter(|ip| !ip.is_empty()) {
        requested.push(ip.to_owned());
        note_deprecated_ip(meta, ip);
    }
    let service_type = match spec.type_.as_deref() {
        Some("LoadBalancer") => "LoadBalancer",
        Some("NodePort") => "NodePort",
        _ => "ClusterIP",
    };
    let families: Vec<&str> = spec
        .ip_families
        .iter()
        .flatten()
        .filter_map(|f| match f.as_str() {
            "IPv4" => Some("v4"),
            "IPv6" => Some("v6"),
            _ => None,
        })
        .collect();
    let ports: Vec<Value> = spec
        .ports
        .iter()
        .flatten()
        .map(|p| json!({ "port": p.port, "protocol": p.protocol.as_deref().unwrap_or("TCP") }))
        .collect();
    let mut engine_spec = json!({
        "type": service_type,
        "labels": meta.labels.clone().unwrap_or_default(),
        "ports": ports,
        "requestedIPs": requested,
        "ipFamilies": families,
        "ipFamilyPolicy": spec.ip_family_policy.as_deref().unwrap_or("SingleStack"),
        "externalIPs": spec.external_ips.clone().unwrap_or_default(),
        "externalTrafficPolicy": match spec.external_traffic_policy.as_deref() {
            Some("Local") => "Local",
            _ => "Cluster",
        },
        "selector": spec.selector.clone().unwrap_or_default(),
        "sharingCrossNamespace": asked.sharing_cross_namespace,
    });
    if let Some(class) = &spec.load_balancer_class {
        engine_spec["loadBalancerClass"] = json!(class);
    }
    if let Some(key) = asked.sharing_key {
        engine_spec["sharingKey"] = json!(key);
    }
    if let Some(pool) = asked.pool {
        engine_spec["pool"] = json!(pool);
    }
    if !asked.conflicts.is_empty() {
        engine_spec["conflict"] = json!(asked.conflicts.join("; "));
    }
    let status = service.status.clone().unwrap_or_default();
    let ingress: Vec<&str> = status
        .load_balancer
        .iter()
        .flat_map(|lb| lb.ingress.iter().flatten())
        .filter_map(|i| i.ip.as_deref())
        .collect();
    let conditions = engine_conditions(status.conditions.as_deref().unwrap_or_default());
    json!({
        "spec": engine_spec,
        "status": { "conditions": conditions, "ingress": ingress },
    })
}

/// Says once per Service and process that `spec.loadBalancerIP` is deprecated (Kubernetes
/// deprecated it in 1.24): it is honoured, and the annotation is the way to ask for IPs.
fn note_deprecated_ip(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta, ip: &str) {
    static NOTED: std::sync::Mutex<std::collections::BTreeSet<String>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let service = format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or("default"),
        meta.name.as_deref().unwrap_or("")
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

/// The engine's status of a Service.
#[derive(serde::Deserialize)]
struct EngineStatus {
    #[serde(default)]
    ingress: Vec<String>,
    #[serde(default)]
    conditions: Vec<EngineCondition>,
}

/// The Service status to write from the engine's: the ingress IPs and Kubernetes conditions
/// (times carried over from `current`, the object's status), the rest of `current` kept.
pub(crate) fn status_to_kubernetes(engine: &Value, current: &Value) -> Value {
    let engine: EngineStatus = serde_json::from_value(engine.clone()).unwrap_or(EngineStatus {
        ingress: Vec::new(),
        conditions: Vec::new(),
    });
    let mut status: ServiceStatus = serde_json::from_value(current.clone()).unwrap_or_default();
    let ingress: Vec<LoadBalancerIngress> = engine
        .ingress
        .into_iter()
        .map(|ip| LoadBalancerIngress {
            ip: Some(ip),
            ip_mode: Some("VIP".to_owned()),
            ..LoadBalancerIngress::default()
        })
        .collect();
    status.load_balancer = Some(LoadBalancerStatus {
        ingress: Some(ingress).filter(|i| !i.is_empty()),
    });
    let current_conditions = status.conditions.take().unwrap_or_default();
    let conditions = kubernetes_conditions(&engine.conditions, &current_conditions);
    status.conditions = Some(conditions).filter(|c| !c.is_empty());
    serde_json::to_value(status).expect("a Service status serialises")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec_of(annotations: Value) -> ipam_core::lb::resources::ServiceSpec {
        let object = json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "shop", "annotations": annotations},
            "spec": {"type": "LoadBalancer"},
        });
        let engine = to_engine(
            &serde_json::from_value(object).expect("a Service"),
            &AnnotationSources::default(),
        );
        serde_json::from_value(engine["spec"].clone()).expect("the engine reads it")
    }

    /// Services moved from Cilium LB-IPAM or MetalLB keep asking for their IPs and sharing
    /// keys with the annotations they carry; two that disagree are reported, the first in
    /// precedence used.
    #[test]
    fn cilium_and_metallb_annotations_are_read_and_disagreements_reported() {
        let cilium = spec_of(json!({
            "lbipam.cilium.io/ips": "10.0.0.5,fd00::5",
            "lbipam.cilium.io/sharing-key": "k",
            "lbipam.cilium.io/sharing-cross-namespace": "shop, tools",
        }));
        assert_eq!(cilium.requested_ips.len(), 2);
        assert_eq!(cilium.sharing_key.as_deref(), Some("k"));
        assert_eq!(cilium.sharing_cross_namespace, ["shop", "tools"]);
        assert_eq!(cilium.conflict, None);
        let cross = spec_of(json!({
            "ipam-ebpf.io/sharing-cross-namespace": "*",
            "lbipam.cilium.io/sharing-cross-namespace": "shop",
        }));
        assert_eq!(cross.sharing_cross_namespace, ["*"]);
        for annotation in POOL_ANNOTATIONS {
            assert_eq!(
                spec_of(json!({ annotation: " public " })).pool.as_deref(),
                Some("public")
            );
        }
        let pools = spec_of(json!({
            "metallb.io/address-pool": "a",
            "metallb.universe.tf/address-pool": "b",
        }));
        assert_eq!(pools.pool.as_deref(), Some("a"));
        assert!(
            pools
                .conflict
                .is_some_and(|c| c.contains("metallb.universe.tf/address-pool (b)"))
        );
        assert!(
            cross
                .conflict
                .is_some_and(|c| c.contains("ipam-ebpf.io/sharing-cross-namespace (*)")),
        );
        for (ips, shared) in [
            ("metallb.io/loadBalancerIPs", "metallb.io/allow-shared-ip"),
            (
                "metallb.universe.tf/loadBalancerIPs",
                "metallb.universe.tf/allow-shared-ip",
            ),
        ] {
            let metallb = spec_of(json!({ ips: "10.0.0.6", shared: "s" }));
            assert_eq!(
                metallb.requested_ips,
                ["10.0.0.6".parse::<std::net::IpAddr>().unwrap()]
            );
            assert_eq!(metallb.sharing_key.as_deref(), Some("s"));
        }
        // The same IPs in another order agree.
        let same = spec_of(json!({
            "ipam-ebpf.io/ips": "10.0.0.5, 10.0.0.7",
            "metallb.io/loadBalancerIPs": "10.0.0.7,10.0.0.5",
        }));
        assert_eq!(same.conflict, None);
        let disagree = spec_of(json!({
            "ipam-ebpf.io/ips": "10.0.0.5",
            "lbipam.cilium.io/ips": "10.0.0.9",
            "lbipam.cilium.io/sharing-key": "a",
            "metallb.io/allow-shared-ip": "b",
        }));
        assert_eq!(
            disagree.requested_ips,
            ["10.0.0.5".parse::<std::net::IpAddr>().unwrap()]
        );
        assert_eq!(disagree.sharing_key.as_deref(), Some("a"));
        let conflict = disagree.conflict.unwrap();
        assert!(
            conflict.contains("ipam-ebpf.io/ips (10.0.0.5) and lbipam.cilium.io/ips (10.0.0.9)")
                && conflict.contains(
                    "lbipam.cilium.io/sharing-key (a) and metallb.io/allow-shared-ip (b)"
                ),
            "{conflict}"
        );
    }

    #[test]
    fn a_kubernetes_service_reads_as_the_engine_s_and_its_status_writes_back() {
        let object = json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "shop", "labels": {"app": "web"},
                "annotations": {"ipam-ebpf.io/ips": "10.77.0.10, 10.77.0.11", "ipam-ebpf.io/sharing-key": "k"}},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP", "targetPort": 8080}],
                "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack", "loadBalancerIP": "10.77.0.12",
                "externalTrafficPolicy": "Local", "selector": {"app": "web"}},
        });
        let engine = to_engine(
            &serde_json::from_value(object).expect("a Service"),
            &AnnotationSources::default(),
        );
        let spec: ipam_core::lb::resources::ServiceSpec =
            serde_json::from_value(engine["spec"].clone()).expect("the engine reads it");
        assert_eq!(spec.requested_ips.len(), 3);
        assert_eq!(spec.sharing_key.as_deref(), Some("k"));
        assert!(spec.is_ours());
        assert_eq!(
            spec.external_traffic_policy,
            ipam_core::lb::resources::TrafficPolicy::Local
        );
        assert_eq!(spec.selector.get("app").map(String::as_str), Some("web"));
        let status = status_to_kubernetes(
            &json!({"ingress": ["10.77.0.10"], "conditions": [{"type": "Ready", "status": true, "message": "assigned"}]}),
            &Value::Null,
        );
        assert_eq!(status["loadBalancer"]["ingress"][0]["ip"], "10.77.0.10");
        assert_eq!(status["conditions"][0]["status"], "True");
    }
}
