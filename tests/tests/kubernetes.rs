//! `ipamd --role operator` and `ipamctl` on the Kubernetes store, found through a kubeconfig
//! as on a real cluster. The API server is a real kube-apiserver when `KUBEBUILDER_ASSETS` names
//! one (deploy/'s namespace, CRDs, RBAC and admission policy applied with kubectl; each client
//! with its own identity, the agents with tokens bound to a pod on their node, so RBAC and the
//! admission policy judge every request). No API server is packaged for the machines CI runs
//! on: there the API is the in-process stand-in of `ipam_kube::testing` (resourceVersions, 409s,
//! the status subresource, watches, 410 Gone), listening on loopback, which records each client's
//! requests by its token. Each test prints which server it ran against.

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use ipam_api::types::{ErrorCode, Request, Response};
use ipam_core::{
    resources::{NodeIpam, PodIpPool},
    store::{TypedStore as _, lease::Lease},
};
use ipam_kube::{KubeStore, test_api::TestApi};
use ipam_tests::{
    TempFile,
    daemon::Daemon,
    kube_api::{
        AgentNode, Who, agent_pod, attachment, create_web_service, kubeconfig_for, start_api,
    },
    workspace_binary,
};
use k8s_openapi::api::core::v1::Pod;

const POOLS: &str = "[[ipam.pool]]\nname = \"default\"\n\
    ipv4 = { cidrs = [\"10.243.0.0/24\"], maskSize = 26 }\n";

/// The operator's configuration: the Kubernetes store, short leases, and `ipam` (the mode and
/// the pools) as its `[ipam]` section.
fn operator_config(ipam: &str) -> TempFile {
    operator_config_with_grace(ipam, 600_000)
}

/// As `operator_config`, with nodes lapsing after `node_grace_ms`.
fn operator_config_with_grace(ipam: &str, node_grace_ms: u64) -> TempFile {
    let config = TempFile::new("kube-operator", "toml");
    std::fs::write(
        &config.0,
        format!(
            "[store]\nkind = \"kubernetes\"\n[store.kubernetes]\nnamespace = \"ipam-system\"\n\n\
             [cluster]\nnode_lease_ms = 1500\nnode_grace_ms = {node_grace_ms}\nnode_renew_ms = 1000\n\
             operator_lease_ms = 3000\n\n[ipam]\n{ipam}"
        ),
    )
    .expect("write the operator configuration");
    config
}

/// `ipamctl apply -f MANIFEST --config CONFIG` as `kubeconfig`'s user; panics when it fails.
fn ipamctl_apply(
    manifest: &std::path::Path,
    config: &std::path::Path,
    kubeconfig: &std::path::Path,
) {
    let applied = std::process::Command::new(workspace_binary("ipamctl"))
        .args(["apply", "-f"])
        .arg(manifest)
        .arg("--config")
        .arg(config)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .expect("run ipamctl apply");
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
}

/// The (API group, resource, verb) a role of deploy/base/rbac.yaml grants.
fn granted(role: &str) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for doc in ipam_tests::deploy::documents(&ipam_tests::deploy::dir().join("rbac.yaml")) {
        let kind = doc["kind"].as_str().unwrap_or("");
        if (kind != "ClusterRole" && kind != "Role") || doc["metadata"]["name"] != role {
            continue;
        }
        for rule in doc["rules"].as_array().into_iter().flatten() {
            for group in rule["apiGroups"].as_array().into_iter().flatten() {
                for resource in rule["resources"].as_array().into_iter().flatten() {
                    for verb in rule["verbs"].as_array().into_iter().flatten() {
                        out.insert((
                            group.as_str().unwrap_or("").to_owned(),
                            resource.as_str().unwrap_or("").to_owned(),
                            verb.as_str().unwrap_or("").to_owned(),
                        ));
                    }
                }
            }
        }
    }
    out
}

/// The requests `who` made of the API servers are exactly the rights `role` has in
/// deploy/base/rbac.yaml: none missing, none unused. (A real server also refuses what is missing.)
fn assert_rights_match(apis: &[&TestApi], who: Who, role: &str) {
    let user = who.user(apis[0]);
    let used: BTreeSet<(String, String, String)> = apis
        .iter()
        .flat_map(|api| api.requests())
        .filter(|r| r.user == user)
        .map(|r| (r.group, r.resource, r.verb))
        .collect();
    let granted = granted(role);
    let not_granted: Vec<_> = used.difference(&granted).collect();
    assert!(
        not_granted.is_empty(),
        "the {user} needs rights rbac.yaml does not grant {role}: {not_granted:?}"
    );
    let unused: Vec<_> = granted.difference(&used).collect();
    assert!(
        unused.is_empty(),
        "rbac.yaml grants {role} rights the {user} never used: {unused:?}"
    );
}

