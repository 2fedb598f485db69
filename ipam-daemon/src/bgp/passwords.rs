//! Passwords from Secrets: a BGPPeer's `passwordSecretRef` names a key of a Secret in the
//! namespace set aside for them (`[bgp] secret_namespace`). The announcer reads it before it writes BIRD's configuration, and again
//! once a read is `REFRESH` old, so a rotated password reaches BIRD (which resets that session
//! alone: its protocol's configuration changed); a Secret that could not be read is tried again
//! after `RETRY`.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use ipam_core::lb::bgp::{NodeAdvertisements, SecretKeyRef, check_password};

use crate::cluster::ClusterStore;

/// How long a Secret's value is used before it is read again.
const REFRESH: Duration = Duration::from_secs(30);
/// How soon a Secret that could not be read is tried again (it may be created any moment).
const RETRY: Duration = Duration::from_secs(3);

/// The Secrets' values as last read.
pub(super) struct Passwords {
    /// Where the Secrets are.
    namespace: String,
    read: BTreeMap<(String, String), (Instant, Result<String, String>)>,
}

impl Passwords {
    pub(super) fn new(namespace: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            read: BTreeMap::new(),
        }
    }

    /// Whether a value in use is old enough to be read again.
    pub(super) fn stale(&self) -> bool {
        self.read
            .values()
            .any(|(at, value)| fresh_for(value) <= at.elapsed())
    }

    /// Gives each peer of `wanted` with a `passwordSecretRef` its password. A peer whose
    /// password cannot be had is taken out (no session is better than one that fails its
    /// signatures) and returned with why.
    pub(super) async fn resolve(
        &mut self,
        store: &ClusterStore,
        wanted: &mut NodeAdvertisements,
    ) -> BTreeMap<String, String> {
        let mut in_use = BTreeMap::new();
        let mut held = BTreeMap::new();
        for (peer, spec) in &mut wanted.peers {
            let Some(reference) = spec.password_secret_ref.clone() else {
                continue;
            };
            let key = (reference.name.clone(), reference.key.clone());
            // Peers often share one Secret (one key for the fabric): it is read once per pass.
            if !in_use.contains_key(&key) {
                let entry = match self.read.remove(&key) {
                    Some((at, value)) if at.elapsed() < fresh_for(&value) => (at, value),
                    _ => (
                        Instant::now(),
                        read(store, &self.namespace, &reference).await,
                    ),
                };
                in_use.insert(key.clone(), entry);
            }
            match &in_use[&key].1 {
                Ok(password) => spec.password = Some(password.clone()),
                Err(why) => {
                    held.insert(peer.clone(), why.clone());
                }
            }
        }
        // Secrets no peer names any more are forgotten.
        self.read = in_use;
        for peer in held.keys() {
            wanted.peers.remove(peer);
            wanted.routes.remove(peer);
        }
        held
    }
}

fn fresh_for(value: &Result<String, String>) -> Duration {
    if value.is_ok() { REFRESH } else { RETRY }
}

/// The password in the Secret, checked as a TCP MD5 key.
async fn read(
    store: &ClusterStore,
    namespace: &str,
    reference: &SecretKeyRef,
) -> Result<String, String> {
    let Some(kube) = store.kube() else {
        return Err(format!(
            "passwordSecretRef ({}) needs the Kubernetes store: on {} give the password in \
             spec.password",
            reference.name,
            store.describe()
        ));
    };
    let password = kube
        .secret_key(namespace, &reference.name, &reference.key)
        .await?;
    // A Secret made from a file often ends in a line break, which no MD5 key here may hold.
    let password = password.trim_end_matches(['\n', '\r']).to_owned();
    check_password(&password).map_err(|why| {
        format!(
            "the key {} of the Secret {}: {why}",
            reference.key, reference.name
        )
    })?;
    Ok(password)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use ipam_core::{
        lb::bgp::{BgpPeerSpec, NodeAdvertisements, RouteAttributes},
        store::embedded::EmbeddedStore,
    };
    use ipam_store::AnyStore;

    use super::Passwords;

    use crate::cluster::ClusterStore;

    fn peer(secret: Option<&str>) -> BgpPeerSpec {
        let mut spec = serde_json::json!({
            "peerAddress": "192.0.2.1", "peerASN": 64500, "localASN": 64512,
        });
        if let Some(name) = secret {
            spec["passwordSecretRef"] = serde_json::json!({ "name": name });
        }
        serde_json::from_value(spec).unwrap()
    }

    /// Off Kubernetes there are no Secrets: the peer naming one is held back with why (its
    /// routes too), the others are left as they are, and the read is tried again soon.
    #[tokio::test]
    async fn a_peer_whose_password_cannot_be_had_is_held_back_with_why() {
        let dir = tempfile_dir();
        let store = ClusterStore::from(AnyStore::Embedded(
            EmbeddedStore::open(&dir.join("state")).unwrap(),
        ));
        let ip = "198.51.100.1/32".parse().unwrap();
        let mut wanted = NodeAdvertisements::default();
        for (name, secret) in [("plain", None), ("guarded", Some("bgp-guarded"))] {
            wanted.peers.insert(name.into(), peer(secret));
            wanted.routes.insert(
                name.into(),
                BTreeMap::from([(ip, RouteAttributes::default())]),
            );
        }
        let mut passwords = Passwords::new("ipam-bgp-secrets");
        let held = passwords.resolve(&store, &mut wanted).await;
        assert_eq!(held.keys().collect::<Vec<_>>(), ["guarded"]);
        assert!(
            held["guarded"].contains("bgp-guarded") && held["guarded"].contains("spec.password"),
            "{held:?}"
        );
        assert_eq!(wanted.peers.keys().collect::<Vec<_>>(), ["plain"]);
        assert_eq!(wanted.routes.keys().collect::<Vec<_>>(), ["plain"]);
        assert!(!passwords.stale(), "just read");
        let _ = std::fs::remove_dir_all(dir);
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("bgp-passwords-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
