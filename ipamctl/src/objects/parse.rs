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

use ipam_core::lb::annotations::{self, AnnotationSources, Asked};
use ipam_core::{
    lb::{
        announce::{NodeView, owners},
        bgp::{self, BgpAdvertisement, BgpPeer},
        external,
        resources::{
            L2AnnouncementPolicy, LbIpPool, Namespace, Service, ServiceEndpoints,
            ServiceEndpointsSpec, ServiceSpec,
        },
        rows,
    },
    pod::pool::PodIpPoolSpec,
    resources::{NodeIpam, PodIpPool, node_lease_name},
    store::{Resource, StoreError, TypedStore, lease::Lease},
};
use serde::{Deserialize, Serialize, de::DeserializeOwned};

#[derive(Debug, thiserror::Error)]
pub(crate) enum ObjectError {
    #[error("{file}: document {index} is not valid YAML for an object: {source}")]
    Yaml {
        file: String,
        index: usize,
        source: serde_yaml_ng::Error,
    },
    #[error(
        "{file}: document {index} has kind {kind:?}; use LoadBalancerIPPool, Service, \
         ServiceEndpoints, L2AnnouncementPolicy, BGPPeer, BGPAdvertisement, PodIPPool or \
         Namespace"
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
    #[error(
        "{file}: document {index} ({kind} {name:?}): metadata.name {why}; rename it (every \
         store takes the names Kubernetes takes). Nothing was applied"
    )]
    BadName {
        file: String,
        index: usize,
        kind: String,
        name: String,
        why: String,
    },
    #[error(
        "{file}: document {index} ({kind} {name}): {field} is not a field of a {kind}; \
         check its spelling and place (docs/service-ips.md and docs/ipam.md list the fields). \
         Nothing was applied"
    )]
    UnknownField {
        file: String,
        index: usize,
        kind: String,
        name: String,
        field: String,
    },
    #[error(
        "{file}: document {index} (Service {name}): metadata.labels and the deprecated \
         spec.labels disagree; keep the labels in metadata.labels only"
    )]
    LabelsDisagree {
        file: String,
        index: usize,
        name: String,
    },
    #[error("{file}: document {index} (Service {name}): {why}. Nothing was applied")]
    Annotation {
        file: String,
        index: usize,
        name: String,
        why: String,
    },
    #[error("{file}: document {index} ({kind} {name}): {why}. Nothing was applied")]
    Invalid {
        file: String,
        index: usize,
        kind: String,
        name: String,
        why: String,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The top level of a document: what Kubernetes manifests hold. `apiVersion` is not checked
/// (the kind says which resource it is) and a `status` is not applied (it is the controllers'),
/// as the API server does with a status in an apply.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Document {
    #[serde(default)]
    #[expect(
        dead_code,
        reason = "accepted as in any manifest, not needed to tell kinds apart"
    )]
    api_version: Option<String>,
    kind: String,
    metadata: Metadata,
    #[serde(default)]
    spec: serde_yaml_ng::Value,
    #[serde(default)]
    #[expect(dead_code, reason = "a status in a manifest is not applied")]
    status: Option<serde_yaml_ng::Value>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Metadata {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// The fields of Kubernetes' ObjectMeta that the server sets: accepted in a document (a
/// `kubectl get -o yaml` holds them) and not applied.
const SERVER_METADATA: &[&str] = &[
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "ownerReferences",
    "finalizers",
    "generateName",
    "selfLink",
];

/// One object read from a file, ready to write.
#[derive(Debug)]
pub(crate) enum Object {
    LbPool(String, LbIpPool),
    Service(String, Service),
    Endpoints(String, ServiceEndpoints),
    L2Policy(String, L2AnnouncementPolicy),
    BgpPeer(String, BgpPeer),
    BgpAdvertisement(String, BgpAdvertisement),
    PodPool(String, PodIpPool),
    /// A namespace's labels (on Kubernetes the Namespaces themselves).
    Namespace(String, Namespace),
}

impl Object {
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::LbPool(..) => LbIpPool::KIND,
            Self::Service(..) => Service::KIND,
            Self::Endpoints(..) => ServiceEndpoints::KIND,
            Self::L2Policy(..) => L2AnnouncementPolicy::KIND,
            Self::BgpPeer(..) => BgpPeer::KIND,
            Self::BgpAdvertisement(..) => BgpAdvertisement::KIND,
            Self::PodPool(..) => PodIpPool::KIND,
            Self::Namespace(..) => Namespace::KIND,
        }
    }

    pub(crate) fn name(&self) -> &str {
        match self {
            Self::LbPool(n, _)
            | Self::Service(n, _)
            | Self::Endpoints(n, _)
            | Self::L2Policy(n, _)
            | Self::BgpPeer(n, _)
            | Self::BgpAdvertisement(n, _)
            | Self::PodPool(n, _)
            | Self::Namespace(n, _) => n,
        }
    }
}

