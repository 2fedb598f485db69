//! The Kubernetes API for the tests and benchmarks of the Kubernetes store: the server (a real
//! kube-apiserver when `KUBEBUILDER_ASSETS` names one, with what `kubectl apply -k deploy`
//! installs; the in-process stand-in otherwise), who calls it with which token, and an
//! agent's node: a network namespace that reaches the API on its own loopback through a relay
//! that counts the bytes each way.

use std::{sync::Arc, time::Duration};

use ipam_api::types::{Attachment, AttachmentId, ErrorCode, Request, Response};
use ipam_kube::test_api::TestApi;

use crate::{
    TempFile,
    daemon::Daemon,
    relay::{Relay, Traffic},
    workspace_binary,
};

/// The API server for `test`: on a real one, with what `kubectl apply -k deploy` installs
/// (namespace, CRDs, RBAC, admission policy; the workloads would find no kubelet to run them).
pub async fn start_api(test: &str) -> TestApi {
    let api = TestApi::start(test, &[]).await;
    if let TestApi::Real(real) = &api {
        let deploy = crate::deploy::dir();
        let files =
            ["namespace.yaml", "crds.yaml", "rbac.yaml", "admission.yaml"].map(|f| deploy.join(f));
        real.kubectl_apply(
            &files
                .iter()
                .map(std::path::PathBuf::as_path)
                .collect::<Vec<_>>(),
        );
    }
    api
}

/// Who a client is.
#[derive(Clone, Copy)]
pub enum Who<'a> {
    Operator,
    /// The agent on this node.
    Agent(&'a str),
    Ipamctl,
}

impl Who<'_> {
    /// The name RBAC knows the client by: the stand-in records the token, which is the label.
    pub fn user(self, api: &TestApi) -> String {
        match (api, self) {
            (TestApi::Real(_), Self::Operator) => {
                "system:serviceaccount:ipam-system:ipam-operator".into()
            }
            (TestApi::Real(_), Self::Agent(_)) => {
                "system:serviceaccount:ipam-system:ipam-agent".into()
            }
            (_, Self::Operator) => "operator".into(),
            (_, Self::Agent(_)) => "agent".into(),
            (_, Self::Ipamctl) => "ipamctl".into(),
        }
    }

    /// The token the client presents. On a real server: the operator's service account; the
    /// agent's, bound to a pod of its DaemonSet on its node (so the token names the node, as
    /// the admission policy requires); an admin's for ipamctl.
    pub async fn token(self, api: &TestApi) -> String {
        let TestApi::Real(real) = api else {
            return self.user(api);
        };
        match self {
            Self::Operator => {
                real.service_account_token("ipam-system", "ipam-operator", None)
                    .await
            }
            Self::Ipamctl => real.admin_token().to_owned(),
            Self::Agent(node) => {
                let client = api.client().await;
                let create = kube::api::PostParams::default();
                // The Node, if the test did not make it, and the agent's pod on it.
                let nodes = kube::Api::<k8s_openapi::api::core::v1::Node>::all(client.clone());
                if nodes.get_opt(node).await.ok().flatten().is_none() {
                    let n =
                        serde_json::from_value(serde_json::json!({ "metadata": { "name": node } }))
                            .unwrap();
                    nodes.create(&create, &n).await.expect("create the Node");
                }
                let pod = agent_pod(node);
                let manifest = serde_json::from_value(serde_json::json!({
                    "metadata": { "name": pod, "namespace": "ipam-system" },
                    "spec": { "nodeName": node, "serviceAccountName": "ipam-agent",
                        "containers": [{ "name": "agent", "image": "registry.invalid/ipam" }] },
                }))
                .unwrap();
                kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client, "ipam-system")
                    .create(&create, &manifest)
                    .await
                    .expect("create the agent's pod");
                real.service_account_token("ipam-system", "ipam-agent", Some(&pod))
                    .await
            }
        }
    }
}

/// The name of the agent's pod on `node`: the one its token is bound to on a real server, and
/// the DaemonSet's pod there in the tests that make one.
pub fn agent_pod(node: &str) -> String {
    format!("ipam-agent-{node}")
}

