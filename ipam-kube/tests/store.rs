//! The Kubernetes store against an API server: a real kube-apiserver when `KUBEBUILDER_ASSETS`
//! names one (the envtest convention), else the in-process stand-in (`ipam_kube::testing`),
//! since no API server is packaged for the machines CI runs on. Both keep resourceVersions,
//! answer 409 on conflicts, serve the status subresource and watches, and answer 410 Gone to a
//! watch that resumes from a forgotten version. The same conformance tests run here as over the
//! embedded store and real etcd.

use std::{sync::Arc, time::Duration};

use ipam_core::{
    lb::resources::LbIpPool,
    meta::Condition,
    resources::{NodeIpam, NodeIpamStatus},
    store::{Store, TypedStore as _, WatchEvent, conformance},
};
use ipam_kube::{KubeStore, store::Layout, test_api::TestApi};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

/// The conformance suite's own kinds, as custom resources a real server serves.
fn test_crd(kind: &str, plural: &str, singular: &str) -> CustomResourceDefinition {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": format!("{plural}.{}", ipam_kube::crd::GROUP) },
        "spec": {
            "group": ipam_kube::crd::GROUP,
            "scope": "Cluster",
            "names": { "kind": kind, "plural": plural, "singular": singular },
            "versions": [{
                "name": ipam_kube::crd::VERSION, "served": true, "storage": true,
                "schema": { "openAPIV3Schema": { "type": "object", "properties": {
                    "spec": { "type": "object", "x-kubernetes-preserve-unknown-fields": true },
                } } },
            }],
        },
    }))
    .expect("a CRD")
}

async fn store(test: &str) -> (TestApi, KubeStore) {
    let api = TestApi::start(test, &["ipam-system"]).await;
    let mut crds = ipam_kube::crd::all();
    crds.extend([
        test_crd("Thing", "things", "thing"),
        // Its plural shares a prefix with `things`; its singular may not be `things`, the other's
        // plural, on a real server.
        test_crd("Things", "thingses", "thingsone"),
        test_crd("Other", "others", "other"),
    ]);
    api.install_crds(crds).await;
    let store = KubeStore::new(api.client().await, "ipam-system")
        .with_kind("Thing", "things", Layout::WholeAsSpec)
        .with_kind("Things", "thingses", Layout::WholeAsSpec)
        .with_kind("Other", "others", Layout::WholeAsSpec);
    (api, store)
}

#[tokio::test]
async fn crud_with_optimistic_concurrency() {
    let (_api, s) = store("crud_with_optimistic_concurrency").await;
    conformance::crud_with_optimistic_concurrency(&s).await;
}

#[tokio::test]
async fn watch_sees_the_snapshot_then_every_change_in_order() {
    let (_api, s) = store("watch_sees_the_snapshot_then_every_change_in_order").await;
    conformance::watch_sees_the_snapshot_then_every_change_in_order(&s).await;
}

#[tokio::test]
async fn one_leader_and_takeover_after_the_duration() {
    let (_api, s) = store("one_leader_and_takeover_after_the_duration").await;
    conformance::one_leader_and_takeover_after_the_duration(&s).await;
}

/// A Kubernetes Lease keeps its duration in whole seconds: leases of one second here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_candidates_never_both_lead() {
    let (_api, s) = store("concurrent_candidates_never_both_lead").await;
    conformance::concurrent_candidates_never_both_lead_with(Arc::new(s), Duration::from_secs(1))
        .await;
}

/// A watch whose resourceVersion the server forgot (410 Gone) lists the kind again and goes
/// on: what it delivers ends with the objects there are.
#[tokio::test]
async fn a_watch_told_gone_lists_again_and_goes_on() {
    #[derive(serde::Serialize, serde::Deserialize)]
    struct Thing {
        size: u32,
    }
    impl ipam_core::store::Resource for Thing {
        const KIND: &'static str = "Thing";
    }
    let (mut api, s) = store("a_watch_told_gone_lists_again_and_goes_on").await;
    s.create_typed("a", &Thing { size: 1 }).await.unwrap();
    let mut w = s.watch("Thing").await.unwrap();
    s.create_typed("b", &Thing { size: 2 }).await.unwrap();
    // Wait until the watch saw b, so it resumes from b's version.
    loop {
        if let Ok(WatchEvent::Put(o)) = w.next().await
            && o.name == "b"
        {
            break;
        }
    }
    s.delete("Thing", "a", None).await.unwrap();
    s.create_typed("c", &Thing { size: 3 }).await.unwrap();
    api.compact_and_end_watches().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let event = tokio::time::timeout_at(deadline, w.next())
            .await
            .expect("a resync within 20 s");
        if let Ok(WatchEvent::Resync { objects, .. }) = event {
            let names: Vec<&str> = objects.iter().map(|o| o.name.as_str()).collect();
            assert_eq!(names, ["b", "c"]);
            break;
        }
    }
}

