//! The cluster's credentials, made for the run: a CA, the API server's serving pair (its SANs
//! hold the fabric address and the `kubernetes` Service's ClusterIP, which the agents reach it
//! by), the client pair the API server presents to kubelets, the service-account signing key,
//! and one static token per client (admin, controller manager, scheduler, kube-proxy, each
//! kubelet as `system:node:<name>` in `system:nodes`, so the Node authorizer and NodeRestriction
//! apply to it as on any cluster).

use std::{net::Ipv4Addr, path::Path};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};

/// Who holds a token, and the kubeconfig file named after it.
pub struct Client {
    pub file: &'static str,
    pub user: String,
    pub groups: &'static str,
}

pub fn clients(nodes: &[String]) -> Vec<Client> {
    let mut all = vec![
        Client {
            file: "admin",
            user: "admin".into(),
            groups: "system:masters",
        },
        Client {
            file: "controller-manager",
            user: "system:kube-controller-manager".into(),
            groups: "",
        },
        Client {
            file: "scheduler",
            user: "system:kube-scheduler".into(),
            groups: "",
        },
        Client {
            file: "kube-proxy",
            user: "system:kube-proxy".into(),
            groups: "",
        },
    ];
    all.extend(nodes.iter().map(|node| Client {
        file: "",
        user: format!("system:node:{node}"),
        groups: "system:nodes",
    }));
    all
}

/// Writes every file into `dir`: `ca.pem`, `server.pem`/`server-key.pem`,
/// `kubelet-client.pem`/`-key.pem`, `sa.pem`/`sa-key.pem`, `tokens.csv` and a kubeconfig per
/// client (`<file>.kubeconfig`, `<node>.kubeconfig`) for a server at `server`.
pub fn write(dir: &Path, server: Ipv4Addr, cluster_ip: Ipv4Addr, nodes: &[String]) {
    let put = |name: &str, text: String| {
        std::fs::write(dir.join(name), text).unwrap_or_else(|e| panic!("{name}: {e}"));
    };
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "ipam-lab cluster CA");
    let ca_key = KeyPair::generate().expect("a CA key");
    put("ca.pem", ca.self_signed(&ca_key).expect("the CA").pem());
    let issuer = Issuer::new(ca, ca_key);

    let mut serving = CertificateParams::new(vec![
        server.to_string(),
        cluster_ip.to_string(),
        "127.0.0.1".into(),
        "kubernetes".into(),
        "kubernetes.default".into(),
        "kubernetes.default.svc".into(),
        "kubernetes.default.svc.cluster.local".into(),
    ])
    .expect("serving parameters");
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let serving_key = KeyPair::generate().expect("a serving key");
    put(
        "server.pem",
        serving
            .signed_by(&serving_key, &issuer)
            .expect("sign")
            .pem(),
    );
    put("server-key.pem", serving_key.serialize_pem());

    // What the API server presents to kubelets (logs, exec).
    let mut kubelet_client = CertificateParams::new(Vec::<String>::new()).expect("parameters");
    kubelet_client
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver-kubelet-client");
    kubelet_client
        .distinguished_name
        .push(DnType::OrganizationName, "system:masters");
    kubelet_client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let kubelet_client_key = KeyPair::generate().expect("a client key");
    put(
        "kubelet-client.pem",
        kubelet_client
            .signed_by(&kubelet_client_key, &issuer)
            .expect("sign")
            .pem(),
    );
    put("kubelet-client-key.pem", kubelet_client_key.serialize_pem());

    // ECDSA P-256 (ES256): service-account tokens are signed with it and checked with its
    // public half.
    let sa = KeyPair::generate().expect("a signing key");
    put("sa-key.pem", sa.serialize_pem());
    put("sa.pem", sa.public_key_pem());

    let mut tokens = String::new();
    for (i, client) in clients(nodes).iter().enumerate() {
        let token = format!("ipam-lab-token-{i}-{}", std::process::id());
        tokens.push_str(&format!("{token},{},{}", client.user, client.user));
        if !client.groups.is_empty() {
            tokens.push_str(&format!(",\"{}\"", client.groups));
        }
        tokens.push('\n');
        let file = match client.user.strip_prefix("system:node:") {
            Some(node) => node.to_owned(),
            None => client.file.to_owned(),
        };
        put(
            &format!("{file}.kubeconfig"),
            kubeconfig(&dir.join("ca.pem"), server, &token),
        );
    }
    put("tokens.csv", tokens);
}

fn kubeconfig(ca: &Path, server: Ipv4Addr, token: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: lab\n  cluster:\n    server: \
         https://{server}:6443\n    certificate-authority: {}\nusers:\n- name: u\n  user:\n    \
         token: {token}\ncontexts:\n- name: lab\n  context:\n    cluster: lab\n    user: u\n\
         current-context: lab\n",
        ca.display()
    )
}