async fn wait_for<T>(
    what: &str,
    mut probe: impl AsyncFnMut() -> Option<T>,
    log: impl Fn() -> String,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; log:\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_and_ipamctl_work_on_the_kubernetes_api() {
    let api = start_api("operator_and_ipamctl_work_on_the_kubernetes_api").await;
    let kubeconfig = kubeconfig_for(&api, Who::Operator).await;
    let ipamctl_kubeconfig = kubeconfig_for(&api, Who::Ipamctl).await;
    // The workers' Nodes exist, and none of their agents renews a lease: each lapses after the
    // grace period and keeps its blocks while its Node exists.
    let config = operator_config_with_grace(&format!("mode = \"cluster-pool\"\n{POOLS}"), 4000);
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(api.client().await);
    for n in 1..=6 {
        let node = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Node", "metadata": { "name": format!("worker-{n}") },
        }))
        .unwrap();
        nodes
            .create(&kube::api::PostParams::default(), &node)
            .await
            .expect("create a Node");
    }
    let operator = Daemon::start_on_host(
        &config.0,
        &["--role", "operator"],
        &[("KUBECONFIG", &kubeconfig.0)],
    );
    let store = KubeStore::new(api.client().await, "ipam-system");
    let log = || operator.log_text();

    // The operator leads through a coordination.k8s.io Lease and writes the configured pool.
    let holder = wait_for(
        "the operator's lease",
        async || {
            store
                .get_typed::<Lease>("ipam-operator")
                .await
                .ok()
                .flatten()
                .map(|l| l.value.holder)
                .filter(|h| !h.is_empty())
        },
        log,
    )
    .await;
    assert!(!holder.is_empty());
    // A node's agent creates its record; the operator gives it a block through /status.
    store
        .create_typed("worker-1", &NodeIpam::default())
        .await
        .unwrap();
    let block = wait_for(
        "a block for worker-1",
        async || {
            let n = store.get_typed::<NodeIpam>("worker-1").await.ok()??;
            n.value.status.allocated.first().map(|b| b.cidr.to_string())
        },
        log,
    )
    .await;
    assert_eq!(block, "10.243.0.0/26");
    let pool = wait_for(
        "the pool's usage",
        async || {
            let p = store.get_typed::<PodIpPool>("default").await.ok()??;
            (p.value.status.usage.first()?.used_blocks == 1).then_some(p)
        },
        log,
    )
    .await;
    assert!(
        pool.value.status.conditions.iter().all(|c| c.status),
        "{pool:?}"
    );

    // Three more nodes take the pool's other blocks; two more find it exhausted. Users see it
    // in an Event on the pool, the second adding to the first's series.
    for n in 2..=6 {
        store
            .create_typed(&format!("worker-{n}"), &NodeIpam::default())
            .await
            .unwrap();
    }
    let events: kube::Api<k8s_openapi::api::events::v1::Event> =
        kube::Api::namespaced(api.client().await, "default");
    let exhausted = wait_for(
        "an event on the exhausted pool, seen twice",
        async || {
            let list = events.list(&kube::api::ListParams::default()).await.ok()?;
            list.items.into_iter().find(|e| {
                e.reason.as_deref() == Some("PoolExhausted")
                    && e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("PodIPPool")
                    && e.series.as_ref().is_some_and(|s| s.count >= 2)
            })
        },
        log,
    )
    .await;
    assert_eq!(exhausted.type_.as_deref(), Some("Warning"));
    let regarding = exhausted.regarding.unwrap();
    assert_eq!(regarding.name.as_deref(), Some("default"));
    assert!(
        regarding.uid.is_some(),
        "kubectl describe finds events by uid"
    );
    assert!(
        exhausted
            .note
            .as_deref()
            .is_some_and(|n| n.contains("append a CIDR")),
        "{:?}",
        exhausted.note
    );

    // ipamctl reads the same store through the kubeconfig, and says what it read.
    let out = std::process::Command::new(workspace_binary("ipamctl"))
        .args(["pools", "--config"])
        .arg(&config.0)
        .env("KUBECONFIG", &ipamctl_kubeconfig.0)
        .output()
        .expect("run ipamctl");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("[####################] 4/4 blocks")
            && text.contains("worker-1: 10.243.0.0/26")
            && text.contains("the Kubernetes API (namespace ipam-system)"),
        "{text}"
    );

    // LB-IPAM on a Kubernetes Service: a pool applied with ipamctl, a Service of type
    // LoadBalancer made with the Kubernetes API; the operator writes the Service's
    // status.loadBalancer.ingress through /status.
    let manifest = TempFile::new("kube-lb", "yaml");
    std::fs::write(
        &manifest.0,
        "kind: LoadBalancerIPPool\nmetadata:\n  name: lb\nspec:\n  blocks:\n  - cidr: 10.77.5.0/29\n",
    )
    .unwrap();
    ipamctl_apply(&manifest.0, &config.0, &ipamctl_kubeconfig.0);
    let services = create_web_service(&api).await;
    let ingress = wait_for(
        "the Service's ingress IP",
        async || {
            let s = services.get("web").await.ok()?;
            s.status?.load_balancer?.ingress?.first()?.ip.clone()
        },
        log,
    )
    .await;
    assert!(ingress.starts_with("10.77.5."), "{ingress}");

    // Services moved from MetalLB and Cilium keep asking with the annotations they carry: the
    // IP a MetalLB annotation names is given; two that disagree give the first in precedence,
    // and the Service's AnnotationsAgree condition names both.
    for (name, port, annotations) in [
        (
            "cart",
            81,
            serde_json::json!({ "metallb.io/loadBalancerIPs": "10.77.5.5" }),
        ),
        (
            "moved",
            82,
            serde_json::json!({
                "lbipam.cilium.io/ips": "10.77.5.4",
                "metallb.universe.tf/loadBalancerIPs": "10.77.5.3",
            }),
        ),
    ] {
        let service: k8s_openapi::api::core::v1::Service =
            serde_json::from_value(serde_json::json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": { "name": name, "namespace": "shop", "annotations": annotations },
                "spec": { "type": "LoadBalancer", "ports": [{ "port": port, "protocol": "TCP" }] },
            }))
            .unwrap();
        services
            .create(&kube::api::PostParams::default(), &service)
            .await
            .expect("create the Service");
    }
    let served = |name: &'static str| {
        let services = services.clone();
        async move || {
            let s = services.get(name).await.ok()?;
            let status = s.status?;
            let ip = status.load_balancer?.ingress?.first()?.ip.clone()?;
            Some((ip, status.conditions.unwrap_or_default()))
        }
    };
    let (cart, _) = wait_for("cart's ingress IP", served("cart"), log).await;
    assert_eq!(cart, "10.77.5.5");
    let (moved, conditions) = wait_for("moved's ingress IP", served("moved"), log).await;
    assert_eq!(moved, "10.77.5.4");
    let agree = conditions
        .iter()
        .find(|c| c.type_ == "AnnotationsAgree")
        .expect("an AnnotationsAgree condition");
    assert_eq!(agree.status, "False");
    assert!(
        agree.message.contains("lbipam.cilium.io/ips (10.77.5.4)")
            && agree
                .message
                .contains("metallb.universe.tf/loadBalancerIPs (10.77.5.3)"),
        "{agree:?}"
    );

    // A pool with a namespaceSelector serves only namespaces whose labels it selects, read
    // from the Namespaces: gold's Service gets its address; shop's request for one is told why.
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> =
        kube::Api::all(api.client().await);
    let gold: k8s_openapi::api::core::v1::Namespace = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "gold", "labels": { "tier": "gold" } },
    }))
    .unwrap();
    namespaces
        .create(&kube::api::PostParams::default(), &gold)
        .await
        .expect("create namespace gold");
    if let TestApi::Real(_) = api {
        let account: k8s_openapi::api::core::v1::ServiceAccount =
            serde_json::from_value(serde_json::json!({
                "metadata": { "name": "default", "namespace": "gold" },
            }))
            .unwrap();
        kube::Api::namespaced(api.client().await, "gold")
            .create(&kube::api::PostParams::default(), &account)
            .await
            .expect("create gold/default");
    }
    std::fs::write(
        &manifest.0,
        "kind: LoadBalancerIPPool\nmetadata:\n  name: gold-pool\nspec:\n  blocks:\n  \
         - cidr: 10.77.6.0/29\n  namespaceSelector:\n    matchLabels: { tier: gold }\n",
    )
    .unwrap();
    ipamctl_apply(&manifest.0, &config.0, &ipamctl_kubeconfig.0);
    let gold_services: kube::Api<k8s_openapi::api::core::v1::Service> =
        kube::Api::namespaced(api.client().await, "gold");
    for (services, namespace, name, annotations) in [
        (
            &gold_services,
            "gold",
            "api",
            serde_json::json!({ "ipam-ebpf.io/address-pool": "gold-pool" }),
        ),
        (
            &services,
            "shop",
            "wants-gold",
            serde_json::json!({ "ipam-ebpf.io/ips": "10.77.6.3" }),
        ),
    ] {
        let service: k8s_openapi::api::core::v1::Service =
            serde_json::from_value(serde_json::json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": { "name": name, "namespace": namespace, "annotations": annotations },
                "spec": { "type": "LoadBalancer", "ports": [{ "port": 83, "protocol": "TCP" }] },
            }))
            .unwrap();
        services
            .create(&kube::api::PostParams::default(), &service)
            .await
            .expect("create the Service");
    }
    let gold_ip = wait_for(
        "gold/api's ingress IP",
        async || {
            let s = gold_services.get("api").await.ok()?;
            s.status?.load_balancer?.ingress?.first()?.ip.clone()
        },
        log,
    )
    .await;
    assert!(gold_ip.starts_with("10.77.6."), "{gold_ip}");
    let refused = wait_for(
        "shop/wants-gold's condition",
        async || {
            let s = services.get("wants-gold").await.ok()?;
            s.status?
                .conditions?
                .into_iter()
                .find(|c| c.type_ == "IPAssigned" && c.status == "False")
        },
        log,
    )
    .await;
    assert!(
        refused
            .message
            .contains("pool gold-pool, which serves only namespaces its namespaceSelector selects"),
        "{refused:?}"
    );

    // An external IP of gold's pool, listed by a ClusterIP Service of shop, with a policy that
    // announces external IPs: refused, and told on the Service's own status (written through
    // /status on a Service that is no LoadBalancer).
    std::fs::write(
        &manifest.0,
        "kind: L2AnnouncementPolicy\nmetadata:\n  name: external\nspec:\n  externalIPs: true\n",
    )
    .unwrap();
    ipamctl_apply(&manifest.0, &config.0, &ipamctl_kubeconfig.0);
    let listing: k8s_openapi::api::core::v1::Service = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": { "name": "lists-gold", "namespace": "shop" },
        "spec": { "type": "ClusterIP", "ports": [{ "port": 85, "protocol": "TCP" }],
                  "externalIPs": ["10.77.6.5"] },
    }))
    .unwrap();
    services
        .create(&kube::api::PostParams::default(), &listing)
        .await
        .expect("create the Service");
    let external = wait_for(
        "shop/lists-gold told its external IP is refused",
        async || {
            let s = services.get("lists-gold").await.ok()?;
            s.status?
                .conditions?
                .into_iter()
                .find(|c| c.type_ == "Announced" && c.status == "False")
        },
        log,
    )
    .await;
    assert!(
        external.message.contains("10.77.6.5")
            && external
                .message
                .contains("pool gold-pool, which does not serve"),
        "{external:?}"
    );

    // A pool for gold's Services by the label Cilium derives from the namespace: shop's Service
    // that labels itself as gold's and asks for the pool gets nothing, and is told the label is
    // reserved and ignored.
    std::fs::write(
        &manifest.0,
        "kind: LoadBalancerIPPool\nmetadata:\n  name: gold-by-label\nspec:\n  blocks:\n  \
         - cidr: 10.77.7.0/29\n  serviceSelector:\n    matchLabels: { io.kubernetes.service.namespace: gold }\n",
    )
    .unwrap();
    ipamctl_apply(&manifest.0, &config.0, &ipamctl_kubeconfig.0);
    let impostor: k8s_openapi::api::core::v1::Service = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": { "name": "claims-gold", "namespace": "shop",
                      "labels": { "io.kubernetes.service.namespace": "gold" },
                      "annotations": { "ipam-ebpf.io/address-pool": "gold-by-label" } },
        "spec": { "type": "LoadBalancer", "ports": [{ "port": 84, "protocol": "TCP" }] },
    }))
    .unwrap();
    services
        .create(&kube::api::PostParams::default(), &impostor)
        .await
        .expect("create the Service");
    let reserved = wait_for(
        "shop/claims-gold told its label is reserved",
        async || {
            let s = services.get("claims-gold").await.ok()?;
            s.status?
                .conditions?
                .into_iter()
                .find(|c| c.type_ == "LabelsAccepted" && c.status == "False")
        },
        log,
    )
    .await;
    assert!(
        reserved
            .message
            .contains("io.kubernetes.service.namespace=gold (it is shop)"),
        "{reserved:?}"
    );
    let status = services.get("claims-gold").await.unwrap().status.unwrap();
    assert!(
        status
            .load_balancer
            .and_then(|lb| lb.ingress)
            .unwrap_or_default()
            .is_empty(),
        "the impostor got an IP from gold's pool"
    );

    // The Service turned NodePort leaves LB-IPAM: its IP is given back and what LB-IPAM wrote
    // in its status (the ingress, the IPAssigned condition) is cleared in the same pass.
    services
        .patch(
            "web",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({ "spec": { "type": "NodePort" } })),
        )
        .await
        .expect("change the Service's type");
    wait_for(
        "the NodePort Service's status cleared of its LoadBalancer IP",
        async || {
            let status = services.get("web").await.ok()?.status.unwrap_or_default();
            let ingress = status
                .load_balancer
                .and_then(|lb| lb.ingress)
                .unwrap_or_default();
            let ours = status
                .conditions
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "IPAssigned");
            (ingress.is_empty() && !ours).then_some(())
        },
        log,
    )
    .await;

    // A reloaded configuration with another CIDR: the operator patches the pool's spec.
    let reloaded = std::fs::read_to_string(&config.0).unwrap().replace(
        "[\"10.243.0.0/24\"]",
        "[\"10.243.0.0/24\", \"10.244.0.0/24\"]",
    );
    std::fs::write(&config.0, reloaded).unwrap();
    operator.signal(nix::sys::signal::Signal::SIGHUP);
    wait_for(
        "the reloaded pool",
        async || {
            let p = store.get_typed::<PodIpPool>("default").await.ok()??;
            (p.value.spec.ipv4?.cidrs.len() == 2).then_some(())
        },
        log,
    )
    .await;
    // The nodes that waited get blocks from the appended CIDR.
    wait_for(
        "blocks for worker-5 and worker-6",
        async || {
            let mut served = 0;
            for n in [5, 6] {
                let node = store
                    .get_typed::<NodeIpam>(&format!("worker-{n}"))
                    .await
                    .ok()??;
                if node
                    .value
                    .status
                    .allocated
                    .iter()
                    .any(|b| b.cidr.to_string().starts_with("10.244."))
                {
                    served += 1;
                }
            }
            (served == 2).then_some(())
        },
        log,
    )
    .await;

    // The leader renews its lease (a patch) every third of operator_lease_ms.
    wait_for(
        "a renewal of the operator's lease",
        async || {
            let operator = Who::Operator.user(&api);
            api.requests()
                .iter()
                .any(|r| r.user == operator && r.resource == "leases" && r.verb == "patch")
                .then_some(())
        },
        log,
    )
    .await;

    // The workers lapsed long ago and kept their blocks, their Nodes existing; once worker-4's
    // Node is deleted, its block goes back to the pool.
    wait_for(
        "the operator to say that the lapsed workers keep their blocks",
        async || {
            log()
                .contains("its blocks stay its own while its Node object exists")
                .then_some(())
        },
        log,
    )
    .await;
    let block_of = |name: &'static str| {
        let store = store.clone();
        async move || {
            let n = store.get_typed::<NodeIpam>(name).await.ok()??;
            n.value.status.allocated.first().map(|b| b.cidr.to_string())
        }
    };
    assert!(
        block_of("worker-4")().await.is_some(),
        "worker-4 kept its block while its Node existed"
    );
    assert_eq!(
        block_of("worker-1")().await.as_deref(),
        Some("10.243.0.0/26")
    );
    nodes
        .delete("worker-4", &kube::api::DeleteParams::default())
        .await
        .expect("delete worker-4's Node");
    let record = block_of("worker-4");
    wait_for(
        "worker-4's block back in the pool",
        async || record().await.is_none().then_some(()),
        log,
    )
    .await;
    let record = store
        .get_typed::<NodeIpam>("worker-4")
        .await
        .unwrap()
        .unwrap();
    assert!(record.value.lease_lapsed(), "{:?}", record.value.status);
    assert_eq!(
        block_of("worker-1")().await.as_deref(),
        Some("10.243.0.0/26"),
        "worker-1, whose Node exists, keeps its block"
    );

    // A node that a majority of the node records reports dead (as the agents write their
    // reports, tests below check that part): the operator sets its pod not ready, and leaves
    // alone a node only a minority reports.
    api.create_namespace("wards", serde_json::json!({})).await;
    let pods = ready_pods_on(&api, "wards", &["gone-1", "gone-2"]).await;
    let counted = store
        .list_typed::<NodeIpam>()
        .await
        .unwrap()
        .iter()
        .filter(|r| !r.value.lease_lapsed())
        .count();
    // With `counted` records besides, `counted + 2` reporters of gone-1 are more than half of
    // all the records, and one report of gone-2 is not.
    let reporters: Vec<String> = (0..counted + 2).map(|i| format!("witness-{i}")).collect();
    for (i, reporter) in reporters.iter().enumerate() {
        let mut record = NodeIpam::default();
        record.spec.peers_down.push(ipam_core::resources::PeerDown {
            node: "gone-1".into(),
            evidence: "kubelet 10.9.0.1:10250: no answer within 300 ms".into(),
        });
        if i == 0 {
            record.spec.peers_down.push(ipam_core::resources::PeerDown {
                node: "gone-2".into(),
                evidence: "kubelet 10.9.0.2:10250: no answer within 300 ms".into(),
            });
        }
        store.create_typed(reporter, &record).await.unwrap();
    }
    for gone in ["gone-1", "gone-2"] {
        store
            .create_typed(gone, &NodeIpam::default())
            .await
            .unwrap();
    }
    wait_for(
        "gone-1's pod set not ready on the majority's reports",
        async || {
            let ready = pod_ready_condition(&pods.get("web-gone-1").await.ok()?)?;
            (ready.status == "False"
                && ready.reason.as_deref() == Some(ipam_kube::pod_readiness::NOT_READY_REASON))
            .then_some(())
        },
        log,
    )
    .await;
    assert_pods_ready(&pods, &["gone-1", "gone-2"], &[0]).await;

    // Every request the operator made is one deploy/base/rbac.yaml grants it, and every right it
    // is granted was used.
    assert_rights_match(&[&api], Who::Operator, "ipam-operator");
    operator.kill();
}