/// A node record as the agent and the operator write it: the spec on the object, the status
/// through the status subresource, conditions as Kubernetes conditions whose transition time
/// stays while they hold; a status written again unchanged leaves the resourceVersion alone.
#[tokio::test]
async fn status_goes_through_the_subresource_with_kubernetes_conditions() {
    let (api, s) = store("status_goes_through_the_subresource_with_kubernetes_conditions").await;
    let created = s
        .create_typed("node-1", &NodeIpam::default())
        .await
        .unwrap();
    let mut record = s.get_typed::<NodeIpam>("node-1").await.unwrap().unwrap();
    assert_eq!(record.revision, created);
    record.value.status = NodeIpamStatus {
        allocated: vec![],
        lost: vec![],
        conditions: vec![Condition::new(
            "Ready",
            false,
            "pool default (IPv4) is exhausted",
        )],
    };
    let written = s
        .update_typed("node-1", &record.value, &record.revision)
        .await
        .unwrap();
    assert_ne!(written, record.revision);
    let again = s
        .update_typed("node-1", &record.value, &written)
        .await
        .unwrap();
    assert_eq!(again, written, "an unchanged status is not written again");
    let back = s.get_typed::<NodeIpam>("node-1").await.unwrap().unwrap();
    assert_eq!(back.value.status.conditions, record.value.status.conditions);

    // What the API server holds is a Kubernetes condition.
    let raw: serde_json::Value = api
        .client()
        .await
        .request(
            http::Request::get("/apis/ipam-ebpf.io/v1alpha1/nodeipams/node-1")
                .body(Vec::new())
                .unwrap(),
        )
        .await
        .unwrap();
    let c = &raw["status"]["conditions"][0];
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("False"), Some("NotReady")),
        "{raw}"
    );
    assert!(c["lastTransitionTime"].is_string(), "{raw}");

    // A stale write is a conflict that names both versions.
    let e = s
        .update_typed("node-1", &NodeIpam::default(), &created)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("changed by someone else") && e.contains(&format!("revision {again}")),
        "{e}"
    );
}

/// A pool's labels are its object's `metadata.labels`, as a user sets them with kubectl:
/// written on create and on a change, read back into the pool; the operator's status write,
/// with the labels it read, leaves them as they are; a kind without labels (a node record)
/// leaves the labels a user put on its object alone.
#[tokio::test]
async fn a_pool_s_labels_are_its_metadata_labels() {
    let (api, s) = store("a_pool_s_labels_are_its_metadata_labels").await;
    let mut pool: LbIpPool = serde_json::from_value(serde_json::json!({
        "labels": { "segment": "edge" },
        "spec": { "blocks": [ { "cidr": "10.79.0.0/28" } ] },
    }))
    .unwrap();
    s.create_typed("edge", &pool).await.unwrap();
    let client = api.client().await;
    let object = |path: &'static str| {
        let client = client.clone();
        async move {
            client
                .request::<serde_json::Value>(http::Request::get(path).body(Vec::new()).unwrap())
                .await
                .unwrap()
        }
    };
    let raw = object("/apis/ipam-ebpf.io/v1alpha1/loadbalancerippools/edge").await;
    assert_eq!(raw["metadata"]["labels"]["segment"], "edge", "{raw}");
    assert!(raw["spec"].get("labels").is_none(), "{raw}");

    let read = s.get_typed::<LbIpPool>("edge").await.unwrap().unwrap();
    assert_eq!(read.value.labels, pool.labels);
    pool.labels.insert("tier".into(), "public".into());
    pool.status.conditions = vec![Condition::new("Ready", true, "")];
    s.update_typed("edge", &pool, &read.revision).await.unwrap();
    let raw = object("/apis/ipam-ebpf.io/v1alpha1/loadbalancerippools/edge").await;
    assert_eq!(raw["metadata"]["labels"]["tier"], "public", "{raw}");
    assert_eq!(raw["metadata"]["name"], "edge", "{raw}");

    // A node record's type has no labels: its object's labels stay.
    s.create_typed("node-1", &NodeIpam::default())
        .await
        .unwrap();
    let nodeipams: kube::Api<kube::api::DynamicObject> = kube::Api::all_with(
        client.clone(),
        &kube::discovery::ApiResource {
            group: ipam_kube::crd::GROUP.into(),
            version: ipam_kube::crd::VERSION.into(),
            api_version: format!("{}/{}", ipam_kube::crd::GROUP, ipam_kube::crd::VERSION),
            kind: "NodeIPAM".into(),
            plural: "nodeipams".into(),
        },
    );
    nodeipams
        .patch(
            "node-1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({
                "metadata": { "labels": { "team": "net" } } })),
        )
        .await
        .unwrap();
    let mut record = s.get_typed::<NodeIpam>("node-1").await.unwrap().unwrap();
    record.value.status.conditions = vec![Condition::new("Ready", true, "")];
    s.update_typed("node-1", &record.value, &record.revision)
        .await
        .unwrap();
    let raw = object("/apis/ipam-ebpf.io/v1alpha1/nodeipams/node-1").await;
    assert_eq!(raw["metadata"]["labels"]["team"], "net", "{raw}");
}

