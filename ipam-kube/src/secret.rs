//! A key of a Secret: the BGP peers' passwords. BGPPeers are cluster-wide and name no
//! namespace, so the agents read Secrets of one namespace alone, set aside for them
//! (`[bgp] secret_namespace`, `ipam-bgp-secrets` in deploy/): their Role grants `get` on
//! Secrets there and nowhere else. RBAC cannot narrow `get` by label, and `resourceNames` would
//! have to be edited for every peer: a namespace that holds the BGP passwords and nothing else
//! keeps every other Secret out of an agent's reach.

use k8s_openapi::api::core::v1::Secret;
use kube::Api;

use crate::KubeStore;

impl KubeStore {
    /// The text of `key` in the Secret `namespace/name`, or why it cannot be had
    /// (naming the Secret and what to do).
    pub async fn secret_key(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
    ) -> Result<String, String> {
        let api: Api<Secret> = Api::namespaced(self.client(), namespace);
        let secret = api.get_opt(name).await.map_err(|e| match e {
            kube::Error::Api(status) if status.code == 403 => format!(
                "cannot read the Secret {namespace}/{name}: {} (the agents' Role must grant get \
                 on secrets in {namespace})",
                status.message
            ),
            e => format!("cannot read the Secret {namespace}/{name}: {e}"),
        })?;
        let Some(secret) = secret else {
            return Err(format!(
                "the Secret {namespace}/{name} does not exist: create it with the key {key} \
                 (kubectl -n {namespace} create secret generic {name} --from-literal={key}=...)"
            ));
        };
        let data = secret.data.unwrap_or_default();
        let value = data
            .get(key)
            .ok_or_else(|| format!("the Secret {namespace}/{name} has no key {key}"))?;
        String::from_utf8(value.0.clone())
            .map_err(|_| format!("the key {key} of the Secret {namespace}/{name} is not text"))
    }
}