/// `ipamd --role agent` in a node's namespace on the Kubernetes store, in the `kubernetes` and
/// the `multi-pool` IPAM modes (each against a stand-in of its own: a cluster has one mode).
/// Together the agents' requests match the rights deploy/base/rbac.yaml gives agents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_on_the_kubernetes_api() {
    let node_mode = agent_takes_its_node_from_the_kubernetes_api().await;
    let multi_pool = pods_take_the_pool_their_annotations_name().await;
    let failover = service_ips_move_between_gossiping_agents_on_the_kubernetes_api().await;
    let bgp = bgp_sessions_on_the_kubernetes_api().await;
    assert_rights_match(
        &[&node_mode, &multi_pool, &failover, &bgp],
        Who::Agent("kn-1"),
        "ipam-agent",
    );
}

/// The first address of a successful ADD or CHECK.
fn first_address(response: &Response) -> Option<String> {
    match response {
        Response::Allocated { ips } | Response::Checked { ips } => {
            ips.first().map(|ip| ip.address.to_string())
        }
        _ => None,
    }
}

/// Creates a Node as the control plane makes it: `metadata`, one podCIDR and an InternalIP.
async fn create_node(api: &TestApi, metadata: serde_json::Value, pod_cidr: &str, address: &str) {
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(api.client().await);
    let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": metadata,
        "spec": { "podCIDRs": [pod_cidr] },
        "status": { "addresses": [{ "type": "InternalIP", "address": address }] },
    }))
    .unwrap();
    nodes
        .create(&kube::api::PostParams::default(), &node)
        .await
        .unwrap_or_else(|e| panic!("create the Node {metadata}: {e}"));
}

/// In the `kubernetes` IPAM mode the agent takes its labels, address and blocks from its Node,
/// creates its NodeIPAM and its liveness Lease, and serves pods from the Node's podCIDRs. It
/// routes to another node's pods by that node's Node, not by what its record claims: a
/// compromised kn-2 listing kn-1's block and `0.0.0.0/1` in its record draws none of that
/// traffic, and is named (issue 58).
async fn agent_takes_its_node_from_the_kubernetes_api() -> TestApi {
    let api = start_api("agent_takes_its_node_from_the_kubernetes_api").await;
    // The Node as the control plane made it.
    create_node(
        &api,
        serde_json::json!({ "name": "kn-1", "labels": { "topology.kubernetes.io/zone": "z1" } }),
        "10.245.3.0/24",
        "192.0.2.31",
    )
    .await;
    // A second node, whose agent (compromised) claims more than its Node's podCIDRs (kn-1's
    // block in part, and half the Internet) and another address than its Node's (the
    // segment's gateway, say).
    create_node(
        &api,
        serde_json::json!({ "name": "kn-2" }),
        "10.245.5.0/24",
        "192.0.2.32",
    )
    .await;
    let store = KubeStore::new(api.client().await, "ipam-system");
    let mut liar = NodeIpam::default();
    liar.spec.addresses = vec!["192.0.2.254".parse().unwrap()];
    liar.spec.pod_cidrs = ["10.245.5.0/24", "10.245.3.0/25", "0.0.0.0/1"]
        .iter()
        .map(|c| c.parse().unwrap())
        .collect();
    store
        .create_typed("kn-2", &liar)
        .await
        .expect("write kn-2's record as its agent would");
    let node = AgentNode::new(&api, "kag", "kn-1").await;
    // Its uplink towards kn-2, where pod routes go.
    let segment = ipam_tests::netns::Netns::new("kagup");
    ipam_tests::netns::veth(&node.ns, "up0", &segment, "up1");
    node.ns.add_address("up0", "192.0.2.31/24");
    let config = node.config("mode = \"kubernetes\"\nnode_name = \"kn-1\"\nuplinks = [\"up0\"]");
    let agent = node.start(&config);
    let log = || agent.log_text();

    // Its record carries the Node's podCIDRs, labels and address.
    let record = wait_for(
        "kn-1's record with the Node's podCIDRs",
        async || {
            let r = store.get_typed::<NodeIpam>("kn-1").await.ok()??;
            (!r.value.spec.pod_cidrs.is_empty() && !r.value.spec.addresses.is_empty()).then_some(r)
        },
        log,
    )
    .await;
    assert_eq!(record.value.spec.pod_cidrs[0].to_string(), "10.245.3.0/24");
    assert_eq!(
        record.value.spec.labels["topology.kubernetes.io/zone"],
        "z1"
    );
    assert_eq!(record.value.spec.addresses[0].to_string(), "192.0.2.31");
    // kn-2's pods are routed by its Node's podCIDRs alone, through its Node's InternalIP.
    let routed = || -> Vec<String> {
        node.ns
            .routes(false)
            .iter()
            .filter(|r| r.gateway.is_some())
            .map(|r| {
                let via = r.gateway.map(|g| g.to_string()).unwrap_or_default();
                format!("{}/{} via {via}", r.destination, r.prefix_len)
            })
            .collect()
    };
    wait_for(
        "kn-1's route to kn-2's pods, and kn-2's record named",
        async || {
            (routed().contains(&"10.245.5.0/24 via 192.0.2.32".to_owned())
                && log().contains("node kn-2's record claims podCIDRs its Node does not have")
                && log().contains(
                    "node kn-2's record lists addresses its pods are not routed through \
                     (192.0.2.254)",
                ))
            .then_some(())
        },
        log,
    )
    .await;
    assert_eq!(
        routed(),
        ["10.245.5.0/24 via 192.0.2.32"],
        "only the Node's podCIDRs are routed, through the Node's address, not what kn-2's \
         record claims"
    );
    // The admission policy keeps an agent to its own node's objects: kn-1's agent may not write
    // another node's record. Only a real API server runs admission; the stand-in does none
    // (tests/tests/admission.rs evaluates the policy's CEL offline for both).
    match &api {
        TestApi::Real(_) => {
            let as_agent = agent_client(&api, &node.token).await;
            let e = KubeStore::new(as_agent, "ipam-system")
                .create_typed("kn-9", &NodeIpam::default())
                .await
                .expect_err("the agent of kn-1 wrote kn-9's record");
            assert!(
                e.to_string().contains("may write only kn-1"),
                "refused, but not by the admission policy: {e}"
            );
        }
        TestApi::StandIn(_) => admission_not_checked("a write of kn-9's record"),
    }
    // Its liveness lease, renewed (with one write: the agent holds the version it wrote).
    wait_for(
        "kn-1's lease renewed",
        async || {
            let agent = Who::Agent("kn-1").user(&api);
            api.requests()
                .iter()
                .any(|r| r.user == agent && r.resource == "leases" && r.verb == "patch")
                .then_some(())
        },
        log,
    )
    .await;
    // A pod gets an address from the Node's podCIDRs.
    let allocated = wait_for(
        "a pod address",
        async || first_address(&node.add("kpod-1", None)),
        log,
    )
    .await;
    assert!(allocated.starts_with("10.245.3."), "{allocated}");
    agent.kill();
    api
}