/// A kubeconfig for `who` on the server's own address.
pub async fn kubeconfig_for(api: &TestApi, who: Who<'_>) -> TempFile {
    let file = TempFile::new("kubeconfig", "yaml");
    std::fs::write(
        &file.0,
        api.kubeconfig(api.address(), &who.token(api).await),
    )
    .expect("write the kubeconfig");
    file
}

/// An agent's liveness timings: lines of its `[datapath]` and `[cluster]` sections.
#[derive(Debug, Clone, Copy)]
pub struct Timings {
    pub datapath: &'static str,
    pub cluster: &'static str,
}

/// The tests' timings: a node's lease and its responders' liveness in a second or two.
pub const TEST_TIMINGS: Timings = Timings {
    datapath: "liveness_timeout_ms = 300\nheartbeat_interval_ms = 100\n",
    cluster: "node_lease_ms = 1500\nnode_grace_ms = 600000\nnode_renew_ms = 1000\n",
};

/// As deploy/ sets them: the responders' liveness the gossip needs (deploy/base/config.yaml),
/// the `[cluster]` defaults (a lease renewed every 10 s).
pub const DEPLOY_TIMINGS: Timings = Timings {
    datapath: "liveness_timeout_ms = 300\nheartbeat_interval_ms = 100\n",
    cluster: "",
};

/// An agent's node namespace, with the API served on its loopback (through a relay that
/// counts the agent's traffic), and a kubeconfig that reaches it there as the agent of `node`.
pub struct AgentNode {
    pub ns: crate::netns::Netns,
    pub kubeconfig: TempFile,
    /// The token the agent presents.
    pub token: String,
    pub dir: crate::TempDir,
    pub root: crate::BpffsRoot,
    /// What the agent sent to and received from the API server.
    pub traffic: Arc<Traffic>,
}

impl AgentNode {
    pub async fn new(api: &TestApi, tag: &str, node: &str) -> Self {
        let ns = crate::netns::Netns::new(tag);
        // The agent reaches the API server on its own namespace's loopback.
        let listener = ns.run(|| std::net::TcpListener::bind("127.0.0.1:0").expect("bind"));
        let (inside, traffic) =
            Relay::start(listener, api.address()).expect("relay to the API from the namespace");
        let kubeconfig = TempFile::new("kubeconfig-agent", "yaml");
        let token = Who::Agent(node).token(api).await;
        std::fs::write(&kubeconfig.0, api.kubeconfig(inside, &token)).unwrap();
        Self {
            ns,
            kubeconfig,
            token,
            dir: crate::TempDir::new(&format!("{tag}-")),
            root: crate::BpffsRoot::new(),
            traffic,
        }
    }

    /// The agent's configuration as deploy/ has it: the Kubernetes store, liveness between the
    /// agents (`[gossip]`, on the namespace's loopback and a key of its own: the test runs one
    /// agent), and `ipam` (the mode and the node's name) in the `[ipam]` section.
    pub fn config(&self, ipam: &str) -> TempFile {
        let key = self.dir.0.join("gossip.key");
        std::fs::write(&key, crate::cluster::random_key_hex()).unwrap();
        self.config_gossiping(ipam, "127.0.0.1", &key)
    }

    /// As `config`, gossiping on `address` with the cluster key in `key`.
    pub fn config_gossiping(&self, ipam: &str, address: &str, key: &std::path::Path) -> TempFile {
        self.config_timed(ipam, address, key, TEST_TIMINGS)
    }

    /// As `config_gossiping`, with the timings `timings` (the `[datapath]` liveness and the
    /// `[cluster]` section's settings; `DEPLOY_TIMINGS` for deploy/'s).
    pub fn config_timed(
        &self,
        ipam: &str,
        address: &str,
        key: &std::path::Path,
        timings: Timings,
    ) -> TempFile {
        let config = TempFile::new("kube-agent", "toml");
        std::fs::write(
            &config.0,
            format!(
                "[datapath]\nbpffs_root = \"{}\"\n{}\n\
                 [store]\nkind = \"kubernetes\"\n[store.kubernetes]\nnamespace = \"ipam-system\"\n\n\
                 [cluster]\n{}\n\
                 [gossip]\naddress = \"{address}\"\nkey_file = \"{}\"\n\n\
                 [node.announce]\nexclude_cordoned = true\nexclude_not_ready = true\n\n\
                 [ipam]\n{ipam}\nstate_dir = \"{d}/node\"\nsocket = \"{d}/api/ipamd.sock\"\n\
                 families = [\"v4\"]\n",
                self.root.0.display(),
                timings.datapath,
                timings.cluster,
                key.display(),
                d = self.dir.0.display()
            ),
        )
        .unwrap();
        config
    }

