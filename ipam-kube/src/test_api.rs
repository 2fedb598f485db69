//! The API server a Kubernetes test runs against: a real one when `KUBEBUILDER_ASSETS` names
//! one (`real_api`), the in-process stand-in otherwise (`testing`). Each test says which.

use crate::{real_api::RealApiServer, testing::StandIn};

/// Where a count of requests starts (`TestApi::request_mark`).
pub enum RequestMark {
    StandIn(std::collections::BTreeMap<crate::testing::Served, u64>),
    /// The audit log's length.
    Real(u64),
}

pub enum TestApi {
    StandIn(StandIn),
    Real(RealApiServer),
}

impl TestApi {
    /// Starts the API server for `test`, with `namespaces` created, and prints which one it is.
    pub async fn start(test: &str, namespaces: &[&str]) -> Self {
        match RealApiServer::assets() {
            Some(assets) => {
                let real = RealApiServer::start(&assets)
                    .await
                    .unwrap_or_else(|e| panic!("{test}: {e}"));
                println!(
                    "{test}: against a real kube-apiserver from KUBEBUILDER_ASSETS ({}) on {}",
                    assets.display(),
                    real.address
                );
                for namespace in namespaces {
                    real.create_namespace(namespace).await;
                }
                Self::Real(real)
            }
            None => {
                println!(
                    "{test}: against the in-process stand-in API server (KUBEBUILDER_ASSETS \
                     names no kube-apiserver)"
                );
                Self::StandIn(StandIn::start().await.expect("start the stand-in"))
            }
        }
    }

    /// A client with every right (the stand-in checks none; the real server's admin).
    pub async fn client(&self) -> kube::Client {
        match self {
            Self::StandIn(api) => api.client(),
            Self::Real(api) => api.client().await,
        }
    }

    /// Installs `crds` where a server needs them (the stand-in serves any resource).
    pub async fn install_crds(
        &self,
        crds: Vec<
            k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        >,
    ) {
        if let Self::Real(api) = self {
            api.install_crds(crds).await;
        }
    }

