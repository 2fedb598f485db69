//! The agent's directory of its node's pods and the namespaces, over a real kube-apiserver when
//! `KUBEBUILDER_ASSETS` names one, else the in-process stand-in (no API server is packaged for
//! the machines CI runs on; the stand-in serves field selectors and metadata-only watches as
//! the server does).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, api::PostParams};
use serde_json::json;

use ipam_kube::{KubeStore, pods::PodLookupError, test_api::TestApi};

async fn create_pod(
    api: &TestApi,
    namespace: &str,
    name: &str,
    node: &str,
    annotations: serde_json::Value,
) {
    let pods: Api<Pod> = Api::namespaced(api.client().await, namespace);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name, "namespace": namespace, "annotations": annotations },
        "spec": { "nodeName": node, "containers": [{ "name": "c", "image": "registry.invalid/c" }] },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_of_the_node_and_their_namespaces_annotations() {
    let api = TestApi::start("pods_of_the_node_and_their_namespaces_annotations", &[]).await;
    api.create_namespace("tenant-a", json!({ "ipam-ebpf.io/ip-pool": "tenant-a" }))
        .await;
    api.create_namespace("plain", json!({})).await;
    create_pod(&api, "tenant-a", "web", "n1", json!({})).await;
    create_pod(
        &api,
        "plain",
        "db",
        "n1",
        json!({ "ipam-ebpf.io/ip-pool": "fast" }),
    )
    .await;
    create_pod(&api, "plain", "elsewhere", "n2", json!({})).await;

    let store = KubeStore::new(api.client().await, "ipam-system");
    let directory = store.follow_pods("n1");
    let lookup_within = |ns: &str, pod: &str, wait: Duration| {
        let directory = directory.clone();
        let (ns, pod) = (ns.to_owned(), pod.to_owned());
        tokio::task::spawn_blocking(move || directory.annotations(&ns, &pod, wait))
    };
    let lookup = |ns: &str, pod: &str| lookup_within(ns, pod, Duration::from_secs(5));
    let web = lookup("tenant-a", "web")
        .await
        .unwrap()
        .expect("web's annotations");
    assert!(web.pod.is_empty());
    assert_eq!(web.namespace["ipam-ebpf.io/ip-pool"], "tenant-a");
    let db = lookup("plain", "db")
        .await
        .unwrap()
        .expect("db's annotations");
    assert_eq!(db.pod["ipam-ebpf.io/ip-pool"], "fast");

    // Another node's pod is not watched (spec.nodeName), and the error says where it looked.
    let e = lookup_within("plain", "elsewhere", Duration::from_millis(500))
        .await
        .unwrap()
        .unwrap_err();
    assert!(matches!(e, PodLookupError::PodNotSeen { .. }), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("plain/elsewhere") && text.contains("spec.nodeName=n1"),
        "{text}"
    );

    // A pod bound while the ADD waits is found.
    let waiting = lookup("tenant-a", "late");
    tokio::time::sleep(Duration::from_millis(300)).await;
    create_pod(
        &api,
        "tenant-a",
        "late",
        "n1",
        json!({ "ipam-ebpf.io/ip-pool": "x" }),
    )
    .await;
    let late = waiting.await.unwrap().expect("the late pod");
    assert_eq!(late.pod["ipam-ebpf.io/ip-pool"], "x");

    // The directory only lists and watches pods and namespaces (the test made the creates).
    let verbs: Vec<(String, String)> = api
        .requests()
        .into_iter()
        .filter(|r| r.verb != "create")
        .map(|r| (r.resource, r.verb))
        .collect();
    for wanted in [("pods", "list"), ("pods", "watch"), ("namespaces", "watch")] {
        assert!(
            verbs
                .iter()
                .any(|(r, v)| (r.as_str(), v.as_str()) == wanted),
            "no {wanted:?} among the requests seen: {verbs:?}"
        );
    }
    for (resource, verb) in &verbs {
        assert!(
            ["pods", "namespaces"].contains(&resource.as_str())
                && ["list", "watch"].contains(&verb.as_str()),
            "{verbs:?}"
        );
    }
}