/// BGP on the Kubernetes store: an agent with `[bgp]` reads the BGPPeers, BGPAdvertisements
/// and pools, and writes its session into the peer's status (through the status subresource,
/// the spec untouched). The peer is this node's own loopback (a multihop peer: it is on no
/// network of the node's interfaces), where nothing listens: the session is refused, and the
/// status says so.
async fn bgp_sessions_on_the_kubernetes_api() -> TestApi {
    use ipam_core::lb::bgp::{BgpAdvertisement, BgpPeer};
    let api = start_api("bgp_sessions_on_the_kubernetes_api").await;
    create_node(
        &api,
        serde_json::json!({ "name": "kn-1" }),
        "10.245.4.0/24",
        "192.0.2.41",
    )
    .await;
    let store = KubeStore::new(api.client().await, "ipam-system");
    let peer: BgpPeer = serde_json::from_value(serde_json::json!({ "spec": {
        "peerAddress": "127.0.0.1", "peerPort": 1790, "peerASN": 64500, "localASN": 64512,
        "connectRetryTimeSeconds": 1, "ebgpMultihop": 2
    }}))
    .unwrap();
    store
        .create_typed("tor", &peer)
        .await
        .expect("create the BGPPeer");
    let advertisement: BgpAdvertisement =
        serde_json::from_value(serde_json::json!({ "spec": {} })).unwrap();
    store
        .create_typed("all", &advertisement)
        .await
        .expect("create the BGPAdvertisement");
    // A peer whose password is in a Secret not created yet.
    let guarded: BgpPeer = serde_json::from_value(serde_json::json!({ "spec": {
        "peerAddress": "127.0.0.2", "peerPort": 1790, "peerASN": 64501, "localASN": 64512,
        "connectRetryTimeSeconds": 1, "ebgpMultihop": 2,
        "passwordSecretRef": { "name": "bgp-tor2" }
    }}))
    .unwrap();
    store
        .create_typed("tor2", &guarded)
        .await
        .expect("create the BGPPeer with a Secret reference");
    let node = AgentNode::new(&api, "kbg", "kn-1").await;
    let config = node.config("mode = \"kubernetes\"\nnode_name = \"kn-1\"");
    let mut text = std::fs::read_to_string(&config.0).unwrap();
    text.push_str(&format!(
        "\n[bgp]\nrun_dir = \"{}/bgp\"\nstatus_interval_ms = 200\n",
        node.dir.0.display()
    ));
    std::fs::write(&config.0, text).unwrap();
    let agent = node.start(&config);
    let log = || agent.log_text();
    let session = wait_for(
        "kn-1's session in the BGPPeer's status",
        async || {
            let p = store.get_typed::<BgpPeer>("tor").await.ok()??;
            p.value
                .status
                .nodes
                .into_iter()
                .find(|n| n.node == "kn-1" && n.reason.starts_with("ConnectionRefused"))
        },
        log,
    )
    .await;
    assert_ne!(session.state, "Established");
    // No Secret: no session, and the status says which Secret to create.
    let reason_of = async |peer: &str| {
        let p = store.get_typed::<BgpPeer>(peer).await.ok()??;
        p.value
            .status
            .nodes
            .into_iter()
            .find(|n| n.node == "kn-1")
            .map(|n| n.reason)
    };
    let missing = wait_for(
        "tor2 held back for its missing Secret",
        async || {
            reason_of("tor2")
                .await
                .filter(|r| r.starts_with("PasswordUnavailable"))
        },
        log,
    )
    .await;
    assert!(
        missing.contains("ipam-bgp-secrets/bgp-tor2 does not exist"),
        "{missing}"
    );
    // The Secret created (with the line break a file leaves) in the namespace set aside for
    // BGP passwords: the agent reads it, with the rights its Role there grants (and none on the
    // Secrets of its own namespace), and opens the session with the password.
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(api.client().await, "ipam-bgp-secrets");
    let secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": "bgp-tor2", "namespace": "ipam-bgp-secrets" },
        // "fabric-key-2\n" (the stand-in does not turn stringData into data).
        "data": { "password": "ZmFicmljLWtleS0yCg==" },
    }))
    .unwrap();
    secrets
        .create(&kube::api::PostParams::default(), &secret)
        .await
        .expect("create the Secret");
    wait_for(
        "tor2's session opened with the Secret's password",
        // Nothing listens there: with a password the kernel's unsigned resets are dropped, and
        // the reason says a password is set.
        async || {
            reason_of("tor2")
                .await
                .filter(|r| r.starts_with("NoAnswer") && r.contains("with a password set"))
        },
        log,
    )
    .await;
    let bird_conf = std::fs::read_to_string(node.dir.0.join("bgp/bird.conf")).unwrap();
    assert!(
        bird_conf.contains("password \"fabric-key-2\";"),
        "{bird_conf}"
    );
    let tor = store.get_typed::<BgpPeer>("tor").await.unwrap().unwrap();
    assert_eq!(tor.value.spec, peer.spec, "the agent wrote the status only");
    let condition = &tor.value.status.conditions[0];
    assert_eq!(condition.kind, "Established");
    assert!(
        !condition.status && condition.message.contains("kn-1"),
        "{condition:?}"
    );
    // With kn-1's agent's token, another node's session cannot be written into the status (the
    // admission policy; its own was, above). Only a real API server runs admission.
    match &api {
        TestApi::Real(_) => {
            let as_agent = KubeStore::new(agent_client(&api, &node.token).await, "ipam-system");
            let mut refused = None;
            // The agent itself may write the status meanwhile: a conflict is read again.
            for _ in 0..5 {
                let current = store.get_typed::<BgpPeer>("tor").await.unwrap().unwrap();
                let mut forged = current.value.clone();
                let mut other = forged.status.nodes[0].clone();
                other.node = "kn-7".into();
                other.state = "Established".into();
                forged.status.nodes.push(other);
                match as_agent
                    .update_status_typed("tor", &forged, &current.revision)
                    .await
                {
                    Err(ipam_core::store::StoreError::Conflict { .. }) => continue,
                    Err(e) => refused = Some(e),
                    Ok(_) => panic!("kn-1's agent wrote kn-7's session"),
                }
                break;
            }
            let e = refused.expect("a write not always in conflict");
            assert!(
                e.to_string().contains("may write only its own session"),
                "refused, but not by the admission policy: {e}"
            );
        }
        TestApi::StandIn(_) => admission_not_checked("a write of kn-7's BGP session"),
    }
    agent.kill();
    api
}

/// Says that the admission policy's refusal of kn-1's agent's `write` was not checked: only
/// a real API server runs admission.
fn admission_not_checked(write: &str) {
    ipam_tests::not_checked(
        &format!("the admission policy refusing kn-1's agent {write}"),
        "the stand-in runs no admission (set KUBEBUILDER_ASSETS to run a real API server; \
         tests/tests/admission.rs evaluates the policy's CEL offline)",
    );
}

/// A client that authenticates with an agent's service account `token`.
async fn agent_client(api: &TestApi, token: &str) -> kube::Client {
    let kubeconfig =
        kube::config::Kubeconfig::from_yaml(&api.kubeconfig(api.address(), token)).unwrap();
    kube::Client::try_from(
        kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .unwrap(),
    )
    .unwrap()
}