/// The documents of a file: the objects to write, and notes for the user (old spellings that
/// are still read).
#[derive(Debug, Default)]
pub(crate) struct Parsed {
    pub objects: Vec<Object>,
    pub notes: Vec<String>,
}

/// Reads every document of `text` (from `file`, named in errors). Nothing is written unless all
/// of them are valid; a field the resource does not have is an error, not ignored.
///
/// A Service's annotations are read as on Kubernetes, through `sources`
/// (`[store] service_annotations`): they fill the spec's fields the document leaves empty, and
/// disagreements (between annotations, or with the spec) become the Service's `conflict`.
pub(crate) fn parse(
    file: &str,
    text: &str,
    sources: &AnnotationSources,
) -> Result<Parsed, ObjectError> {
    let mut parsed = Parsed::default();
    for (index, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        // Counted from 1, as editors count lines (and `ipamctl migrate` its documents).
        let index = index + 1;
        let value = serde_yaml_ng::Value::deserialize(doc).map_err(|source| ObjectError::Yaml {
            file: file.to_owned(),
            index,
            source,
        })?;
        if value.is_null() {
            continue;
        }
        let object = document(file, index, value, sources, &mut parsed.notes)?;
        parsed.objects.push(object);
    }
    Ok(parsed)
}

/// One document: its fields, kind and name checked, then read as the object of its kind.
fn document(
    file: &str,
    index: usize,
    value: serde_yaml_ng::Value,
    sources: &AnnotationSources,
    notes: &mut Vec<String>,
) -> Result<Object, ObjectError> {
    let mut unknown = Vec::new();
    let doc: Document = serde_ignored::deserialize(value, |path| {
        let path = field_path(&path);
        if !SERVER_METADATA
            .iter()
            .any(|m| path == format!("metadata.{m}"))
        {
            unknown.push(path);
        }
    })
    .map_err(|source| ObjectError::Yaml {
        file: file.to_owned(),
        index,
        source,
    })?;
    let kind = doc.kind.clone();
    // Services and their endpoints are namespaced (`namespace/name`); the project's own
    // kinds are cluster-wide.
    let namespaced = kind == Service::KIND || kind == ServiceEndpoints::KIND;
    let name = if namespaced {
        let namespace = doc.metadata.namespace.as_deref().unwrap_or("default");
        format!("{namespace}/{}", doc.metadata.name)
    } else {
        doc.metadata.name.clone()
    };
    let at = Place {
        file,
        index,
        kind: &kind,
        name: &name,
    };
    if let Some(why) = ipam_core::names::invalid_name(&name) {
        return Err(ObjectError::BadName {
            file: file.to_owned(),
            index,
            kind,
            name,
            why,
        });
    }
    if let Some(field) = unknown.into_iter().next() {
        return Err(at.unknown(field));
    }
    notes.extend(at.old_spellings(&doc.spec));
    object(&at, doc, sources, notes)
}

