//! EndpointSlices (discovery.k8s.io/v1) as the engine's `ServiceEndpoints`, named
//! `<namespace>/<slice>`: which nodes run a ready endpoint of which Service, what the
//! announcement of a Service with `externalTrafficPolicy: Local` reads. Read only: the
//! EndpointSlice controller writes them.
//!
//! The Service is the slice's `kubernetes.io/service-name` label (a slice without it belongs
//! to no Service and selects no node); an endpoint counts on its `nodeName`, and is ready
//! unless `conditions.ready` is false (absent means ready, as kube-proxy reads it). Endpoints
//! with no node name (outside the cluster) are left out.

use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::{Value, json};

/// The label the EndpointSlice controller puts on a Service's slices.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The engine's value of `slice`.
pub(crate) fn to_engine(slice: &EndpointSlice) -> Value {
    let namespace = slice.metadata.namespace.as_deref().unwrap_or("default");
    let service = slice
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(SERVICE_NAME_LABEL))
        .map_or(String::new(), |name| format!("{namespace}/{name}"));
    let endpoints: Vec<Value> = slice
        .endpoints
        .iter()
        .filter_map(|e| {
            let node = e.node_name.as_deref()?;
            let ready = e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
            Some(json!({ "nodeName": node, "ready": ready }))
        })
        .collect();
    json!({ "spec": { "service": service, "endpoints": endpoints } })
}

#[cfg(test)]
mod tests {
    use ipam_core::lb::resources::ServiceEndpoints;

    use super::*;

    fn slice(value: Value) -> EndpointSlice {
        serde_json::from_value(value).expect("an EndpointSlice")
    }

    #[test]
    fn nodes_and_readiness_of_a_services_slice() {
        let s = slice(json!({
            "metadata": {
                "name": "web-x7k2p", "namespace": "shop",
                "labels": { SERVICE_NAME_LABEL: "web" }
            },
            "addressType": "IPv4",
            "endpoints": [
                { "addresses": ["10.1.0.5"], "nodeName": "n1" },
                { "addresses": ["10.1.0.6"], "nodeName": "n2", "conditions": { "ready": false } },
                { "addresses": ["10.1.0.7"], "nodeName": "n3", "conditions": { "ready": true } },
                { "addresses": ["192.0.2.9"] }
            ]
        }));
        let engine: ServiceEndpoints = serde_json::from_value(to_engine(&s)).unwrap();
        assert_eq!(engine.spec.service, "shop/web");
        let got: Vec<(&str, bool)> = engine
            .spec
            .endpoints
            .iter()
            .map(|e| (e.node_name.as_str(), e.ready))
            .collect();
        assert_eq!(got, [("n1", true), ("n2", false), ("n3", true)]);
    }

    #[test]
    fn a_slice_of_no_service_selects_no_node() {
        let s = slice(json!({
            "metadata": { "name": "manual", "namespace": "shop" },
            "addressType": "IPv4",
            "endpoints": [ { "addresses": ["10.1.0.5"], "nodeName": "n1" } ]
        }));
        let engine: ServiceEndpoints = serde_json::from_value(to_engine(&s)).unwrap();
        assert_eq!(engine.spec.service, "");
    }
}