/// Multi-pool mode: the agent reads its node's Pods and the Namespaces, and a pod takes its
/// address from the pool its own or its namespace's `ipam-ebpf.io/ip-pool` annotation names,
/// else from the node's pool; a pool restricted to namespaces, by name or by a selector on their
/// labels, serves only their pods. A wrong annotation, a pool of another tenant's namespace, or a
/// pod the API does not show on the node, gets an error that says so. A restarted agent restores every pool's allocations.
async fn pods_take_the_pool_their_annotations_name() -> TestApi {
    use k8s_openapi::api::core::v1::Pod;
    let api = start_api("pods_take_the_pool_their_annotations_name").await;
    // The operator serves the blocks of both pools.
    let operator_config = operator_config(
        "mode = \"multi-pool\"\n\
         [[ipam.pool]]\nname = \"default\"\nipv4 = { cidrs = [\"10.246.0.0/24\"], maskSize = 28 }\n\
         [[ipam.pool]]\nname = \"tenant-a\"\nipv4 = { cidrs = [\"10.247.0.0/24\"], maskSize = 28 }\n\
         namespaces = [\"shop\"]\n\
         [[ipam.pool]]\nname = \"blue\"\nipv4 = { cidrs = [\"10.248.0.0/24\"], maskSize = 28 }\n\
         namespaceSelector = { matchLabels = { team = \"blue\" } }\n",
    );
    let operator_kubeconfig = kubeconfig_for(&api, Who::Operator).await;
    let operator = Daemon::start_on_host(
        &operator_config.0,
        &["--role", "operator"],
        &[("KUBECONFIG", &operator_kubeconfig.0)],
    );
    // A namespace that names a pool, one that does not, and pods bound to the node.
    api.create_namespace(
        "shop",
        serde_json::json!({ "ipam-ebpf.io/ip-pool": "tenant-a" }),
    )
    .await;
    api.create_namespace("plain", serde_json::json!({})).await;
    // A namespace the blue pool selects by its label.
    api.create_namespace("paint", serde_json::json!({})).await;
    kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(api.client().await)
        .patch(
            "paint",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                serde_json::json!({ "metadata": { "labels": { "team": "blue" } } }),
            ),
        )
        .await
        .expect("label namespace paint");
    let blue = serde_json::json!({ "ipam-ebpf.io/ip-pool": "blue" });
    for (namespace, name, node, annotations) in [
        ("paint", "art", "kn-2", blue.clone()),
        ("plain", "sneak", "kn-2", blue),
        ("shop", "web", "kn-2", serde_json::json!({})),
        ("plain", "db", "kn-2", serde_json::json!({})),
        (
            "plain",
            "typo",
            "kn-2",
            serde_json::json!({ "ipam-ebpf.io/ip-pool": "tenant-b" }),
        ),
        ("plain", "elsewhere", "kn-3", serde_json::json!({})),
        (
            "plain",
            "intruder",
            "kn-2",
            serde_json::json!({ "ipam-ebpf.io/ip-pool": "tenant-a" }),
        ),
    ] {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": name, "namespace": namespace, "annotations": annotations },
            "spec": { "nodeName": node, "containers": [{ "name": "c", "image": "registry.invalid/c" }] },
        }))
        .unwrap();
        kube::Api::<Pod>::namespaced(api.client().await, namespace)
            .create(&kube::api::PostParams::default(), &pod)
            .await
            .expect("create a Pod");
    }

    let node = AgentNode::new(&api, "kmp", "kn-2").await;
    let config = node.config("mode = \"multi-pool\"\nnode_name = \"kn-2\"");
    let mut agent = node.start(&config);
    let log = || format!("{}\noperator:\n{}", agent.log_text(), operator.log_text());

    // Pods wired by ipam-cni as the runtime runs it, with K8S_POD_NAMESPACE and K8S_POD_NAME.
    // No annotation: the node's pool.
    let (db_ns, web_ns) = (
        ipam_tests::netns::Netns::new("kmp-db"),
        ipam_tests::netns::Netns::new("kmp-web"),
    );
    let added = ipam_tests::pod_net::result_address;
    // ADDs until one is served, as the kubelet retries.
    let served = |container: &'static str, pod: (&'static str, &'static str), ns| {
        let node = &node;
        async move || match node.cni("ADD", container, pod, ns) {
            (true, result) => added(&result),
            _ => None,
        }
    };
    let db = wait_for(
        "plain/db's address",
        served("c-db", ("plain", "db"), &db_ns),
        log,
    )
    .await;
    assert!(db.starts_with("10.246.0."), "{db}");
    // Fixed addresses asked for by annotation, this project's and Calico's, in the node's
    // block of the pod's pool; one outside it is refused with the reason.
    let db_ip: std::net::Ipv4Addr = db.split('/').next().unwrap().parse().unwrap();
    let base = db_ip.octets()[3] & !15;
    let (ours, calico) = (
        format!("10.246.0.{}", base + 9),
        format!("10.246.0.{}", base + 10),
    );
    let outside = format!("10.246.0.{}", base.wrapping_add(16 + 9));
    for (name, annotations) in [
        (
            "fixed",
            serde_json::json!({ "ipam-ebpf.io/ip-addresses": ours }),
        ),
        (
            "calico",
            serde_json::json!({ "cni.projectcalico.org/ipAddrs": format!("[\"{calico}\"]") }),
        ),
        (
            "away",
            serde_json::json!({ "ipam-ebpf.io/ip-addresses": outside }),
        ),
    ] {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": name, "namespace": "plain", "annotations": annotations },
            "spec": { "nodeName": "kn-2", "containers": [{ "name": "c", "image": "registry.invalid/c" }] },
        }))
        .unwrap();
        kube::Api::<Pod>::namespaced(api.client().await, "plain")
            .create(&kube::api::PostParams::default(), &pod)
            .await
            .expect("create a Pod");
    }
    for (container, pod, wanted) in [
        ("c-fixed", "plain/fixed", &ours),
        ("c-calico", "plain/calico", &calico),
    ] {
        let got = wait_for(
            "a pod's annotated address",
            async || first_address(&node.add(container, Some(pod))),
            log,
        )
        .await;
        assert_eq!(&got, wanted, "{pod}");
    }
    let Response::Error { message, .. } = node.add("c-away", Some("plain/away")) else {
        panic!("a pod asking for an address outside the node's block gets none");
    };
    assert!(
        message.contains("plain/away")
            && message.contains(&outside)
            && message.contains("pool default"),
        "{message}"
    );
    // The namespace's annotation: the first ADD asks for a block of tenant-a and is told to try
    // again (CNI code 11), which the kubelet does; a later one gets an address of it.
    let (ok, refusal) = node.cni("ADD", "c-web", ("shop", "web"), &web_ns);
    assert!(
        !ok,
        "the first pod of tenant-a waits for a block: {refusal}"
    );
    assert_eq!(refusal["code"], 11, "{refusal}");
    let message = refusal["msg"].as_str().unwrap_or_default();
    assert!(
        message.contains("pool tenant-a") && message.contains("namespace annotation"),
        "{refusal}"
    );
    let web = wait_for(
        "shop/web's address",
        served("c-web", ("shop", "web"), &web_ns),
        log,
    )
    .await;
    assert!(web.starts_with("10.247.0."), "{web}");
    // The two pools' pods reach each other through the node's datapath, both ways.
    assert!(
        ipam_tests::pod_net::reaches(&web_ns, &db),
        "shop/web ({web}) cannot reach plain/db ({db})\n{}",
        log()
    );
    assert!(
        ipam_tests::pod_net::reaches(&db_ns, &web),
        "plain/db cannot reach shop/web"
    );
    // A pool that does not exist, named on the pod.
    let Response::Error { message, .. } = node.add("c-typo", Some("plain/typo")) else {
        panic!("a pod naming a missing pool gets no address");
    };
    assert!(
        message.contains("plain/typo")
            && message.contains("ipam-ebpf.io/ip-pool=tenant-b")
            && message.contains("default, tenant-a"),
        "{message}"
    );
    // A pod of another namespace naming tenant-a's pool, which serves only shop.
    let Response::Error { message, .. } = node.add("c-intruder", Some("plain/intruder")) else {
        panic!("a pod naming another tenant's pool gets no address");
    };
    assert!(
        message.contains("plain/intruder")
            && message.contains(
                "pool tenant-a, which serves only pods of the namespaces shop, not plain"
            ),
        "{message}"
    );
    // The blue pool serves the namespaces its namespaceSelector selects by their labels: paint,
    // labelled team=blue, and not plain.
    let art = wait_for(
        "paint/art's address from the blue pool",
        async || first_address(&node.add("c-art", Some("paint/art"))),
        log,
    )
    .await;
    assert!(art.starts_with("10.248.0."), "{art}");
    let Response::Error { message, .. } = node.add("c-sneak", Some("plain/sneak")) else {
        panic!("a pod of a namespace the blue pool does not select gets no address");
    };
    assert!(
        message.contains("plain/sneak")
            && message.contains(
                "pool blue, which serves only pods of namespaces its namespaceSelector selects, \
                 and plain's labels do not match it"
            ),
        "{message}"
    );
    // A pod bound to another node.
    let Response::Error { message, .. } = node.add("c-else", Some("plain/elsewhere")) else {
        panic!("a pod of another node gets no address here");
    };
    assert!(message.contains("spec.nodeName=kn-2"), "{message}");

    // The node's record holds a block of each pool.
    let store = KubeStore::new(api.client().await, "ipam-system");
    let record = store
        .get_typed::<NodeIpam>("kn-2")
        .await
        .unwrap()
        .expect("kn-2's record");
    let pools: BTreeSet<&str> = record
        .value
        .status
        .allocated
        .iter()
        .map(|b| b.pool.as_str())
        .collect();
    assert_eq!(
        pools,
        BTreeSet::from(["blue", "default", "tenant-a"]),
        "{record:?}"
    );

    // Restarted, the agent still knows both pods' addresses, in their pools.
    agent.kill();
    agent = node.start(&config);
    let log = || agent.log_text();
    let checked = wait_for(
        "shop/web's address after the restart",
        async || first_address(&node.call(&Request::Check(attachment("c-web", Some("shop/web"))))),
        log,
    )
    .await;
    assert_eq!(checked, web);
    // A repeated ADD gets the same address; right after the restart the agent may still be
    // reading the pods of its node (a real API server is slower to list them than the
    // stand-in) and answer "try again", which the kubelet does.
    let again = wait_for(
        "plain/db's address from a repeated ADD after the restart",
        async || first_address(&node.add("c-db", Some("plain/db"))),
        log,
    )
    .await;
    assert_eq!(again, db);
    assert!(
        ipam_tests::pod_net::reaches(&web_ns, &db),
        "after the restart"
    );
    // DEL finds the pod's address in its pool and frees it.
    let (ok, result) = node.cni("DEL", "c-web", ("shop", "web"), &web_ns);
    assert!(ok, "DEL of shop/web: {result}");
    match node.call(&Request::Check(attachment("c-web", Some("shop/web")))) {
        Response::Error { code, .. } => assert_eq!(code, ErrorCode::Unknown),
        other => panic!("shop/web still holds an address after DEL: {other:?}"),
    }
    agent.kill();
    operator.kill();
    api
}