    pub fn start(&self, config: &TempFile) -> Daemon {
        Daemon::start_in(
            &self.ns,
            &config.0,
            &["--role", "agent"],
            &[("KUBECONFIG", &self.kubeconfig.0)],
        )
    }

    /// As `start`, as the DaemonSet's pod `namespace/name` (the downward API's `POD_NAMESPACE`
    /// and `POD_NAME`).
    pub fn start_as_pod(&self, config: &TempFile, namespace: &str, name: &str) -> Daemon {
        Daemon::start_in(
            &self.ns,
            &config.0,
            &["--role", "agent"],
            &[
                ("KUBECONFIG", &self.kubeconfig.0),
                ("POD_NAMESPACE", std::path::Path::new(namespace)),
                ("POD_NAME", std::path::Path::new(name)),
            ],
        )
    }

    /// A request to the agent's local API, as `ipam-cni` makes it.
    pub fn call(&self, request: &Request) -> Response {
        ipam_api::client::call(
            &self.dir.0.join("api/ipamd.sock"),
            request,
            Duration::from_secs(5),
        )
        .unwrap_or_else(|e| Response::error(ErrorCode::Failed, e.to_string()))
    }

    /// `ipam-cni`, the main plugin, run as the runtime on the node runs it for `pod`
    /// (`namespace`, `name`) in `pod_ns`.
    pub fn cni(
        &self,
        command: &str,
        container: &str,
        pod: (&str, &str),
        pod_ns: &crate::netns::Netns,
    ) -> (bool, serde_json::Value) {
        let conf = serde_json::json!({
            "cniVersion": "1.1.0", "name": "podnet", "type": "ipam-cni",
            "socket": self.dir.0.join("api/ipamd.sock"), "timeoutMs": 5000, "mtu": 1500,
        });
        let target = crate::cni::CniTarget {
            container,
            ifname: "eth0",
            pod,
        };
        crate::cni::run_cni_for(
            &workspace_binary("ipam-cni"),
            Some(&self.ns),
            command,
            &target,
            Some(pod_ns),
            &conf,
        )
    }

    /// A pod's ADD, with the pod's `namespace/name` when the runtime passed it
    /// (`K8S_POD_NAMESPACE`, `K8S_POD_NAME`).
    pub fn add(&self, container: &str, pod: Option<&str>) -> Response {
        self.call(&Request::Allocate(attachment(container, pod)))
    }
}

pub fn attachment(container: &str, pod: Option<&str>) -> Attachment {
    Attachment {
        ips: Vec::new(),
        id: AttachmentId {
            network: "podnet".into(),
            container_id: container.into(),
            ifname: "eth0".into(),
        },
        pod: pod.map(str::to_owned),
        pool: None,
    }
}

/// Namespace `shop` with a Service `web` of type LoadBalancer (port 80), made with the
/// Kubernetes API as a user makes it; the Services of `shop`.
pub async fn create_web_service(api: &TestApi) -> kube::Api<k8s_openapi::api::core::v1::Service> {
    api.create_namespace("shop", serde_json::json!({})).await;
    let services: kube::Api<k8s_openapi::api::core::v1::Service> =
        kube::Api::namespaced(api.client().await, "shop");
    let web: k8s_openapi::api::core::v1::Service = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": { "name": "web", "namespace": "shop" },
        "spec": { "type": "LoadBalancer", "ports": [{ "port": 80, "protocol": "TCP" }] },
    }))
    .unwrap();
    services
        .create(&kube::api::PostParams::default(), &web)
        .await
        .expect("create the Service");
    services
}
