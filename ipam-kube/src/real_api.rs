//! A real Kubernetes API server for the tests, when one is at hand: `KUBEBUILDER_ASSETS` names a
//! folder holding `kube-apiserver` (and `etcd`; Debian's `etcd` on the PATH serves when the
//! folder has none), as controller-runtime's envtest has it. These machines package no API
//! server, so CI runs the tests against the stand-in (`testing::StandIn`); a user's CI that
//! downloads the envtest binaries runs the same tests against the real one.
//!
//! The server runs as a cluster would: TLS with its own CA, RBAC on, an admin token in
//! `system:masters`, service-account token signing, a one-member etcd of its own on loopback.

use std::{
    net::{SocketAddr, TcpListener},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{Api, api::PostParams};

/// Why a real API server could not be started (it says which binary, port or file).
#[derive(Debug, thiserror::Error)]
#[error("the real API server from KUBEBUILDER_ASSETS: {0}")]
pub struct RealApiError(String);

fn err(what: impl std::fmt::Display) -> RealApiError {
    RealApiError(what.to_string())
}

/// A running kube-apiserver over its own etcd; both are killed and their files removed on drop.
pub struct RealApiServer {
    pub address: SocketAddr,
    dir: PathBuf,
    etcd: Child,
    apiserver: Child,
    /// How to start the API server again (`restart`).
    apiserver_command: (PathBuf, Vec<String>),
    etcd_endpoint: String,
}

const ADMIN_TOKEN: &str = "ipam-tests-admin";

impl RealApiServer {
    /// The folder `KUBEBUILDER_ASSETS` names, if it holds a `kube-apiserver`.
    pub fn assets() -> Option<PathBuf> {
        let dir = PathBuf::from(std::env::var_os("KUBEBUILDER_ASSETS")?);
        dir.join("kube-apiserver").is_file().then_some(dir)
    }

    /// Starts etcd and kube-apiserver from `assets` and waits until the server is ready.
    pub async fn start(assets: &Path) -> Result<Self, RealApiError> {
        let dir = std::env::temp_dir().join(format!(
            "ipam-kube-api-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).map_err(|e| err(format!("{}: {e}", dir.display())))?;
        write_pki(&dir)?;
        let [etcd_client, etcd_peer, secure] = free_ports()?;
        let etcd_endpoint = format!("http://127.0.0.1:{etcd_client}");
        let etcd = spawn_etcd(assets, &dir, &etcd_endpoint, etcd_peer)?;
        let args = apiserver_args(&dir, &etcd_endpoint, secure);
        let binary = assets.join("kube-apiserver");
        let apiserver = match spawn_apiserver(&binary, &args, &dir) {
            Ok(child) => child,
            Err(e) => {
                // Not left running behind a failed start.
                let mut etcd = etcd;
                let _ = etcd.kill();
                let _ = etcd.wait();
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        let mut server = Self {
            address: SocketAddr::from(([127, 0, 0, 1], secure)),
            dir,
            etcd,
            apiserver,
            apiserver_command: (binary, args),
            etcd_endpoint,
        };
        server.wait_ready().await?;
        Ok(server)
    }

    /// A kubeconfig for this server whose user presents `token`.
    pub fn kubeconfig(&self, token: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: real\n  cluster:\n    server: \
             https://{}\n    certificate-authority: {}\nusers:\n- name: u\n  user:\n    token: \
             {token}\ncontexts:\n- name: real\n  context:\n    cluster: real\n    user: u\n\
             current-context: real\n",
            self.address,
            self.dir.join("ca.pem").display()
        )
    }

    /// The token of an admin (`system:masters`).
    pub fn admin_token(&self) -> &'static str {
        ADMIN_TOKEN
    }

    /// A kube client with the admin's rights.
    pub async fn client(&self) -> kube::Client {
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&self.kubeconfig(ADMIN_TOKEN))
            .expect("the kubeconfig parses");
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .expect("a client configuration for the real API server");
        kube::Client::try_from(config).expect("a client for the real API server")
    }

    async fn wait_ready(&mut self) -> Result<(), RealApiError> {
        let client = self.client().await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let ready = client
                .request_text(
                    http_get("/readyz").map_err(|e| err(format!("a /readyz request: {e}")))?,
                )
                .await;
            let last = match ready {
                Ok(body) if body.trim() == "ok" => return Ok(()),
                Ok(body) => body,
                Err(e) => e.to_string(),
            };
            let exited = self.apiserver.try_wait().ok().flatten();
            if exited.is_some() || tokio::time::Instant::now() > deadline {
                let log = std::fs::read_to_string(self.dir.join("kube-apiserver.log"))
                    .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(15).collect();
                return Err(err(format!(
                    "kube-apiserver on {} {} (last /readyz: {last:?}); the end of its log:\n{}",
                    self.address,
                    match exited {
                        Some(status) => format!("exited with {status}"),
                        None => "was not ready within 60 s".to_owned(),
                    },
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Creates `crds` and waits until the server serves them.
    pub async fn install_crds(&self, crds: Vec<CustomResourceDefinition>) {
        let api: Api<CustomResourceDefinition> = Api::all(self.client().await);
        for crd in &crds {
            api.create(&PostParams::default(), crd)
                .await
                .unwrap_or_else(|e| panic!("create CRD {:?}: {e}", crd.metadata.name));
        }
        for crd in &crds {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            loop {
                let established = api.get(&name).await.ok().is_some_and(|c| {
                    c.status
                        .and_then(|s| s.conditions)
                        .unwrap_or_default()
                        .iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                });
                if established {
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "CRD {name} not established in 30 s"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    /// Creates namespace `name`.
    pub async fn create_namespace(&self, name: &str) {
        let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(self.client().await);
        let namespace = serde_json::from_value(serde_json::json!({ "metadata": { "name": name } }))
            .expect("a Namespace");
        api.create(&PostParams::default(), &namespace)
            .await
            .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
    }

    /// Applies manifests with the `kubectl` of the assets folder (or the `PATH`), as the admin,
    /// as a user installs the project.
    pub fn kubectl_apply(&self, files: &[&Path]) {
        let kubeconfig = self.dir.join("admin.kubeconfig");
        std::fs::write(&kubeconfig, self.kubeconfig(ADMIN_TOKEN)).expect("write a kubeconfig");
        let kubectl = Some(self.apiserver_command.0.with_file_name("kubectl"))
            .filter(|p| p.is_file())
            .unwrap_or_else(|| PathBuf::from("kubectl"));
        let mut command = Command::new(&kubectl);
        command.arg("--kubeconfig").arg(&kubeconfig).arg("apply");
        for file in files {
            command.arg("-f").arg(file);
        }
        let out = command
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", kubectl.display()));
        assert!(
            out.status.success(),
            "kubectl apply {files:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A token of service account `namespace/account` (TokenRequest), bound to pod `pod` of the
    /// same namespace when given: a token bound to a pod on a node names that node, which the
    /// admission policy of deploy/base/admission.yaml reads.
    pub async fn service_account_token(
        &self,
        namespace: &str,
        account: &str,
        pod: Option<&str>,
    ) -> String {
        let mut spec = serde_json::json!({
            "audiences": ["https://kubernetes.default.svc"],
            "expirationSeconds": 3600,
        });
        if let Some(pod) = pod {
            spec["boundObjectRef"] =
                serde_json::json!({ "kind": "Pod", "apiVersion": "v1", "name": pod });
        }
        let body = serde_json::to_vec(&serde_json::json!({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec,
        }))
        .expect("JSON");
        let request = http::Request::post(format!(
            "/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token"
        ))
        .header("content-type", "application/json")
        .body(body)
        .expect("a TokenRequest");
        let answer: serde_json::Value = self
            .client()
            .await
            .request(request)
            .await
            .unwrap_or_else(|e| panic!("a token for {namespace}/{account}: {e}"));
        answer["status"]["token"]
            .as_str()
            .unwrap_or_else(|| panic!("no token for {namespace}/{account}: {answer}"))
            .to_owned()
    }

    /// Every kind of request the tests' clients made so far, from the server's audit log: the
    /// server's own clients (users `system:...` other than service accounts) left out.
    pub fn requests(&self) -> std::collections::BTreeSet<crate::testing::Served> {
        self.request_counts_since(0).into_keys().collect()
    }

    /// Where the audit log ends now: `request_counts_since` counts from there.
    pub fn audit_mark(&self) -> u64 {
        std::fs::metadata(self.dir.join("audit.log")).map_or(0, |m| m.len())
    }

    /// How many requests of each kind the tests' clients made since `mark` (an
    /// `audit_mark`), from the audit log: each request once (a watch logs its start and its
    /// end), the server's own clients left out.
    pub fn request_counts_since(
        &self,
        mark: u64,
    ) -> std::collections::BTreeMap<crate::testing::Served, u64> {
        use std::io::{Read as _, Seek as _};
        let mut log = String::new();
        if let Ok(mut file) = std::fs::File::open(self.dir.join("audit.log")) {
            let _ = file.seek(std::io::SeekFrom::Start(mark));
            let _ = file.read_to_string(&mut log);
        }
        let mut seen = std::collections::BTreeSet::new();
        let mut counts = std::collections::BTreeMap::new();
        let events = log
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|event| {
                let id = event["auditID"].as_str().unwrap_or_default().to_owned();
                seen.insert(id)
            });
        for served in events.filter_map(|event| Self::served(&event)) {
            *counts.entry(served).or_default() += 1;
        }
        counts
    }

    /// The request one audit event records, unless the server made it itself.
    fn served(event: &serde_json::Value) -> Option<crate::testing::Served> {
        let user = event["user"]["username"].as_str()?.to_owned();
        if user.starts_with("system:") && !user.starts_with("system:serviceaccount:") {
            return None;
        }
        let object = &event["objectRef"];
        let resource = object["resource"].as_str()?;
        Some(crate::testing::Served {
            user,
            verb: event["verb"].as_str()?.to_owned(),
            group: object["apiGroup"].as_str().unwrap_or("").to_owned(),
            resource: match object["subresource"].as_str() {
                Some(sub) => format!("{resource}/{sub}"),
                None => resource.to_owned(),
            },
        })
    }

    /// Compacts etcd's history up to now and restarts kube-apiserver: every open watch ends, and
    /// one that resumes from a version before now is told 410 Gone, as after a real compaction
    /// and an API server restart.
    pub async fn compact_and_restart(&mut self) {
        let mut etcd = etcd_client::Client::connect([self.etcd_endpoint.as_str()], None)
            .await
            .expect("an etcd client");
        let revision = etcd
            .get("/", None)
            .await
            .expect("read etcd's revision")
            .header()
            .expect("a response header")
            .revision();
        etcd.compact(
            revision,
            Some(etcd_client::CompactionOptions::new().with_physical()),
        )
        .await
        .expect("compact etcd");
        let _ = self.apiserver.kill();
        let _ = self.apiserver.wait();
        let (binary, args) = &self.apiserver_command;
        self.apiserver = spawn_apiserver(binary, args, &self.dir).expect("restart kube-apiserver");
        self.wait_ready()
            .await
            .expect("the restarted API server is ready");
    }
}

impl Drop for RealApiServer {
    fn drop(&mut self) {
        for child in [&mut self.apiserver, &mut self.etcd] {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

fn http_get(path: &str) -> Result<http::Request<Vec<u8>>, http::Error> {
    http::Request::get(path).body(Vec::new())
}

/// etcd for the server: `assets`' own, else Debian's on the PATH; one member on loopback.
fn spawn_etcd(
    assets: &Path,
    dir: &Path,
    endpoint: &str,
    peer_port: u16,
) -> Result<Child, RealApiError> {
    let etcd_bin = Some(assets.join("etcd"))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("etcd"));
    let peer = format!("http://127.0.0.1:{peer_port}");
    Command::new(&etcd_bin)
        .arg("--data-dir")
        .arg(dir.join("etcd"))
        .args(["--listen-client-urls", endpoint])
        .args(["--advertise-client-urls", endpoint])
        .args(["--listen-peer-urls", &peer])
        .args(["--initial-advertise-peer-urls", &peer])
        .args(["--initial-cluster", &format!("default={peer}")])
        .stdout(Stdio::null())
        .stderr(log_file(dir, "etcd.log")?)
        .spawn()
        .map_err(|e| err(format!("cannot start {}: {e}", etcd_bin.display())))
}

/// kube-apiserver's arguments: as a cluster runs it (TLS, RBAC, service-account tokens),
/// with an audit log of every request for the tests' checks of rights.
fn apiserver_args(dir: &Path, etcd_endpoint: &str, secure_port: u16) -> Vec<String> {
    let d = |name: &str| dir.join(name).display().to_string();
    [
        "--etcd-servers",
        etcd_endpoint,
        "--bind-address",
        "127.0.0.1",
        "--advertise-address",
        "127.0.0.1",
        "--secure-port",
        &secure_port.to_string(),
        "--tls-cert-file",
        &d("server.pem"),
        "--tls-private-key-file",
        &d("server-key.pem"),
        "--client-ca-file",
        &d("ca.pem"),
        "--token-auth-file",
        &d("tokens.csv"),
        "--authorization-mode",
        "RBAC",
        "--allow-privileged=true",
        "--service-account-issuer",
        "https://kubernetes.default.svc",
        "--service-account-key-file",
        &d("sa.pem"),
        "--service-account-signing-key-file",
        &d("sa-key.pem"),
        "--api-audiences",
        "https://kubernetes.default.svc",
        "--service-cluster-ip-range",
        "10.96.0.0/16",
        "--audit-policy-file",
        &d("audit-policy.yaml"),
        "--audit-log-path",
        &d("audit.log"),
        "--audit-log-format",
        "json",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

fn spawn_apiserver(binary: &Path, args: &[String], dir: &Path) -> Result<Child, RealApiError> {
    Command::new(binary)
        .args(args)
        .stdout(Stdio::null())
        .stderr(log_file(dir, "kube-apiserver.log")?)
        .spawn()
        .map_err(|e| err(format!("cannot start {}: {e}", binary.display())))
}

fn log_file(dir: &Path, name: &str) -> Result<std::fs::File, RealApiError> {
    let path = dir.join(name);
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| err(format!("{}: {e}", path.display())))
}

/// Three free loopback ports, all held until all are found (so no two are the same).
fn free_ports() -> Result<[u16; 3], RealApiError> {
    let bind = || TcpListener::bind("127.0.0.1:0").map_err(|e| err(format!("a free port: {e}")));
    let held = [bind()?, bind()?, bind()?];
    let port = |l: &TcpListener| l.local_addr().map(|a| a.port()).map_err(err);
    Ok([port(&held[0])?, port(&held[1])?, port(&held[2])?])
}

/// Writes the server's CA, serving pair, service-account signing key and token file into its
/// folder.
fn write_pki(dir: &Path) -> Result<(), RealApiError> {
    {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
        let write = |name: &str, pem: String| {
            std::fs::write(dir.join(name), pem).map_err(|e| err(format!("{name}: {e}")))
        };
        let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_key = KeyPair::generate().map_err(err)?;
        write("ca.pem", ca.self_signed(&ca_key).map_err(err)?.pem())?;
        let issuer = Issuer::new(ca, ca_key);
        let server = CertificateParams::new(vec![
            "127.0.0.1".to_owned(),
            "localhost".to_owned(),
            "kubernetes.default.svc".to_owned(),
        ])
        .map_err(err)?;
        let server_key = KeyPair::generate().map_err(err)?;
        write(
            "server.pem",
            server.signed_by(&server_key, &issuer).map_err(err)?.pem(),
        )?;
        write("server-key.pem", server_key.serialize_pem())?;
        // ECDSA P-256: kube-apiserver signs service-account tokens with it (ES256) and checks
        // them with its public half.
        let sa = KeyPair::generate().map_err(err)?;
        write("sa-key.pem", sa.serialize_pem())?;
        write("sa.pem", sa.public_key_pem())?;
        write(
            "audit-policy.yaml",
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\n\
             rules:\n- level: Metadata\n"
                .to_owned(),
        )?;
        write(
            "tokens.csv",
            format!("{ADMIN_TOKEN},admin,admin,system:masters\n"),
        )?;
    }
    Ok(())
}