    /// A kubeconfig for a client that reaches the server at `server` (its own address, or a
    /// relay to it in another network namespace) and presents `token`. The stand-in takes any token as the user's name.
    pub fn kubeconfig(&self, server: std::net::SocketAddr, token: &str) -> String {
        match self {
            Self::StandIn(_) => format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: stand-in\n  cluster:\n    \
                 server: http://{server}\nusers:\n- name: u\n  user:\n    token: {token}\n\
                 contexts:\n- name: stand-in\n  context:\n    cluster: stand-in\n    user: u\n\
                 current-context: stand-in\n"
            ),
            Self::Real(api) => api.kubeconfig(token).replace(
                &format!("https://{}", api.address),
                &format!("https://{server}"),
            ),
        }
    }

    /// The server's own address.
    pub fn address(&self) -> std::net::SocketAddr {
        match self {
            Self::StandIn(api) => api.address,
            Self::Real(api) => api.address,
        }
    }

    /// Every kind of request the tests' clients made (by user, verb, group and resource).
    pub fn requests(&self) -> std::collections::BTreeSet<crate::testing::Served> {
        match self {
            Self::StandIn(api) => api.requests(),
            Self::Real(api) => api.requests(),
        }
    }

    /// Where the count of requests stands now, for `request_counts_since`.
    pub fn request_mark(&self) -> RequestMark {
        match self {
            Self::StandIn(api) => RequestMark::StandIn(api.request_counts()),
            Self::Real(api) => RequestMark::Real(api.audit_mark()),
        }
    }

    /// How many requests of each kind (user, verb, group, resource) the clients made since
    /// `mark`: the real server's from its audit log, the stand-in's as it served them.
    pub fn request_counts_since(
        &self,
        mark: &RequestMark,
    ) -> std::collections::BTreeMap<crate::testing::Served, u64> {
        match (self, mark) {
            (Self::Real(api), RequestMark::Real(offset)) => api.request_counts_since(*offset),
            (Self::StandIn(api), RequestMark::StandIn(before)) => api
                .request_counts()
                .into_iter()
                .map(|(served, n)| {
                    let earlier = before.get(&served).copied().unwrap_or(0);
                    (served, n - earlier)
                })
                .filter(|(_, n)| *n > 0)
                .collect(),
            _ => panic!("a request mark of another server"),
        }
    }

    /// Creates namespace `name` with `annotations`, and on a real server its `default` service
    /// account (no controller-manager runs to make it, and pods need it).
    pub async fn create_namespace(&self, name: &str, annotations: serde_json::Value) {
        use kube::{Api, api::PostParams};
        let client = self.client().await;
        let namespace = serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "annotations": annotations },
        }))
        .expect("a Namespace");
        Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
        if let Self::Real(_) = self {
            let account = serde_json::from_value(serde_json::json!({
                "metadata": { "name": "default", "namespace": name },
            }))
            .expect("a ServiceAccount");
            Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(client, name)
                .create(&PostParams::default(), &account)
                .await
                .unwrap_or_else(|e| panic!("create {name}/default: {e}"));
        }
    }

    /// Takes the right to `verb` `resource` (a plural of API `group`, `""` for the core
    /// group) away from `user`: on the stand-in, which refuses it with RBAC's 403 from now on;
    /// on a real server, from ClusterRole `role`, as an admin who trimmed deploy/'s RBAC would,
    /// returning once the server's authorizer refuses it.
    pub async fn refuse(&self, user: &str, role: &str, group: &str, resource: &str, verb: &str) {
        let api = match self {
            Self::StandIn(api) => return api.refuse(user, verb, resource),
            Self::Real(api) => api,
        };
        use k8s_openapi::api::{
            authorization::v1::SubjectAccessReview,
            rbac::v1::{ClusterRole, PolicyRule},
        };
        use kube::{Api, api::PostParams};
        let client = api.client().await;
        let roles: Api<ClusterRole> = Api::all(client.clone());
        let mut cluster_role = roles
            .get(role)
            .await
            .unwrap_or_else(|e| panic!("read ClusterRole {role}: {e}"));
        let has = |list: &Option<Vec<String>>, item: &str| {
            list.as_ref().is_some_and(|l| l.iter().any(|x| x == item))
        };
        let mut rules: Vec<PolicyRule> = Vec::new();
        for rule in cluster_role.rules.take().unwrap_or_default() {
            let covers = has(&rule.api_groups, group)
                && has(&rule.resources, resource)
                && rule.verbs.iter().any(|v| v == verb);
            if !covers {
                rules.push(rule);
                continue;
            }
            // The rule's other resources keep every verb; this one keeps the others.
            let mut others = rule.clone();
            others.resources = Some(
                rule.resources
                    .iter()
                    .flatten()
                    .filter(|r| *r != resource)
                    .cloned()
                    .collect(),
            );
            if others.resources.as_ref().is_some_and(|r| !r.is_empty()) {
                rules.push(others);
            }
            let mut this = rule;
            this.resources = Some(vec![resource.to_owned()]);
            this.verbs.retain(|v| v != verb);
            if !this.verbs.is_empty() {
                rules.push(this);
            }
        }
        cluster_role.rules = Some(rules);
        roles
            .replace(role, &PostParams::default(), &cluster_role)
            .await
            .unwrap_or_else(|e| panic!("write ClusterRole {role}: {e}"));
        // The authorizer follows roles through its own watch: wait until it refuses.
        let reviews: Api<SubjectAccessReview> = Api::all(client);
        let review: SubjectAccessReview = serde_json::from_value(serde_json::json!({
            "spec": {
                "user": user,
                "resourceAttributes": { "verb": verb, "group": group, "resource": resource },
            },
        }))
        .expect("a SubjectAccessReview");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let answer = reviews
                .create(&PostParams::default(), &review)
                .await
                .unwrap_or_else(|e| panic!("review {user}'s right to {verb} {resource}: {e}"));
            if !answer.status.is_some_and(|s| s.allowed) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the API server still lets {user} {verb} {resource}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    /// Forgets the history watches resume from and ends every open watch: a watch that resumes
    /// is told 410 Gone and lists again. The real server's etcd is compacted and the server
    /// restarted.
    pub async fn compact_and_end_watches(&mut self) {
        match self {
            Self::StandIn(api) => {
                api.compact();
                api.end_watches();
            }
            Self::Real(api) => api.compact_and_restart().await,
        }
    }
}