/// Service IPs move between agents that gossip, on the Kubernetes API: three agents in
/// namespaces on one bridge (each reaching the API on its own loopback), the operator on the
/// host, a client on the bridge. The node answering for a Service's IP loses power: another
/// answers, and the client never gets two answers to one request. The node comes back, takes
/// its IP back and loses power again: the Service's events say which node answers, and how
/// often it started to. No agent lists or watches a Lease. With `externalTrafficPolicy: Local`
/// only the node with the ready endpoint in the Service's EndpointSlice answers, and with
/// none ready nobody does and the Service's condition says so. First, a rolling restart of the
/// agents (`on_stop = "auto"`) moves no IP: every request answered by its one owner.
async fn service_ips_move_between_gossiping_agents_on_the_kubernetes_api() -> TestApi {
    use ipam_tests::{
        arp_watch::{ArpWatch, double_answers},
        failover::{CLIENT, segment_pool, uplink_policy},
        netns::{Netns, veth},
        resolve::Resolver,
    };
    let api = start_api("service_ips_move_between_gossiping_agents_on_the_kubernetes_api").await;
    let kubeconfig = kubeconfig_for(&api, Who::Operator).await;
    let config = operator_config(&format!("mode = \"cluster-pool\"\n{POOLS}"));
    let start_operator = || {
        Daemon::start_on_host(
            &config.0,
            &["--role", "operator"],
            &[("KUBECONFIG", &kubeconfig.0)],
        )
    };
    // Behind a lock, as the agents: the test replaces it.
    let operator = std::sync::Mutex::new(start_operator());

    let fabric = Netns::new("kgf");
    fabric.add_bridge("br0");
    let key = TempFile::new("kube-gossip", "key");
    std::fs::write(&key.0, ipam_tests::cluster::random_key_hex()).unwrap();
    let names = ["kg-0", "kg-1", "kg-2"];
    let mut nodes = Vec::new();
    // Behind a lock: the failure messages read their logs while the test kills one.
    let agents = std::sync::Mutex::new(Vec::new());
    for (i, name) in names.into_iter().enumerate() {
        let node = AgentNode::new(&api, &format!("kg{i}"), name).await;
        veth(&node.ns, "up0", &fabric, &format!("kgp{i}"));
        fabric.add_port(&format!("kgp{i}"), "br0");
        let address = format!("10.77.0.{}", i + 1);
        node.ns.add_address("up0", &format!("{address}/24"));
        let ipam = format!("mode = \"cluster-pool\"\nnode_name = \"{name}\"\nuplinks = [\"up0\"]");
        let config = node.config_gossiping(&ipam, &address, &key.0);
        // As deploy/ says: a stop is a restart unless the node is drained.
        let mut text = std::fs::read_to_string(&config.0).unwrap();
        text.push_str("\n[node]\non_stop = \"auto\"\n");
        std::fs::write(&config.0, text).unwrap();
        agents.lock().unwrap().push(Some(node.start(&config)));
        nodes.push((node, config));
    }
    // Each node's kubelet port, the second signal the agents probe before they report a node
    // dead: a socket listening in the node's namespace (no kubelet runs here), answered by its
    // kernel while the node's link is up.
    let _kubelets: Vec<std::net::TcpListener> = nodes
        .iter()
        .map(|(node, _)| {
            node.ns
                .run(|| std::net::TcpListener::bind(("0.0.0.0", KUBELET_PORT)))
                .expect("listen on the kubelet's port in the node's namespace")
        })
        .collect();
    let client = Netns::new("kgc");
    veth(&client, "eth0", &fabric, "kgpc");
    fabric.add_port("kgpc", "br0");
    client.add_address("eth0", &format!("{CLIENT}/24"));
    let logs = || {
        let mut all = operator.lock().unwrap().log_text();
        for a in agents.lock().unwrap().iter().flatten() {
            all += &a.log_text();
        }
        all
    };

    let store = KubeStore::new(api.client().await, "ipam-system");
    store.create_typed("lb", &segment_pool()).await.unwrap();
    store
        .create_typed("uplinks", &uplink_policy())
        .await
        .unwrap();
    let services = create_web_service(&api).await;
    let pods = ready_pods_on(&api, "shop", &names).await;
    let ip: std::net::Ipv4Addr = wait_for(
        "the Service's ingress IP",
        async || {
            let s = services.get("web").await.ok()?;
            s.status?
                .load_balancer?
                .ingress?
                .first()?
                .ip
                .clone()?
                .parse()
                .ok()
        },
        &logs,
    )
    .await;
    let macs: Vec<[u8; 6]> = nodes.iter().map(|(n, _)| n.ns.mac("up0")).collect();
    // The MACs that answer a request (the watch's requests are answered too, hence the dedup).
    let answers = || {
        let mut macs = client
            .run(move || Resolver::new("eth0").arp_all(CLIENT, ip, Duration::from_millis(150)));
        macs.sort_unstable();
        macs.dedup();
        macs
    };
    // The owner once the gossip has settled: the same single node in five answers in a row. A
    // node that has not yet seen the others' records counts itself alone and answers for a
    // moment at start; taking it for the owner would make the return check below wait for
    // a node that never owned the IP.
    let owner = wait_for(
        "one node answering for the Service's IP, the same five times in a row",
        async || {
            let first = match answers().as_slice() {
                [one] => *one,
                _ => return None,
            };
            for _ in 0..4 {
                if answers() != [first] {
                    return None;
                }
            }
            macs.iter().position(|m| *m == first)
        },
        &logs,
    )
    .await;

    // A rolling restart of the three agents, as the DaemonSet's rollout goes: each stop is a
    // restart (`auto`, no node drained, the DaemonSet still there), the IP stays with its owner
    // and every request is answered by it alone; each next agent ends its node's restart
    // notice. The next agents run as the DaemonSet's pods (`POD_NAME`, `POD_NAMESPACE`).
    let agent_pods = AgentPods::create(&api, &names).await;
    // The next agent on node `i`, as the DaemonSet's pod, once it has ended its restart notice.
    let next_agent_as_pod = async |i: usize| {
        let pod = agent_pods.pod(i);
        agents.lock().unwrap()[i] = Some(nodes[i].0.start_as_pod(&nodes[i].1, SYSTEM, &pod));
        wait_for(
            &format!("{}'s next agent to end its restart notice", names[i]),
            async || {
                let record = store.get_typed::<NodeIpam>(names[i]).await.ok()??;
                record.value.spec.restarting.is_none().then_some(())
            },
            &logs,
        )
        .await;
    };
    let watch = ArpWatch::start(&client, CLIENT, ip, Instant::now());
    for i in 0..nodes.len() {
        let stopping = agents.lock().unwrap()[i].take().expect("the agent runs");
        // Its stop writes the notice through the API server, which runs on this runtime too.
        tokio::task::block_in_place(|| stopping.terminate());
        tokio::time::sleep(Duration::from_millis(1500)).await;
        next_agent_as_pod(i).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let samples = watch.stop();
    let wrong: Vec<_> = samples.iter().filter(|s| s.macs != [macs[owner]]).collect();
    assert!(
        wrong.is_empty(),
        "{ip} during the rolling restart: {} of {} requests not answered by {} alone: {:x?}\n{}",
        wrong.len(),
        samples.len(),
        names[owner],
        wrong.iter().take(10).collect::<Vec<_>>(),
        logs()
    );

    // An agent that runs as the DaemonSet's pod stops as for a restart while the DaemonSet is
    // there (a rollout)...
    let leaving = (owner + 1) % names.len();
    let stopping = agents.lock().unwrap()[leaving]
        .take()
        .expect("the agent runs");
    let log = tokio::task::block_in_place(|| stopping.terminate());
    assert!(
        log.contains("on_stop = \"auto\": the node may announce: stopping as for a restart"),
        "{}'s agent took a rollout's stop for something else:\n{log}",
        names[leaving]
    );
    next_agent_as_pod(leaving).await;
    // ...and as for a leave once it is deleted, an uninstall (no restart notice, the IPs
    // handed over at once): the DaemonSet alone tells the two apart.
    agent_pods.delete_daemon_set().await;
    let stopping = agents.lock().unwrap()[leaving]
        .take()
        .expect("the agent runs");
    let log = tokio::task::block_in_place(|| stopping.terminate());
    assert!(
        log.contains(&format!(
            "DaemonSet {SYSTEM}/ipam-agent is gone: an uninstall: stopping as for a leave"
        )),
        "{}'s agent did not take its stop for an uninstall:\n{log}",
        names[leaving]
    );
    let record = store
        .get_typed::<NodeIpam>(names[leaving])
        .await
        .unwrap()
        .expect("the record");
    assert_eq!(
        record.value.spec.restarting, None,
        "an uninstall promises no return"
    );
    agents.lock().unwrap()[leaving] = Some(nodes[leaving].0.start(&nodes[leaving].1));
    // An agent decides who answers only once its fence has opened: the node's death below is
    // then one it saw happen (an IP taken over from a dead node), not one before its first
    // decision (an IP it owns as it starts).
    wait_for(
        "the restarted agent's gossip fence open",
        async || {
            let log = agents.lock().unwrap()[leaving].as_ref()?.log_text();
            log.contains("gossip fence open").then_some(())
        },
        &logs,
    )
    .await;

    let watch = ArpWatch::start(&client, CLIENT, ip, Instant::now());
    let killed = agents.lock().unwrap()[owner].take();
    killed.expect("the owner's agent").kill();
    nodes[owner].0.ns.down("up0");
    let next = wait_for(
        "another node answering for the Service's IP",
        async || match answers().as_slice() {
            [one] => macs.iter().position(|m| m == one).filter(|n| *n != owner),
            _ => None,
        },
        &logs,
    )
    .await;
    let samples = watch.stop();
    assert!(
        double_answers(&samples).is_empty(),
        "two answers for {ip}: {:?}",
        double_answers(&samples)
    );
    println!("{ip} moved from {} to {}", names[owner], names[next]);

    // The two others report the dead node (the gossip and its silent kubelet port), and the
    // operator sets its pod not ready, as the node lifecycle controller would much later; the
    // others' pods stay ready.
    let dead_pod = format!("web-{}", names[owner]);
    wait_for(
        "the dead node's pod set not ready on the two other nodes' reports",
        async || {
            let pod = pods.get(&dead_pod).await.ok()?;
            let ready = pod_ready_condition(&pod)?;
            (ready.status == "False"
                && ready.reason.as_deref() == Some(ipam_kube::pod_readiness::NOT_READY_REASON)
                && ready.message.as_deref().is_some_and(|m| {
                    m.contains(&format!(
                        "node {} is dead: 2 of 3 nodes report it",
                        names[owner]
                    )) && m.contains("no answer within")
                }))
            .then_some(())
        },
        &logs,
    )
    .await;
    assert_pods_ready(&pods, &names, &[owner]).await;
    let marked_condition = async || {
        let record = store.get_typed::<NodeIpam>(names[owner]).await.ok()??;
        record
            .value
            .status
            .conditions
            .into_iter()
            .find(|c| c.kind == ipam_core::resources::PODS_MARKED_NOT_READY)
    };
    let marked = marked_condition().await;
    assert!(
        marked.as_ref().is_some_and(|c| c.status),
        "the dead node's record does not say its pods were marked: {marked:?}"
    );

    // Its kubelet's word last: the pod set ready again (as a kubelet that still ran would),
    // then an operator replica taking over while the reports stand reads the record and
    // leaves the pod alone.
    pods.patch_status(
        &dead_pod,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(serde_json::json!({ "status": { "conditions": [
            { "type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:01Z" },
        ] } })),
    )
    .await
    .expect("set the dead node's pod ready as its kubelet would");
    *operator.lock().unwrap() = start_operator();
    // The new replica's first pass follows its first list of the records, within a second.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        assert_pods_ready(&pods, &names, &[]).await;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        operator
            .lock()
            .unwrap()
            .log_text()
            .contains("were set not ready by an operator before this one"),
        "the new operator did not say it found the marking in the record:\n{}",
        logs()
    );

    let agent = Who::Agent("kg-0").user(&api);
    let lease_verbs: BTreeSet<String> = api
        .requests()
        .into_iter()
        .filter(|r| r.user == agent && r.resource == "leases")
        .map(|r| r.verb)
        .collect();
    assert!(
        !lease_verbs.contains("list") && !lease_verbs.contains("watch"),
        "the agents read the others' leases: {lease_verbs:?}"
    );

    // The owner comes back and takes its IP back (ownership is a function of who is alive);
    // it loses power again and the same node takes over again.
    nodes[owner].0.ns.up("up0");
    let restarted = nodes[owner].0.start(&nodes[owner].1);
    agents.lock().unwrap()[owner] = Some(restarted);
    wait_for(
        "the returning node answering for the Service's IP again",
        async || (answers() == [macs[owner]]).then_some(()),
        &logs,
    )
    .await;
    let killed = agents.lock().unwrap()[owner].take();
    killed.expect("the owner's agent").kill();
    nodes[owner].0.ns.down("up0");
    wait_for(
        "the same node taking the Service's IP over again",
        async || (answers() == [macs[next]]).then_some(()),
        &logs,
    )
    .await;

    // `kubectl describe service web` says which node answers now, why (its previous owner
    // died), and how often it started to.
    let events: kube::Api<k8s_openapi::api::events::v1::Event> =
        kube::Api::namespaced(api.client().await, "shop");
    let new_owner = names[next];
    wait_for(
        "an event on the Service naming the node that answers now, seen twice",
        async || {
            let list = events.list(&kube::api::ListParams::default()).await.ok()?;
            list.items.into_iter().find(|e| {
                e.reason.as_deref() == Some("IPTakenOver")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("web")
                    && e.note.as_deref().is_some_and(|n| {
                        n.contains(new_owner)
                            && n.contains(&format!("took it over from {}", names[owner]))
                            && n.contains("no longer alive")
                    })
                    && e.series.as_ref().is_some_and(|s| s.count >= 2)
            })
        },
        &logs,
    )
    .await;

    // A Node being drained (cordoned), then one the kubelet reports NotReady, stops answering
    // (both configured here; MetalLB's defaults leave them on): the other live node answers
    // alone, and the first answers again once it is back.
    let other = 3 - owner - next;
    let kube_nodes: kube::Api<k8s_openapi::api::core::v1::Node> =
        kube::Api::all(api.client().await);
    if kube_nodes.get_opt(names[next]).await.unwrap().is_none() {
        let node =
            serde_json::from_value(serde_json::json!({ "metadata": { "name": names[next] } }))
                .unwrap();
        kube_nodes.create(&Default::default(), &node).await.unwrap();
    }
    let merge = |patch: serde_json::Value| kube::api::Patch::Merge(patch);
    let params = kube::api::PatchParams::default();
    for (what, patch, back, status) in [
        (
            "cordoned",
            serde_json::json!({ "spec": { "unschedulable": true } }),
            serde_json::json!({ "spec": { "unschedulable": false } }),
            false,
        ),
        (
            "NotReady",
            serde_json::json!({ "status": { "conditions": [
                { "type": "Ready", "status": "False", "reason": "KubeletNotReady" } ] } }),
            serde_json::json!({ "status": { "conditions": [
                { "type": "Ready", "status": "True", "reason": "KubeletReady" } ] } }),
            true,
        ),
    ] {
        let write = async |patch| {
            let written = if status {
                kube_nodes
                    .patch_status(names[next], &params, &merge(patch))
                    .await
            } else {
                kube_nodes.patch(names[next], &params, &merge(patch)).await
            };
            written.unwrap_or_else(|e| panic!("mark {} {what}: {e}", names[next]));
        };
        write(patch).await;
        wait_for(
            &format!(
                "the other node answering alone while {} is {what}",
                names[next]
            ),
            async || (answers() == [macs[other]]).then_some(()),
            &logs,
        )
        .await;
        write(back).await;
        wait_for(
            &format!(
                "{} answering again once it is no longer {what}",
                names[next]
            ),
            async || (answers() == [macs[next]]).then_some(()),
            &logs,
        )
        .await;
    }

    // externalTrafficPolicy Local: only a node with a ready endpoint in the Service's
    // EndpointSlices answers. The slices are written here as the EndpointSlice controller
    // would (no controller manager runs beside either API server); a real cluster's must
    // confirm that its controller keeps `nodeName` and `conditions.ready` as read here.
    services
        .patch(
            "web",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({
                "spec": { "externalTrafficPolicy": "Local" }
            })),
        )
        .await
        .expect("make the Service's traffic policy Local");
    let slices: kube::Api<k8s_openapi::api::discovery::v1::EndpointSlice> =
        kube::Api::namespaced(api.client().await, "shop");
    let slice = |node: &str, ready: bool| {
        serde_json::from_value::<k8s_openapi::api::discovery::v1::EndpointSlice>(
            serde_json::json!({
                "metadata": {
                    "name": "web-abcde",
                    "labels": { ipam_kube::SERVICE_NAME_LABEL: "web" }
                },
                "addressType": "IPv4",
                "endpoints": [{
                    "addresses": ["10.1.0.5"],
                    "nodeName": node,
                    "conditions": { "ready": ready }
                }],
                "ports": [{ "port": 80, "protocol": "TCP" }]
            }),
        )
        .expect("an EndpointSlice")
    };
    slices
        .create(&Default::default(), &slice(names[other], true))
        .await
        .expect("create the Service's EndpointSlice");
    wait_for(
        "the node with the Service's ready endpoint answering alone",
        async || (answers() == [macs[other]]).then_some(()),
        &logs,
    )
    .await;
    // Not ready anywhere: nobody answers, and the Service's condition says why.
    let mut unready = slice(names[other], false);
    unready.metadata.resource_version = slices
        .get("web-abcde")
        .await
        .expect("read the EndpointSlice")
        .metadata
        .resource_version;
    slices
        .replace("web-abcde", &Default::default(), &unready)
        .await
        .expect("mark the endpoint not ready");
    wait_for(
        "the Service's Announced condition saying no endpoint is ready",
        async || {
            let status = services.get("web").await.ok()?.status?;
            status.conditions?.into_iter().find(|c| {
                c.type_ == "Announced"
                    && c.status == "False"
                    && c.message.contains("no ready endpoint on any node")
            })
        },
        &logs,
    )
    .await;
    wait_for(
        "nobody answering for the Service with no ready endpoint",
        async || answers().is_empty().then_some(()),
        &logs,
    )
    .await;

    // The dead node back: no one reports it any more.
    nodes[owner].0.ns.up("up0");
    let restarted = nodes[owner].0.start(&nodes[owner].1);
    agents.lock().unwrap()[owner] = Some(restarted);
    wait_for(
        "no node reporting the returned node dead",
        async || {
            let records = store.list_typed::<NodeIpam>().await.ok()?;
            records
                .iter()
                .all(|r| r.value.spec.peers_down.is_empty())
                .then_some(())
        },
        &logs,
    )
    .await;
    wait_for(
        "the returned node's record no longer saying its pods were marked",
        async || marked_condition().await.is_none().then_some(()),
        &logs,
    )
    .await;

    // An agent killed on a node that runs: the gossip declares the node dead, but its kubelet's
    // port answers, so no one reports it and its pod stays ready.
    let killed = agents.lock().unwrap()[other].take();
    killed.expect("an agent").kill();
    let refusal = format!(
        "not reporting {} dead: the gossip declared it dead but kubelet",
        names[other]
    );
    wait_for(
        "both other agents finding the killed agent's node alive by its kubelet's port",
        async || {
            let agents = agents.lock().unwrap();
            agents
                .iter()
                .flatten()
                .all(|a| a.log_text().contains(&refusal))
                .then_some(())
        },
        &logs,
    )
    .await;
    assert_pods_ready(&pods, &names, &[owner]).await;
    for record in store.list_typed::<NodeIpam>().await.unwrap() {
        assert!(
            record
                .value
                .spec
                .peers_down
                .iter()
                .all(|d| d.node != names[other]),
            "{} reports {} dead although its kubelet answers: {:?}",
            record.name,
            names[other],
            record.value.spec.peers_down
        );
    }

    // The killed agent back, then two faults on a node that runs, each held while the
    // records are read twice a second: neither may get a node reported, or a pod set not ready.
    let restarted = nodes[other].0.start(&nodes[other].1);
    agents.lock().unwrap()[other] = Some(restarted);
    let reports = async || -> Vec<(String, Vec<ipam_core::resources::PeerDown>)> {
        let records = store.list_typed::<NodeIpam>().await.unwrap_or_default();
        records
            .into_iter()
            .filter(|r| !r.value.spec.peers_down.is_empty())
            .map(|r| (r.name, r.value.spec.peers_down))
            .collect()
    };
    let none_reported_while = async |what: &str, held: Duration| {
        let until = Instant::now() + held;
        while Instant::now() < until {
            let reports = reports().await;
            assert!(
                reports.is_empty(),
                "nodes reported dead {what}: {reports:?}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    let fault_on = &nodes[next].0.ns;
    let iptables = |action: &str, rule: &[&str]| {
        let status = fault_on
            .command("iptables")
            .arg(action)
            .args(rule)
            .status()
            .expect("run iptables");
        assert!(status.success(), "iptables {action} {rule:?}");
    };
    let gossip_fence_opened = |i: usize| {
        agents.lock().unwrap()[i]
            .as_ref()
            .map_or(0, |a| a.log_text().matches("gossip fence open").count())
    };
    wait_for(
        "the restarted agent hearing a majority again",
        async || (gossip_fence_opened(other) > 0).then_some(()),
        &logs,
    )
    .await;

    // A lossy link: a fifth of every packet the node sends or receives on its uplink lost
    // (the peers' kubelet probes too), the gossip's held for 0-100 ms besides (netem's `loss
    // 20% delay 50ms 50ms`).
    let lossy = [["INPUT", "-i", "up0"], ["OUTPUT", "-o", "up0"]]
        .map(|link| [link.as_slice(), &ipam_tests::delay::random_loss("0.2")].concat());
    for rule in &lossy {
        iptables("-A", rule);
    }
    let delay = ipam_tests::delay::Delay::start(
        fault_on,
        GOSSIP_PORT,
        2,
        Duration::ZERO,
        Duration::from_millis(100),
    );
    none_reported_while("on a lossy link", Duration::from_secs(15)).await;
    let held = delay.stop();
    for rule in &lossy {
        iptables("-D", rule);
    }
    assert!(held > 100, "the delay held only {held} packets");
    assert_pods_ready(&pods, &names, &[owner]).await;

    // A gossip partition: the node's gossip cut both ways, and its kubelet's port rejected
    // by its firewall with ICMP "administratively prohibited", then dropped (Kubernetes
    // documents 10250 as reachable from the control plane only): each is what a dead node's
    // port gives too. Its peers declare it dead and find it alive by ARP; it hears no
    // majority, so its fence closes and it reports no one.
    let refusal = |i: usize| {
        let needle = format!(
            "not reporting {} dead: the gossip declared it dead but ",
            names[next]
        );
        agents.lock().unwrap()[i]
            .as_ref()
            .map_or(0, |a| a.log_text().matches(&needle).count())
    };
    let refusals_before = [refusal(owner), refusal(other)];
    let fences_before = gossip_fence_opened(next);
    let gossip_port = GOSSIP_PORT.to_string();
    let partition = [["INPUT", "--dport"], ["OUTPUT", "--dport"]]
        .map(|[chain, port]| [chain, "-p", "udp", port, gossip_port.as_str(), "-j", "DROP"]);
    let kubelet_port = KUBELET_PORT.to_string();
    let kubelet_filtered = |how: &'static [&'static str]| {
        [
            ["INPUT", "-p", "tcp", "--dport", kubelet_port.as_str(), "-j"].as_slice(),
            how,
        ]
        .concat()
    };
    let rejected = kubelet_filtered(&["REJECT", "--reject-with", "icmp-admin-prohibited"]);
    let dropped = kubelet_filtered(&["DROP"]);
    iptables("-A", &rejected);
    for rule in &partition {
        iptables("-A", rule);
    }
    wait_for(
        "both peers of the partitioned node finding it running although its kubelet's port \
         is rejected",
        async || {
            (refusal(owner) > refusals_before[0] && refusal(other) > refusals_before[1])
                .then_some(())
        },
        &logs,
    )
    .await;
    let fence_closed = agents.lock().unwrap()[next]
        .as_ref()
        .is_some_and(|a| a.log_text().contains("gossip fence closed"));
    assert!(fence_closed, "the partitioned node's fence stayed open");
    none_reported_while(
        "across a gossip partition, its kubelet's port rejected",
        Duration::from_secs(2),
    )
    .await;
    iptables("-D", &rejected);
    iptables("-A", &dropped);
    // Past the peers' recheck of the node.
    none_reported_while(
        "across a gossip partition, its kubelet's port dropped",
        Duration::from_secs(6),
    )
    .await;
    iptables("-D", &dropped);
    for rule in &partition {
        iptables("-D", rule);
    }
    wait_for(
        "the partitioned node hearing a majority again",
        async || (gossip_fence_opened(next) > fences_before).then_some(()),
        &logs,
    )
    .await;
    assert_pods_ready(&pods, &names, &[owner]).await;
    drop(agents);
    drop(operator);
    api
}

/// The gossip's port (the default of `[gossip]`).
const GOSSIP_PORT: u16 = 7946;

/// The port the agents of these tests probe as the nodes' kubelet's (the default).
const KUBELET_PORT: u16 = 10250;

/// A pod `web-<node>` in `namespace` on each of `nodes`, Ready as its kubelet would have
/// reported it (no kubelet runs beside these API servers); the pods of `namespace`.
async fn ready_pods_on(api: &TestApi, namespace: &str, nodes: &[&str]) -> kube::Api<Pod> {
    let pods: kube::Api<Pod> = kube::Api::namespaced(api.client().await, namespace);
    for node in nodes {
        let name = format!("web-{node}");
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "namespace": namespace, "labels": { "app": "web" } },
            "spec": { "nodeName": node, "containers": [{ "name": "web", "image": "web" }] },
        }))
        .unwrap();
        pods.create(&Default::default(), &pod)
            .await
            .unwrap_or_else(|e| panic!("create pod {name}: {e}"));
        let status = serde_json::json!({ "status": {
            "phase": "Running",
            "conditions": [
                { "type": "PodScheduled", "status": "True",
                  "lastTransitionTime": "2026-01-01T00:00:00Z" },
                { "type": "Ready", "status": "True",
                  "lastTransitionTime": "2026-01-01T00:00:00Z" },
            ],
        } });
        pods.patch_status(
            &name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(status),
        )
        .await
        .unwrap_or_else(|e| panic!("mark pod {name} ready: {e}"));
    }
    pods
}

