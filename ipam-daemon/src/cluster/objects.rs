//! The objects `ipamctl apply -f`, `get` and `delete` work on, as YAML documents with a kind,
//! a name and a spec (the same documents in standalone and etcd modes; Kubernetes resources
//! later):
//!
//! ```yaml
//! kind: LoadBalancerIPPool
//! metadata: { name: lb }
//! spec: { blocks: [ { cidr: 10.77.0.192/27 } ] }
//! ---
//! kind: Service
//! metadata: { name: web, namespace: default }
//! spec: { type: LoadBalancer, ports: [ { port: 80 } ] }
//! ```

use std::collections::BTreeMap;

use ipam_core::{
    lb::{
        announce::{NodeView, owners},
        resources::{L2AnnouncementPolicy, LbIpPool, Service},
        rows,
    },
    pool::PodIpPoolSpec,
    resources::{NodeIpam, PodIpPool, node_lease_name},
    store::{Resource, StoreError, TypedStore, lease::Lease},
};
use serde::{Deserialize, Serialize, de::DeserializeOwned};

#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    #[error("{file}: document {index} is not valid YAML for an object: {source}")]
    Yaml {
        file: String,
        index: usize,
        source: serde_yaml_ng::Error,
    },
    #[error(
        "{file}: document {index} has kind {kind:?}; use LoadBalancerIPPool, Service, \
         L2AnnouncementPolicy or PodIPPool"
    )]
    Kind {
        file: String,
        index: usize,
        kind: String,
    },
    #[error("{file}: {kind} {name}: the spec is not valid: {source}")]
    Spec {
        file: String,
        kind: String,
        name: String,
        source: serde_yaml_ng::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

#[derive(Debug, Deserialize)]
struct Document {
    kind: String,
    metadata: Metadata,
    spec: serde_yaml_ng::Value,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Metadata {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// One object read from a file, ready to write.
#[derive(Debug)]
pub enum Object {
    LbPool(String, LbIpPool),
    Service(String, Service),
    L2Policy(String, L2AnnouncementPolicy),
    PodPool(String, PodIpPool),
}

impl Object {
    pub fn kind(&self) -> &'static str {
        match self {
            Self::LbPool(..) => LbIpPool::KIND,
            Self::Service(..) => Service::KIND,
            Self::L2Policy(..) => L2AnnouncementPolicy::KIND,
            Self::PodPool(..) => PodIpPool::KIND,
        }
    }

    pub fn name(&self) -> &str {
        match self {
            Self::LbPool(n, _)
            | Self::Service(n, _)
            | Self::L2Policy(n, _)
            | Self::PodPool(n, _) => n,
        }
    }

    pub fn describe(&self) -> String {
        format!("{} {}", self.kind(), self.name())
    }
}

/// Reads every document of `text` (from `file`, named in errors). Nothing is written unless all
/// of them are valid.
pub fn parse(file: &str, text: &str) -> Result<Vec<Object>, ObjectError> {
    let mut out = Vec::new();
    for (index, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let value = serde_yaml_ng::Value::deserialize(doc).map_err(|source| ObjectError::Yaml {
            file: file.to_owned(),
            index,
            source,
        })?;
        if value.is_null() {
            continue;
        }
        let doc: Document =
            serde_yaml_ng::from_value(value).map_err(|source| ObjectError::Yaml {
                file: file.to_owned(),
                index,
                source,
            })?;
        let spec = |kind: &str, name: &str| {
            let file = file.to_owned();
            let (kind, name) = (kind.to_owned(), name.to_owned());
            move |source| ObjectError::Spec {
                file,
                kind,
                name,
                source,
            }
        };
        let name = doc.metadata.name.clone();
        out.push(match doc.kind.as_str() {
            "LoadBalancerIPPool" => Object::LbPool(
                name.clone(),
                LbIpPool {
                    spec: typed(doc.spec).map_err(spec(&doc.kind, &name))?,
                    status: Default::default(),
                },
            ),
            "Service" => {
                let full = format!(
                    "{}/{name}",
                    doc.metadata.namespace.as_deref().unwrap_or("default")
                );
                Object::Service(
                    full.clone(),
                    Service {
                        spec: typed(doc.spec).map_err(spec(&doc.kind, &full))?,
                        status: Default::default(),
                    },
                )
            }
            "L2AnnouncementPolicy" => Object::L2Policy(
                name.clone(),
                L2AnnouncementPolicy {
                    spec: typed(doc.spec).map_err(spec(&doc.kind, &name))?,
                },
            ),
            "PodIPPool" => Object::PodPool(
                name.clone(),
                PodIpPool {
                    spec: typed::<PodIpPoolSpec>(doc.spec).map_err(spec(&doc.kind, &name))?,
                    status: Default::default(),
                },
            ),
            other => {
                return Err(ObjectError::Kind {
                    file: file.to_owned(),
                    index,
                    kind: other.to_owned(),
                });
            }
        });
    }
    Ok(out)
}

fn typed<T: DeserializeOwned>(v: serde_yaml_ng::Value) -> Result<T, serde_yaml_ng::Error> {
    serde_yaml_ng::from_value(v)
}

/// Writes `object`'s spec: creates it, or replaces the spec of the existing one (its status is
/// the controllers' and stays). Returns whether it was created.
pub async fn apply<S: TypedStore>(store: &S, object: &Object) -> Result<bool, StoreError> {
    match object {
        Object::LbPool(n, v) => put(store, n, v, |cur, new| cur.spec = new.spec.clone()).await,
        Object::Service(n, v) => put(store, n, v, |cur, new| cur.spec = new.spec.clone()).await,
        Object::L2Policy(n, v) => put(store, n, v, |cur, new| cur.spec = new.spec.clone()).await,
        Object::PodPool(n, v) => put(store, n, v, |cur, new| cur.spec = new.spec.clone()).await,
    }
}

async fn put<S: TypedStore, T: Resource + Clone>(
    store: &S,
    name: &str,
    value: &T,
    merge: impl Fn(&mut T, &T),
) -> Result<bool, StoreError> {
    loop {
        let result = match store.get_typed::<T>(name).await? {
            None => store.create_typed(name, value).await.map(|_| true),
            Some(cur) => {
                let mut updated = cur.value.clone();
                merge(&mut updated, value);
                store
                    .update_typed(name, &updated, &cur.revision)
                    .await
                    .map(|_| false)
            }
        };
        match result {
            Err(StoreError::Conflict { .. } | StoreError::AlreadyExists { .. }) => continue,
            other => return other,
        }
    }
}

/// The node announcing each service IP, as far as one look at the store can tell: nodes whose
/// lease was renewed within its duration by their wall clock count as live (the agents
/// themselves judge by lease changes they observe, which no clock skew affects).
pub async fn announcing_nodes<S: TypedStore>(
    store: &S,
) -> Result<BTreeMap<std::net::IpAddr, String>, StoreError> {
    let services = store.list_typed::<Service>().await?;
    let policies = store.list_typed::<L2AnnouncementPolicy>().await?;
    let nodes = store.list_typed::<NodeIpam>().await?;
    let leases: BTreeMap<String, Lease> = store
        .list_typed::<Lease>()
        .await?
        .into_iter()
        .map(|l| (l.name, l.value))
        .collect();
    let now = ipam_core::store::lease::now_ms();
    let live: Vec<NodeView> = nodes
        .iter()
        .filter(|n| {
            leases
                .get(&node_lease_name(&n.name))
                .is_some_and(|l| now.saturating_sub(l.renew_time_ms) < l.duration_ms)
        })
        .map(rows::node)
        .collect();
    Ok(owners(
        &rows::policies(&policies),
        &rows::services(&services),
        &live,
    )
    .into_iter()
    .map(|a| (a.ip, a.node))
    .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_of_every_kind_and_errors_that_name_the_file_and_object() {
        let text = "kind: LoadBalancerIPPool\nmetadata: { name: lb }\nspec: { blocks: [ { cidr: 10.77.0.192/27 } ] }\n---\n\
                    kind: Service\nmetadata: { name: web }\nspec: { type: LoadBalancer, ports: [ { port: 80 } ], sharingKey: web }\n---\n\
                    kind: L2AnnouncementPolicy\nmetadata: { name: all }\nspec: { interfaces: [ \"eth.*\" ] }\n";
        let objects = parse("lb.yaml", text).unwrap();
        let names: Vec<String> = objects.iter().map(Object::describe).collect();
        assert_eq!(
            names,
            [
                "LoadBalancerIPPool lb",
                "Service default/web",
                "L2AnnouncementPolicy all"
            ]
        );
        let e = parse("x.yaml", "kind: Gateway\nmetadata: { name: g }\nspec: {}\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("x.yaml") && e.contains("Gateway"), "{e}");
        let e = parse(
            "x.yaml",
            "kind: Service\nmetadata: { name: web, namespace: shop }\nspec: { type: Balancer }\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("Service shop/web") && e.contains("Balancer"),
            "{e}"
        );
    }
}