/// The object of a checked document, by its kind.
fn object(
    at: &Place,
    doc: Document,
    sources: &AnnotationSources,
    notes: &mut Vec<String>,
) -> Result<Object, ObjectError> {
    let name = at.name.to_owned();
    Ok(match at.kind {
        "LoadBalancerIPPool" => Object::LbPool(
            name,
            LbIpPool {
                labels: doc.metadata.labels.clone(),
                spec: at.spec(doc.spec)?,
                status: Default::default(),
            },
        ),
        "Service" => service(at, doc, sources, notes)?,
        "ServiceEndpoints" => {
            let mut spec: ServiceEndpointsSpec = at.spec(doc.spec)?;
            let namespace = doc.metadata.namespace.as_deref().unwrap_or("default");
            spec.service = match spec.service.as_str() {
                "" => name.clone(),
                qualified if qualified.contains('/') => qualified.to_owned(),
                bare => format!("{namespace}/{bare}"),
            };
            Object::Endpoints(name, ServiceEndpoints { spec })
        }
        "L2AnnouncementPolicy" => Object::L2Policy(
            name,
            L2AnnouncementPolicy {
                spec: at.spec(doc.spec)?,
            },
        ),
        "BGPPeer" => {
            let spec = at.spec(doc.spec)?;
            bgp::check_peer(&spec).map_err(|why| at.invalid(why))?;
            Object::BgpPeer(
                name,
                BgpPeer {
                    spec,
                    status: Default::default(),
                },
            )
        }
        "BGPAdvertisement" => {
            let spec = at.spec(doc.spec)?;
            bgp::check_advertisement(&spec).map_err(|why| at.invalid(why))?;
            Object::BgpAdvertisement(name, BgpAdvertisement { spec })
        }
        "Namespace" => Object::Namespace(
            name,
            Namespace {
                labels: doc.metadata.labels.clone(),
            },
        ),
        "PodIPPool" => Object::PodPool(
            name,
            PodIpPool {
                spec: at.spec::<PodIpPoolSpec>(doc.spec)?,
                status: Default::default(),
            },
        ),
        other => {
            return Err(ObjectError::Kind {
                file: at.file.to_owned(),
                index: at.index,
                kind: other.to_owned(),
            });
        }
    })
}

/// A Service: its spec, what its annotations ask, and its labels (from `metadata.labels`;
/// `spec.labels`, the older place, still read with a note).
fn service(
    at: &Place,
    doc: Document,
    sources: &AnnotationSources,
    notes: &mut Vec<String>,
) -> Result<Object, ObjectError> {
    let (file, index, name) = (at.file, at.index, at.name);
    let mut spec: ServiceSpec = at.spec(doc.spec)?;
    let asked = annotations::read(&doc.metadata.annotations, sources);
    annotated(&mut spec, asked).map_err(|why| ObjectError::Annotation {
        file: file.to_owned(),
        index,
        name: name.to_owned(),
        why,
    })?;
    if !spec.labels.is_empty() {
        if !doc.metadata.labels.is_empty() && doc.metadata.labels != spec.labels {
            return Err(ObjectError::LabelsDisagree {
                file: file.to_owned(),
                index,
                name: name.to_owned(),
            });
        }
        notes.push(format!(
            "{file}: document {index} (Service {name}): spec.labels is deprecated and still \
             read; move the labels to metadata.labels, where Kubernetes keeps a Service's labels"
        ));
    } else {
        spec.labels = doc.metadata.labels.clone();
    }
    Ok(Object::Service(
        name.to_owned(),
        Service {
            spec,
            status: Default::default(),
        },
    ))
}

