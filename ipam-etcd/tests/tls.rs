//! TLS with client certificates against a real etcd member started with `--client-cert-auth`:
//! the right pair works; a missing client certificate or an unknown CA gets an error that says
//! which endpoint and what to check. Certificates are made for the test with rcgen.

use std::path::{Path, PathBuf};

use ipam_core::store::{Store, TypedStore, conformance::Thing};
use ipam_etcd::{
    EtcdStore, TlsFiles,
    testing::{EtcdCluster, ServerTls},
};
use rcgen::{BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};

struct Pki {
    ca: PathBuf,
    server: (PathBuf, PathBuf),
    client: (PathBuf, PathBuf),
    /// A CA the members do not know, and a client pair it signed.
    rogue_ca: PathBuf,
}

fn write(dir: &Path, name: &str, pem: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, pem).unwrap();
    path
}

fn ca(dir: &Path, name: &str) -> (PathBuf, Issuer<'static, KeyPair>) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    (
        write(dir, &format!("{name}.pem"), &cert.pem()),
        Issuer::new(params, key),
    )
}

fn leaf(
    dir: &Path,
    name: &str,
    issuer: &Issuer<'_, KeyPair>,
    usage: ExtendedKeyUsagePurpose,
) -> (PathBuf, PathBuf) {
    let mut params =
        CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
    params.extended_key_usages = vec![usage];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    (
        write(dir, &format!("{name}.pem"), &cert.pem()),
        write(dir, &format!("{name}-key.pem"), &key.serialize_pem()),
    )
}

fn pki(dir: &Path) -> Pki {
    let (ca_path, issuer) = ca(dir, "ca");
    let (rogue_ca, _) = ca(dir, "rogue-ca");
    Pki {
        server: leaf(dir, "server", &issuer, ExtendedKeyUsagePurpose::ServerAuth),
        client: leaf(dir, "client", &issuer, ExtendedKeyUsagePurpose::ClientAuth),
        ca: ca_path,
        rogue_ca,
    }
}

#[tokio::test]
async fn client_certificates_work_and_bad_ones_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(dir.path());
    let cluster = EtcdCluster::start_with(
        1,
        Some(ServerTls {
            ca: pki.ca.clone(),
            cert: pki.server.0.clone(),
            key: pki.server.1.clone(),
        }),
    )
    .unwrap();
    let endpoint = cluster.endpoint(0);
    assert!(endpoint.starts_with("https://"));
    let files = |ca: &Path, client: Option<&(PathBuf, PathBuf)>| TlsFiles {
        ca: ca.to_owned(),
        cert: client.map(|c| c.0.clone()),
        key: client.map(|c| c.1.clone()),
        server_name: None,
    };

    let good = EtcdStore::connect(cluster.tls_config("/tls", files(&pki.ca, Some(&pki.client))))
        .await
        .unwrap();
    good.create_typed("a", &Thing { size: 1 }).await.unwrap();
    assert_eq!(good.list("Thing").await.unwrap().len(), 1);

    for (case, config) in [
        (
            "no client certificate",
            cluster.tls_config("/tls", files(&pki.ca, None)),
        ),
        (
            "unknown CA",
            cluster.tls_config("/tls", files(&pki.rogue_ca, Some(&pki.client))),
        ),
    ] {
        let mut config = config;
        config.request_timeout_ms = 1000;
        let e = match EtcdStore::connect(config).await {
            Err(e) => e.to_string(),
            Ok(store) => store.get("Thing", "a").await.unwrap_err().to_string(),
        };
        eprintln!("{case}: {e}");
        assert!(e.contains(&endpoint), "{case}: {e}");
        assert!(
            e.contains("TLS") || e.contains("credentials") || e.contains("certificate"),
            "{case}: {e}"
        );
    }

    let missing = dir.path().join("missing.pem");
    let e = match EtcdStore::connect(cluster.tls_config("/tls", files(&missing, None))).await {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a missing CA file accepted"),
    };
    assert!(e.contains("missing.pem"), "{e}");
}