fn pod_ready_condition(pod: &Pod) -> Option<k8s_openapi::api::core::v1::PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .cloned()
}

/// The pods of `nodes` but those at `dead` are still ready.
async fn assert_pods_ready(pods: &kube::Api<Pod>, nodes: &[&str], dead: &[usize]) {
    let live = nodes.iter().enumerate().filter(|(i, _)| !dead.contains(i));
    for (_, node) in live {
        let pod = pods.get(&format!("web-{node}")).await.unwrap();
        let ready = pod_ready_condition(&pod).expect("a Ready condition");
        assert_eq!(
            ready.status, "True",
            "the pod of live node {node} was set not ready: {ready:?}"
        );
    }
}

/// Where deploy/ runs the project (the agents' DaemonSet and its pods).
const SYSTEM: &str = "ipam-system";

/// The agents' DaemonSet and its pods, one per node, as a cluster holds them (no controller
/// runs here to make them): what an agent reads at a stop with `on_stop = "auto"`.
struct AgentPods {
    client: kube::Client,
    names: Vec<String>,
}

impl AgentPods {
    async fn create(api: &TestApi, nodes: &[&str]) -> Self {
        use k8s_openapi::api::{apps::v1::DaemonSet, core::v1::Pod};
        let client = api.client().await;
        let template = serde_json::json!({
            "metadata": { "labels": { "app": "ipam-agent" } },
            "spec": {
                "serviceAccountName": "ipam-agent",
                "containers": [{ "name": "agent", "image": "ipam-ebpf" }],
            },
        });
        let daemon_set: DaemonSet = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "ipam-agent", "namespace": SYSTEM },
            "spec": {
                "selector": { "matchLabels": { "app": "ipam-agent" } },
                "template": template,
            },
        }))
        .unwrap();
        let daemon_sets: kube::Api<DaemonSet> = kube::Api::namespaced(client.clone(), SYSTEM);
        let created = daemon_sets
            .create(&kube::api::PostParams::default(), &daemon_set)
            .await
            .expect("create the agents' DaemonSet");
        let uid = created.metadata.uid.expect("a DaemonSet's uid");
        let pods: kube::Api<Pod> = kube::Api::namespaced(client.clone(), SYSTEM);
        let mut names = Vec::new();
        for node in nodes {
            let name = agent_pod(node);
            let metadata = serde_json::json!({
                "name": name,
                "namespace": SYSTEM,
                "labels": { "app": "ipam-agent" },
                "ownerReferences": [{
                    "apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ipam-agent",
                    "uid": uid, "controller": true,
                }],
            });
            // On a real server the agent's pod exists already: its service-account token is
            // bound to it (`Who::Agent`). It becomes the DaemonSet's; replacing it would void
            // the token.
            if pods
                .get_opt(&name)
                .await
                .expect("read an agent's pod")
                .is_some()
            {
                let patch = serde_json::json!({ "metadata": metadata });
                pods.patch(
                    &name,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(&patch),
                )
                .await
                .expect("make an agent's pod the DaemonSet's");
            } else {
                let pod: Pod = serde_json::from_value(serde_json::json!({
                    "metadata": metadata,
                    "spec": {
                        "nodeName": node,
                        "serviceAccountName": "ipam-agent",
                        "containers": [{ "name": "agent", "image": "ipam-ebpf" }],
                    },
                }))
                .unwrap();
                pods.create(&kube::api::PostParams::default(), &pod)
                    .await
                    .expect("create an agent's pod");
            }
            names.push(name);
        }
        Self { client, names }
    }

    /// The pod of the agent on the `i`th node.
    fn pod(&self, i: usize) -> String {
        self.names[i].clone()
    }

    async fn delete_daemon_set(&self) {
        let daemon_sets: kube::Api<k8s_openapi::api::apps::v1::DaemonSet> =
            kube::Api::namespaced(self.client.clone(), SYSTEM);
        daemon_sets
            .delete("ipam-agent", &kube::api::DeleteParams::default())
            .await
            .expect("delete the agents' DaemonSet");
    }
}