/// Fills the fields of `spec` that the document leaves empty from what its annotations ask;
/// where both say something different the spec is used, and the difference joins the
/// annotations' own disagreements in `spec.conflict` (the Service's `AnnotationsAgree`
/// condition). An IP that is not one is an error naming it.
fn annotated(spec: &mut ServiceSpec, asked: Asked) -> Result<(), String> {
    let mut conflicts = asked.conflicts;
    let requested = asked
        .requested_ips
        .iter()
        .map(|ip| {
            ip.parse::<std::net::IpAddr>()
                .map_err(|_| format!("its annotations ask for {ip:?}, which is not an IP address"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let sorted = |ips: &[std::net::IpAddr]| {
        let mut ips = ips.to_vec();
        ips.sort_unstable();
        ips
    };
    if spec.requested_ips.is_empty() {
        spec.requested_ips = requested;
    } else if !requested.is_empty() && sorted(&spec.requested_ips) != sorted(&requested) {
        conflicts.push("spec.requestedIPs and the annotations disagree; spec is used".to_owned());
    }
    for (field, in_spec, annotated) in [
        ("sharingKey", &mut spec.sharing_key, asked.sharing_key),
        ("pool", &mut spec.pool, asked.pool),
    ] {
        match (&in_spec, annotated) {
            (None, annotated) => *in_spec = annotated,
            (Some(a), Some(b)) if *a != b => conflicts.push(format!(
                "spec.{field} ({a}) and the annotations ({b}) disagree; spec is used"
            )),
            _ => {}
        }
    }
    if spec.sharing_cross_namespace.is_empty() {
        spec.sharing_cross_namespace = asked.sharing_cross_namespace;
    }
    if !conflicts.is_empty() {
        spec.conflict = Some(conflicts.join("; "));
    }
    Ok(())
}

/// A field's path as Kubernetes writes it in its errors: `spec.blocks[0].cidr`.
fn field_path(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", field_path(parent)),
        Path::Map { parent, key } => match field_path(parent) {
            p if p.is_empty() => key.clone(),
            p => format!("{p}.{key}"),
        },
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => field_path(parent),
    }
}

/// Where a document is, for its errors and notes.
struct Place<'a> {
    file: &'a str,
    index: usize,
    kind: &'a str,
    name: &'a str,
}

impl Place<'_> {
    fn unknown(&self, field: String) -> ObjectError {
        ObjectError::UnknownField {
            file: self.file.to_owned(),
            index: self.index,
            kind: self.kind.to_owned(),
            name: self.name.to_owned(),
            field,
        }
    }

    fn invalid(&self, why: String) -> ObjectError {
        ObjectError::Invalid {
            file: self.file.to_owned(),
            index: self.index,
            kind: self.kind.to_owned(),
            name: self.name.to_owned(),
            why,
        }
    }

    /// The typed spec; a field it does not have is an error naming the field.
    fn spec<T: DeserializeOwned>(&self, spec: serde_yaml_ng::Value) -> Result<T, ObjectError> {
        let mut unknown = None;
        let typed = serde_ignored::deserialize(spec, |path| {
            unknown.get_or_insert_with(|| format!("spec.{}", field_path(&path)));
        })
        .map_err(|source| ObjectError::Spec {
            file: self.file.to_owned(),
            kind: self.kind.to_owned(),
            name: self.name.to_owned(),
            source,
        })?;
        match unknown {
            Some(field) => Err(self.unknown(field)),
            None => Ok(typed),
        }
    }

    /// Notes for the fields `spec` spells the old way (`ipam_core::spelling`).
    fn old_spellings(&self, spec: &serde_yaml_ng::Value) -> Vec<String> {
        let Ok(spec) = serde_json::to_value(spec) else {
            return Vec::new();
        };
        ipam_core::spelling::old_spellings(self.kind, &serde_json::json!({ "spec": spec }))
            .into_iter()
            .map(|r| {
                format!(
                    "{}: document {} ({} {}): spec.{} is the old spelling of spec.{}; it is \
                     still read, but write {}",
                    self.file, self.index, self.kind, self.name, r.old, r.new, r.new
                )
            })
            .collect()
    }
}

/// Writes `object`'s spec: creates it, or replaces the spec of the existing one (its status is
/// the controllers' and stays). Returns whether it was created.
pub(crate) async fn apply<S: TypedStore>(store: &S, object: &Object) -> Result<bool, StoreError> {
    match object {
        Object::LbPool(n, v) => {
            put(store, n, v, |cur, new| {
                cur.labels = new.labels.clone();
                cur.spec = new.spec.clone();
            })
            .await
        }
        Object::Service(n, v) => put(store, n, v, |cur, new| cur.spec = new.spec.clone()).await,
        Object::Endpoints(n, v) => put(store, n, v, |cur, new| cur.spec = new.spec.clone()).await,
        Object::L2Policy(n, v) => put(store, n, v, |cur, new| cur.spec = new.spec.clone()).await,
        Object::BgpPeer(n, v) => put(store, n, v, |cur, new| cur.spec = new.spec.clone()).await,
        Object::BgpAdvertisement(n, v) => {
            put(store, n, v, |cur, new| cur.spec = new.spec.clone()).await
        }
        Object::PodPool(n, v) => put(store, n, v, |cur, new| cur.spec = new.spec.clone()).await,
        Object::Namespace(n, v) => {
            put(store, n, v, |cur, new| cur.labels = new.labels.clone()).await
        }
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
pub(crate) async fn announcing_nodes<S: TypedStore>(
    store: &S,
) -> Result<BTreeMap<std::net::IpAddr, String>, StoreError> {
    let services = store.list_typed::<Service>().await?;
    let policies = store.list_typed::<L2AnnouncementPolicy>().await?;
    let pools = store.list_typed::<LbIpPool>().await?;
    let nodes = store.list_typed::<NodeIpam>().await?;
    let endpoints = store.list_typed::<ServiceEndpoints>().await?;
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
    let namespaces = store.list_typed::<Namespace>().await?;
    let (pools, services) = (
        rows::labelled_pools(&pools),
        rows::services_in(&services, &namespaces),
    );
    // What the agents decide on: the external IPs the pools give (`lb::external`).
    let judged = external::judge(&services, &pools, || {
        external::node_addresses(nodes.iter().map(|n| (n.name.as_str(), &n.value)))
    });
    Ok(owners(
        &rows::policies(&policies),
        &pools,
        &judged.admitted(&services),
        &rows::ready_nodes(&endpoints),
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
                    kind: L2AnnouncementPolicy\nmetadata: { name: all }\nspec: { interfaces: [ \"eth.*\" ] }\n---\n\
                    kind: ServiceEndpoints\nmetadata: { name: web }\nspec: { endpoints: [ { nodeName: n2 }, { nodeName: n3, ready: false } ] }\n---\n\
                    kind: ServiceEndpoints\nmetadata: { name: web-b, namespace: shop }\nspec: { service: web }\n";
        let parsed = parse("lb.yaml", text, &AnnotationSources::default()).unwrap();
        assert!(parsed.notes.is_empty(), "{:?}", parsed.notes);
        let services: Vec<(&str, &str, usize)> = parsed
            .objects
            .iter()
            .filter_map(|o| match o {
                Object::Endpoints(name, e) => Some((
                    name.as_str(),
                    e.spec.service.as_str(),
                    e.spec.endpoints.len(),
                )),
                _ => None,
            })
            .collect();
        // Named after the Service unless it says which; its namespace is the object's.
        assert_eq!(
            services,
            [
                ("default/web", "default/web", 2),
                ("shop/web-b", "shop/web", 0)
            ]
        );
        let names: Vec<String> = parsed
            .objects
            .iter()
            .map(|o| format!("{} {}", o.kind(), o.name()))
            .collect();
        assert_eq!(
            names,
            [
                "LoadBalancerIPPool lb",
                "Service default/web",
                "L2AnnouncementPolicy all",
                "ServiceEndpoints default/web",
                "ServiceEndpoints shop/web-b",
            ]
        );
        let e = parse(
            "x.yaml",
            "kind: Gateway\nmetadata: { name: g }\nspec: {}\n",
            &AnnotationSources::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("x.yaml") && e.contains("Gateway"), "{e}");
        let e = parse(
            "x.yaml",
            "kind: Service\nmetadata: { name: web, namespace: shop }\nspec: { type: Balancer }\n",
            &AnnotationSources::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("Service shop/web") && e.contains("Balancer"),
            "{e}"
        );
    }

    fn error(text: &str) -> String {
        parse("x.yaml", text, &AnnotationSources::default())
            .unwrap_err()
            .to_string()
    }

    /// A name Kubernetes would not take is refused on every store, naming the rule: a quote in a
    /// BGPPeer's name once made BIRD refuse the node's whole configuration.
    #[test]
    fn a_name_kubernetes_would_refuse_is_refused_with_the_rule() {
        let e = error(
            "kind: BGPPeer\nmetadata: { name: 'rack\"1' }\nspec: { peerAddress: 10.0.0.1, peerASN: 65000, localASN: 65001 }\n",
        );
        assert!(
            e.contains("document 1 (BGPPeer \"rack\\\"1\")")
                && e.contains("DNS-1123 subdomain")
                && e.contains("Nothing was applied"),
            "{e}"
        );
        let e = error(
            "kind: Service\nmetadata: { name: web, namespace: Shop }\nspec: { type: LoadBalancer }\n",
        );
        assert!(e.contains("its namespace \"Shop\" holds 'S'"), "{e}");
    }

    /// A field the resource does not have is refused with the file, the document, the object
    /// and the field: an ignored misspelling once left a pool handing out addresses its author
    /// had excluded.
    #[test]
    fn an_unknown_field_is_an_error_naming_file_document_object_and_field() {
        let e = error(
            "kind: L2AnnouncementPolicy\nmetadata: { name: ok }\nspec: {}\n---\n\
             kind: LoadBalancerIPPool\nmetadata: { name: lb }\n\
             spec: { blocks: [ { cidr: 10.77.0.0/24 } ], allowFirstLast: true }\n",
        );
        assert!(
            e.contains("x.yaml")
                && e.contains("document 2")
                && e.contains("LoadBalancerIPPool lb")
                && e.contains("spec.allowFirstLast "),
            "{e}"
        );
        // Nested, in a list: the path says where.
        let e = error(
            "kind: LoadBalancerIPPool\nmetadata: { name: lb }\nspec: { blocks: [ { cdr: fd77::/64 } ] }\n",
        );
        assert!(e.contains("spec.blocks[0].cdr"), "{e}");
        // Beside the spec, and in the metadata.
        let e = error("kind: Service\nmetadata: { name: web }\nspce: {}\n");
        assert!(
            e.contains("spce is not a field") && e.contains("document 1 (Service default/web)"),
            "{e}"
        );
        let e = error("kind: Service\nmetadata: { name: web, labells: { a: b } }\nspec: {}\n");
        assert!(
            e.contains("metadata.labells") && e.contains("Service default/web"),
            "{e}"
        );
        // What `kubectl get -o yaml` adds is not an error: apiVersion, server metadata, status.
        let parsed = parse(
            "x.yaml",
            "apiVersion: ipam-ebpf.io/v1alpha1\nkind: LoadBalancerIPPool\n\
             metadata: { name: lb, uid: 1f, resourceVersion: \"7\", creationTimestamp: x }\n\
             spec: { blocks: [ { start: 10.77.0.10, stop: 10.77.0.20 } ] }\nstatus: { conditions: [] }\n",
            &AnnotationSources::default(),
        )
        .unwrap();
        assert_eq!(parsed.objects.len(), 1);
    }

    /// Kubernetes' spelling is read; the old spelling too, with a note.
    #[test]
    fn kubernetes_spelling_is_read_and_the_old_one_with_a_note() {
        let parsed = parse(
            "x.yaml",
            "kind: LoadBalancerIPPool\nmetadata: { name: lb }\n\
             spec: { blocks: [ { cidr: fd77::/64 } ], allowFirstLastIPs: true }\n",
            &AnnotationSources::default(),
        )
        .unwrap();
        let Object::LbPool(_, pool) = &parsed.objects[0] else {
            panic!("a pool")
        };
        assert!(pool.spec.allow_first_last_ips);
        assert!(parsed.notes.is_empty(), "{:?}", parsed.notes);

        let parsed = parse(
            "x.yaml",
            "kind: L2AnnouncementPolicy\nmetadata: { name: p }\nspec: { loadBalancerIps: false }\n",
            &AnnotationSources::default(),
        )
        .unwrap();
        let Object::L2Policy(_, policy) = &parsed.objects[0] else {
            panic!("a policy")
        };
        assert!(!policy.spec.load_balancer_ips);
        assert_eq!(parsed.notes.len(), 1);
        assert!(
            parsed.notes[0].contains("L2AnnouncementPolicy p")
                && parsed.notes[0].contains("loadBalancerIPs"),
            "{:?}",
            parsed.notes
        );
    }

    /// BGP peers and advertisements: MetalLB's `myASN` reads as `localASN`; a spec BGP would
    /// refuse is refused here, naming the object and why, before anything is written.
    #[test]
    fn bgp_objects_are_checked_before_anything_is_written() {
        let parsed = parse(
            "bgp.yaml",
            "kind: BGPPeer\nmetadata: { name: tor }\n\
             spec: { peerAddress: 10.0.0.1, peerASN: 64500, myASN: 64512 }\n---\n\
             kind: BGPAdvertisement\nmetadata: { name: all }\nspec: { communities: [\"64512:1\"] }\n",
            &AnnotationSources::default(),
        )
        .unwrap();
        let Object::BgpPeer(_, peer) = &parsed.objects[0] else {
            panic!("a peer")
        };
        assert_eq!(
            (peer.spec.local_asn, peer.spec.hold_time_seconds),
            (64512, 90)
        );
        let refused = parse(
            "bgp.yaml",
            "kind: BGPPeer\nmetadata: { name: ok }\n\
             spec: { peerAddress: 10.0.0.1, peerASN: 64500, localASN: 64512 }\n---\n\
             kind: BGPPeer\nmetadata: { name: quick }\n\
             spec: { peerAddress: 10.0.0.1, peerASN: 64500, localASN: 64512, holdTimeSeconds: 1 }\n",
            &AnnotationSources::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            refused.starts_with("bgp.yaml: document 2 (BGPPeer quick): holdTimeSeconds 1")
                && refused.ends_with("Nothing was applied"),
            "{refused}"
        );
    }

    /// A Service's labels are where Kubernetes keeps them, so one YAML works on every store;
    /// `spec.labels` still reads, with a note, and two that disagree are refused.
    #[test]
    fn a_service_s_labels_come_from_its_metadata() {
        let parsed = parse(
            "x.yaml",
            "kind: Service\nmetadata: { name: web, namespace: shop, labels: { tier: edge } }\nspec: {}\n",
            &AnnotationSources::default(),
        )
        .unwrap();
        let Object::Service(name, service) = &parsed.objects[0] else {
            panic!("a service")
        };
        assert_eq!(name, "shop/web");
        assert_eq!(
            service.spec.labels.get("tier").map(String::as_str),
            Some("edge")
        );
        assert!(parsed.notes.is_empty());

        let parsed = parse(
            "x.yaml",
            "kind: Service\nmetadata: { name: web }\nspec: { labels: { tier: edge } }\n",
            &AnnotationSources::default(),
        )
        .unwrap();
        let Object::Service(_, service) = &parsed.objects[0] else {
            panic!("a service")
        };
        assert_eq!(service.spec.labels.len(), 1);
        assert!(
            parsed.notes[0].contains("metadata.labels"),
            "{:?}",
            parsed.notes
        );

        let e = error(
            "kind: Service\nmetadata: { name: web, labels: { tier: a } }\nspec: { labels: { tier: b } }\n",
        );
        assert!(
            e.contains("disagree") && e.contains("Service default/web"),
            "{e}"
        );
    }

    fn service(text: &str, sources: &AnnotationSources) -> ServiceSpec {
        match parse("svc.yaml", text, sources).unwrap().objects.remove(0) {
            Object::Service(_, s) => s.spec,
            other => panic!("{other:?}"),
        }
    }

    /// On etcd and the embedded store a Service's annotations ask as on Kubernetes: the
    /// setting says whose are read; they fill what the spec leaves empty; disagreements become
    /// the Service's conflict; an IP that is not one is refused naming the Service.
    #[test]
    fn a_service_s_annotations_are_read_as_on_kubernetes() {
        let all = AnnotationSources::default();
        let text = "kind: Service\nmetadata:\n  name: cart\n  namespace: shop\n  annotations:\n    \
                    metallb.io/loadBalancerIPs: 10.0.0.7, fd00::7\n    metallb.io/address-pool: public\n    \
                    lbipam.cilium.io/sharing-key: k\n    lbipam.cilium.io/sharing-cross-namespace: web\n\
                    spec: { type: LoadBalancer }\n";
        let spec = service(text, &all);
        assert_eq!(
            spec.requested_ips,
            [
                "10.0.0.7".parse::<std::net::IpAddr>().unwrap(),
                "fd00::7".parse().unwrap()
            ]
        );
        assert_eq!(spec.pool.as_deref(), Some("public"));
        assert_eq!(spec.sharing_key.as_deref(), Some("k"));
        assert_eq!(spec.sharing_cross_namespace, ["web"]);
        assert_eq!(spec.conflict, None);

        let own = AnnotationSources::try_from(vec!["ipam-ebpf.io".to_owned()]).unwrap();
        let spec = service(text, &own);
        assert!(spec.requested_ips.is_empty() && spec.pool.is_none() && spec.sharing_key.is_none());

        let disagree = "kind: Service\nmetadata:\n  name: web\n  annotations:\n    \
                        ipam-ebpf.io/ips: 10.0.0.5\n    lbipam.cilium.io/ips: 10.0.0.9\n    \
                        metallb.io/address-pool: b\n\
                        spec: { type: LoadBalancer, pool: a }\n";
        let spec = service(disagree, &all);
        assert_eq!(
            spec.requested_ips,
            ["10.0.0.5".parse::<std::net::IpAddr>().unwrap()]
        );
        assert_eq!(spec.pool.as_deref(), Some("a"), "the spec is used");
        let conflict = spec.conflict.unwrap();
        assert!(
            conflict.contains("ipam-ebpf.io/ips (10.0.0.5) and lbipam.cilium.io/ips (10.0.0.9)")
                && conflict.contains("spec.pool (a) and the annotations (b) disagree"),
            "{conflict}"
        );

        let e = error(
            "kind: Service\nmetadata: { name: web, annotations: { ipam-ebpf.io/ips: ten } }\n\
             spec: { type: LoadBalancer }\n",
        );
        assert!(
            e.contains("document 1 (Service default/web)") && e.contains("\"ten\""),
            "{e}"
        );
    }
}