/// A pool applied with kubectl carries only the fields its user wrote; the engine's value has
/// every default filled in. Writing the operator's status must leave that spec as applied: the
/// operator may patch `loadbalancerippools/status` and nothing else (deploy/base/rbac.yaml), so
/// a write of the spec would be refused on a real cluster (it was, in the first run there).
#[tokio::test]
async fn a_status_write_leaves_the_spec_as_the_user_applied_it() {
    let (api, s) = store("a_status_write_leaves_the_spec_as_the_user_applied_it").await;
    let client = api.client().await;
    let path = "/apis/ipam-ebpf.io/v1alpha1/loadbalancerippools";
    let applied = serde_json::json!({ "blocks": [{ "cidr": "10.77.0.192/28" }] });
    let body = serde_json::to_vec(&serde_json::json!({
        "apiVersion": "ipam-ebpf.io/v1alpha1", "kind": "LoadBalancerIPPool",
        "metadata": { "name": "applied" }, "spec": applied,
    }))
    .unwrap();
    // As the server keeps it: a real one adds the schema's defaults.
    let created: serde_json::Value = client
        .request(
            http::Request::post(path)
                .header("content-type", "application/json")
                .body(body)
                .unwrap(),
        )
        .await
        .expect("create the pool as kubectl would");

    let read = s.get_typed::<LbIpPool>("applied").await.unwrap().unwrap();
    let mut pool = read.value.clone();
    pool.status.conditions = vec![Condition::new("Reachable", true, "inside a subnet")];
    s.update_status_typed("applied", &pool, &read.revision)
        .await
        .unwrap();

    let raw: serde_json::Value = client
        .request(
            http::Request::get(format!("{path}/applied"))
                .body(Vec::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(
        raw["spec"], created["spec"],
        "the spec is as applied: {raw}"
    );
    assert_eq!(
        raw["metadata"]["generation"], created["metadata"]["generation"],
        "the spec was not written: {raw}"
    );
    assert_eq!(raw["status"]["conditions"][0]["type"], "Reachable", "{raw}");
    // And a stale revision is a conflict, as for any write.
    let stale = s
        .update_status_typed("applied", &pool, &read.revision)
        .await;
    assert!(
        matches!(stale, Err(ipam_core::store::StoreError::Conflict { .. })),
        "{stale:?}"
    );
}

/// A core/v1 Node is read as the engine's `Node` kind: present while the Node exists, gone once
/// it is deleted, with its podCIDRs and its addresses between nodes (its InternalIPs; an
/// ExternalIP or a Hostname is not one); the store refuses to write one (Nodes are the
/// cluster's).
#[tokio::test]
async fn a_node_is_known_while_its_node_object_exists() {
    use ipam_core::resources::ClusterNode;
    let (api, s) = store("a_node_is_known_while_its_node_object_exists").await;
    assert!(
        s.get_typed::<ClusterNode>("worker-1")
            .await
            .unwrap()
            .is_none()
    );
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(api.client().await);
    let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Node", "metadata": { "name": "worker-1" },
        "spec": { "podCIDRs": ["10.244.1.0/24"] },
        "status": { "addresses": [
            { "type": "Hostname", "address": "worker-1" },
            { "type": "ExternalIP", "address": "198.51.100.1" },
            { "type": "InternalIP", "address": "192.0.2.1" },
            { "type": "InternalIP", "address": "fd00::1" },
        ] },
    }))
    .unwrap();
    nodes
        .create(&kube::api::PostParams::default(), &node)
        .await
        .unwrap();
    let read = s
        .get_typed::<ClusterNode>("worker-1")
        .await
        .unwrap()
        .expect("the Node, once created")
        .value;
    assert_eq!(read.pod_cidrs[0].to_string(), "10.244.1.0/24");
    let addresses: Vec<String> = read.addresses.iter().map(ToString::to_string).collect();
    assert_eq!(addresses, ["192.0.2.1", "fd00::1"]);
    let refused = s
        .create_typed("worker-2", &ClusterNode::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("Node worker-2") && refused.contains("only reads"),
        "{refused}"
    );
    nodes
        .delete("worker-1", &kube::api::DeleteParams::default())
        .await
        .unwrap();
    let gone = async {
        while s
            .get_typed::<ClusterNode>("worker-1")
            .await
            .unwrap()
            .is_some()
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), gone)
        .await
        .expect("the Node gone from the store's view once deleted");
}
