//! `Store` over the Kubernetes API. Each kind the controllers use maps to an API resource:
//!
//! - `PodIPPool`, `NodeIPAM`, `LoadBalancerIPPool`, `L2AnnouncementPolicy`, `BGPPeer`,
//!   `BGPAdvertisement`: the custom resources of `crate::crd`, cluster-scoped. The spec is
//!   written to the object and the status through the status subresource; conditions become
//!   `metav1.Condition`s.
//! - `Lease`: a `coordination.k8s.io/v1` Lease in the store's namespace.
//! - `IpamConfig`: the ConfigMap `ipam-<name>` in the store's namespace.
//! - `Service`: core/v1 Services, named `<namespace>/<name>` (see `crate::service`): read,
//!   and their status written; never created, changed or deleted through the store.
//! - `ServiceEndpoints`: discovery.k8s.io/v1 EndpointSlices, named `<namespace>/<slice>` (see
//!   `crate::endpoint_slices`): read only.
//!
//! The revision is the object's resourceVersion, kept opaque. Every write is conditioned on
//! it: an update reads the object (a moved object is a conflict at once), then writes the
//! parts that differ, the object's fields and the status each as a JSON patch that sets
//! `metadata.resourceVersion` (the API server answers 409 Conflict when the object has moved
//! on meanwhile); a delete carries it as a precondition. So the operator, which writes only
//! statuses, never needs the right to change a spec, and an agent never a status. Watches
//! are kube-runtime's watcher, which lists again (a `Resync`) after `410 Gone` and backs off
//! while the API server is unreachable.

use ipam_core::lb::annotations::AnnotationSources;
use std::{collections::HashMap, sync::Arc};

use futures_util::StreamExt as _;
use ipam_core::store::{
    RawObject, Revision, Store, StoreError, WATCH_BUFFER, Watch, WatchEvent, lease::Lease,
};
use k8s_openapi::api::coordination::v1::LeaseSpec;
use kube::{
    Api, Client,
    api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, Preconditions},
    core::ApiResource,
    runtime::{WatchStreamExt as _, watcher},
};
use serde_json::{Value, json};

use crate::{conditions, crd};

/// How the engine's value of a kind sits in the Kubernetes object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `{spec, status}`: the spec on the object, the status through `/status`.
    SpecAndStatus,
    /// `{spec}` only.
    Spec,
    /// The whole value is the object's spec (kinds without a spec of their own).
    WholeAsSpec,
}

#[derive(Debug, Clone)]
enum Mapping {
    Custom {
        resource: ApiResource,
        layout: Layout,
    },
    Lease,
    Config,
    Service,
    EndpointSlice,
    /// core/v1 Namespaces, read only: their labels, for pools' `namespaceSelector`.
    Namespace,
    /// core/v1 Nodes, read only: whether a node still exists (a lapsed node keeps its blocks
    /// while it does).
    Node,
}

impl Mapping {
    /// Objects in users' namespaces (named `<namespace>/<name>`), written by others.
    fn namespaced_elsewhere(&self) -> bool {
        matches!(self, Self::Service | Self::EndpointSlice)
    }

    /// Objects others write, which this store only reads (a Service's status excepted).
    fn written_by_others(&self) -> bool {
        matches!(
            self,
            Self::Service | Self::EndpointSlice | Self::Namespace | Self::Node
        )
    }

    /// The API resource the kind's objects are.
    fn resource(&self) -> ApiResource {
        match self {
            Self::Custom { resource, .. } => resource.clone(),
            Self::Lease => lease_resource(),
            Self::Config => config_map_resource(),
            Self::Service => service_resource(),
            Self::EndpointSlice => endpoint_slice_resource(),
            Self::Namespace => namespace_resource(),
            Self::Node => node_resource(),
        }
    }
}

fn namespace_resource() -> ApiResource {
    ApiResource {
        group: String::new(),
        version: "v1".into(),
        api_version: "v1".into(),
        kind: "Namespace".into(),
        plural: "namespaces".into(),
    }
}

fn node_resource() -> ApiResource {
    ApiResource {
        group: String::new(),
        version: "v1".into(),
        api_version: "v1".into(),
        kind: "Node".into(),
        plural: "nodes".into(),
    }
}

fn endpoint_slice_resource() -> ApiResource {
    ApiResource {
        group: "discovery.k8s.io".into(),
        version: "v1".into(),
        api_version: "discovery.k8s.io/v1".into(),
        kind: "EndpointSlice".into(),
        plural: "endpointslices".into(),
    }
}

fn service_resource() -> ApiResource {
    ApiResource {
        group: String::new(),
        version: "v1".into(),
        api_version: "v1".into(),
        kind: "Service".into(),
        plural: "services".into(),
    }
}

#[derive(Clone)]
pub struct KubeStore {
    client: Client,
    /// Where the Leases and the ConfigMap live (the namespace the project is deployed in).
    namespace: String,
    kinds: Arc<HashMap<String, Mapping>>,
    /// Whose annotations on a Service are read (all unless `with_service_annotations`).
    service_annotations: AnnotationSources,
}

fn custom(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: crd::GROUP.to_owned(),
        version: crd::VERSION.to_owned(),
        api_version: format!("{}/{}", crd::GROUP, crd::VERSION),
        kind: kind.to_owned(),
        plural: plural.to_owned(),
    }
}

fn lease_resource() -> ApiResource {
    ApiResource {
        group: "coordination.k8s.io".into(),
        version: "v1".into(),
        api_version: "coordination.k8s.io/v1".into(),
        kind: "Lease".into(),
        plural: "leases".into(),
    }
}

fn config_map_resource() -> ApiResource {
    ApiResource {
        group: String::new(),
        version: "v1".into(),
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        plural: "configmaps".into(),
    }
}

impl KubeStore {
    /// A store on `client`, with its Leases and ConfigMap in `namespace`.
    pub fn new(client: Client, namespace: &str) -> Self {
        let mut kinds = HashMap::new();
        for (kind, plural, layout) in [
            ("PodIPPool", "podippools", Layout::SpecAndStatus),
            ("NodeIPAM", "nodeipams", Layout::SpecAndStatus),
            (
                "LoadBalancerIPPool",
                "loadbalancerippools",
                Layout::SpecAndStatus,
            ),
            (
                "L2AnnouncementPolicy",
                "l2announcementpolicies",
                Layout::Spec,
            ),
            ("BGPPeer", "bgppeers", Layout::SpecAndStatus),
            ("BGPAdvertisement", "bgpadvertisements", Layout::Spec),
        ] {
            kinds.insert(
                kind.to_owned(),
                Mapping::Custom {
                    resource: custom(kind, plural),
                    layout,
                },
            );
        }
        kinds.insert("Lease".to_owned(), Mapping::Lease);
        kinds.insert("IpamConfig".to_owned(), Mapping::Config);
        kinds.insert("Service".to_owned(), Mapping::Service);
        kinds.insert("ServiceEndpoints".to_owned(), Mapping::EndpointSlice);
        kinds.insert("Namespace".to_owned(), Mapping::Namespace);
        kinds.insert("Node".to_owned(), Mapping::Node);
        Self {
            client,
            namespace: namespace.to_owned(),
            kinds: Arc::new(kinds),
            service_annotations: AnnotationSources::default(),
        }
    }

    /// Maps one more kind to a cluster-scoped custom resource of the project's group (the
    /// conformance tests' kinds).
    pub fn with_kind(mut self, kind: &str, plural: &str, layout: Layout) -> Self {
        Arc::make_mut(&mut self.kinds).insert(
            kind.to_owned(),
            Mapping::Custom {
                resource: custom(kind, plural),
                layout,
            },
        );
        self
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Reads only these projects' annotations on Services (`[store] service_annotations`).
    pub fn with_service_annotations(mut self, sources: AnnotationSources) -> Self {
        self.service_annotations = sources;
        self
    }

    pub fn service_annotations(&self) -> &AnnotationSources {
        &self.service_annotations
    }

    pub(crate) fn client(&self) -> Client {
        self.client.clone()
    }

    /// The Kubernetes object behind the engine's `kind`/`name`, for an event to regard; `None`
    /// when it does not exist.
    pub(crate) async fn reference(
        &self,
        kind: &str,
        name: &str,
    ) -> Result<Option<k8s_openapi::api::core::v1::ObjectReference>, kube::Error> {
        let Ok(mapping) = self.mapping(kind) else {
            return Ok(None);
        };
        let resource = mapping.resource();
        let object = self
            .api_for(mapping, Some(name))
            .get_opt(&Self::object_name(mapping, name))
            .await?;
        Ok(object.map(|o| crate::events::reference_of(&o, &resource.api_version, &resource.kind)))
    }

    pub fn describe(&self) -> String {
        format!("the Kubernetes API (namespace {})", self.namespace)
    }

    fn mapping(&self, kind: &str) -> Result<&Mapping, StoreError> {
        self.kinds.get(kind).ok_or_else(|| StoreError::Backend {
            location: self.describe(),
            source: format!(
                "kind {kind} has no Kubernetes resource in this version; it cannot be kept in \
                 a Kubernetes store"
            )
            .into(),
        })
    }

    /// The API of `mapping`'s objects; for a Service or an EndpointSlice, of the namespace in
    /// `name` (`namespace/name`), or of every namespace without one.
    fn api_for(&self, mapping: &Mapping, name: Option<&str>) -> Api<DynamicObject> {
        match name.and_then(|n| n.split_once('/')) {
            Some((namespace, _)) if mapping.namespaced_elsewhere() => {
                Api::namespaced_with(self.client.clone(), namespace, &mapping.resource())
            }
            _ => self.api(mapping),
        }
    }

    /// The API of `mapping`'s objects: cluster-wide, or in the store's namespace.
    fn api(&self, mapping: &Mapping) -> Api<DynamicObject> {
        let resource = mapping.resource();
        match mapping {
            Mapping::Custom { .. }
            | Mapping::Service
            | Mapping::EndpointSlice
            | Mapping::Namespace
            | Mapping::Node => Api::all_with(self.client.clone(), &resource),
            Mapping::Lease | Mapping::Config => {
                Api::namespaced_with(self.client.clone(), &self.namespace, &resource)
            }
        }
    }

    fn object_name(mapping: &Mapping, name: &str) -> String {
        match mapping {
            Mapping::Config => format!("ipam-{name}"),
            Mapping::Service | Mapping::EndpointSlice => {
                name.split_once('/').map_or(name, |(_, n)| n).to_owned()
            }
            _ => name.to_owned(),
        }
    }

    fn engine_name(mapping: &Mapping, object: &DynamicObject) -> Option<String> {
        let name = object.metadata.name.as_deref()?;
        match mapping {
            Mapping::Config => name.strip_prefix("ipam-").map(str::to_owned),
            Mapping::Service | Mapping::EndpointSlice => Some(format!(
                "{}/{name}",
                object.metadata.namespace.as_deref().unwrap_or("default")
            )),
            _ => Some(name.to_owned()),
        }
    }

    /// The error for a write of a Service or an EndpointSlice, which this store does not make.
    fn read_only(&self, kind: &str, name: &str, what: &str) -> StoreError {
        let source = if kind == "Node" {
            format!(
                "{kind} {name}: Nodes are the kubelet's and the cluster's; this store only reads \
                 whether they exist"
            )
        } else if kind == "Namespace" {
            format!(
                "{kind} {name}: {what} Namespaces with kubectl; this store only reads their labels"
            )
        } else if kind == "ServiceEndpoints" {
            format!(
                "{kind} {name}: the EndpointSlice controller keeps EndpointSlices from the \
                 Service's selector and its pods; this store only reads them"
            )
        } else {
            format!(
                "{kind} {name}: {what} Services with kubectl (or your deployment tool); this \
                 store only reads them and writes their status"
            )
        };
        StoreError::Backend {
            location: self.describe(),
            source: source.into(),
        }
    }

    fn error(&self, kind: &str, name: &str, e: kube::Error) -> StoreError {
        match &e {
            kube::Error::Api(status) if status.code == 404 => StoreError::NotFound {
                kind: kind.to_owned(),
                name: name.to_owned(),
            },
            kube::Error::Api(status) if status.code == 409 && status.reason == "AlreadyExists" => {
                StoreError::AlreadyExists {
                    kind: kind.to_owned(),
                    name: name.to_owned(),
                }
            }
            _ => StoreError::Backend {
                location: self.describe(),
                source: Box::new(e),
            },
        }
    }

    /// The engine's view of an object.
    fn raw(&self, kind: &str, mapping: &Mapping, object: &DynamicObject) -> Option<RawObject> {
        let name = Self::engine_name(mapping, object)?;
        let value = match mapping {
            Mapping::Custom { layout, .. } => {
                let spec = object.data.get("spec").cloned().unwrap_or(json!({}));
                let mut v = match layout {
                    Layout::WholeAsSpec => return self.raw_value(kind, name, object, spec),
                    Layout::Spec => json!({ "spec": spec }),
                    Layout::SpecAndStatus => {
                        let mut v = json!({ "spec": spec });
                        if let Some(status) = object.data.get("status").filter(|s| !s.is_null()) {
                            v["status"] = conditions::to_engine(status);
                        }
                        v
                    }
                };
                // The object's labels, which selectors of other objects choose it by
                // (`ipPoolSelector`); kinds that have none ignore them.
                if let Some(labels) = object.metadata.labels.as_ref().filter(|l| !l.is_empty()) {
                    v["labels"] = json!(labels);
                }
                v
            }
            Mapping::Lease => {
                let spec: LeaseSpec = match object.data.get("spec") {
                    Some(spec) => serde_json::from_value(spec.clone()).ok()?,
                    None => LeaseSpec::default(),
                };
                serde_json::to_value(crate::lease::to_engine(&spec)).ok()?
            }
            Mapping::Config => json!({ "mode": object.data["data"]["mode"] }),
            Mapping::Service => {
                let service = k8s_openapi::api::core::v1::Service {
                    metadata: object.metadata.clone(),
                    spec: object
                        .data
                        .get("spec")
                        .and_then(|s| serde_json::from_value(s.clone()).ok()),
                    status: object
                        .data
                        .get("status")
                        .and_then(|s| serde_json::from_value(s.clone()).ok()),
                };
                crate::service::to_engine(&service, &self.service_annotations)
            }
            Mapping::Namespace => {
                json!({ "labels": object.metadata.labels.clone().unwrap_or_default() })
            }
            // Its podCIDRs, the kubernetes IPAM mode's blocks, as the controller manager set
            // them (routes in that mode come from here, not from the agents' records), and
            // its addresses between nodes (the routes' next hops).
            Mapping::Node => node_value(&object.data),
            Mapping::EndpointSlice => {
                let mut data = object.data.clone();
                data["metadata"] = serde_json::to_value(&object.metadata).ok()?;
                let slice = serde_json::from_value(data).ok()?;
                crate::endpoint_slices::to_engine(&slice)
            }
        };
        self.raw_value(kind, name, object, value)
    }

    fn raw_value(
        &self,
        kind: &str,
        name: String,
        object: &DynamicObject,
        value: Value,
    ) -> Option<RawObject> {
        Some(RawObject {
            kind: kind.to_owned(),
            name,
            revision: revision_of(object),
            value: serde_json::to_vec(&value).expect("JSON serialises"),
        })
    }

    /// What the object gets from the engine's value (its top-level fields but the status), and
    /// the status if the kind has one.
    fn split(mapping: &Mapping, value: &[u8]) -> Result<(Value, Option<Value>), String> {
        let value: Value = serde_json::from_slice(value).map_err(|e| e.to_string())?;
        Ok(match mapping {
            Mapping::Custom { layout, .. } => {
                let (mut body, status) = match layout {
                    Layout::WholeAsSpec => return Ok((json!({ "spec": value }), None)),
                    Layout::Spec => (json!({ "spec": value["spec"] }), None),
                    Layout::SpecAndStatus => (
                        json!({ "spec": value["spec"] }),
                        Some(value.get("status").cloned().unwrap_or(json!({}))),
                    ),
                };
                // Labels are written where the engine's value has them (a kind without any
                // leaves the labels a user set with kubectl alone).
                if let Some(labels) = value.get("labels") {
                    body["metadata"] = json!({ "labels": labels });
                }
                (body, status)
            }
            Mapping::Lease => {
                let lease: Lease = serde_json::from_value(value).map_err(|e| e.to_string())?;
                (json!({ "spec": crate::lease::to_kubernetes(&lease) }), None)
            }
            Mapping::Config => (json!({ "data": { "mode": value["mode"] } }), None),
            // The spec is the user's: only the status is written.
            Mapping::Service => (
                json!({}),
                Some(value.get("status").cloned().unwrap_or(json!({}))),
            ),
            Mapping::EndpointSlice | Mapping::Namespace | Mapping::Node => (json!({}), None),
        })
    }

    /// The object `object_name` as it is now, which must be at `expected`: `NotFound` or
    /// `Conflict` otherwise.
    async fn current_at(
        &self,
        api: &Api<DynamicObject>,
        kind: &str,
        name: &str,
        object_name: &str,
        expected: &Revision,
    ) -> Result<DynamicObject, StoreError> {
        let current = api
            .get_opt(object_name)
            .await
            .map_err(|e| self.error(kind, name, e))?
            .ok_or_else(|| StoreError::NotFound {
                kind: kind.to_owned(),
                name: name.to_owned(),
            })?;
        let at = revision_of(&current);
        if &at != expected {
            return Err(StoreError::Conflict {
                kind: kind.to_owned(),
                name: name.to_owned(),
                expected: expected.clone(),
                actual: at,
            });
        }
        Ok(current)
    }

    /// Writes `status` through the status subresource unless the object already has it;
    /// returns the object as it is now.
    async fn write_status(
        &self,
        api: &Api<DynamicObject>,
        mapping: &Mapping,
        kind: &str,
        name: &str,
        object: DynamicObject,
        status: &Value,
    ) -> Result<DynamicObject, StoreError> {
        let current = object.data.get("status").cloned().unwrap_or(Value::Null);
        let wanted = if let Mapping::Service = mapping {
            crate::service::status_to_kubernetes(status, &current)
        } else {
            conditions::to_kubernetes(status, &current)
        };
        if conditions::same_status(&wanted, &current) {
            return Ok(object);
        }
        let revision = revision_of(&object);
        let patch = precondition_and_set(&revision, "status", wanted);
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Json::<()>(patch))
            .await
        {
            Ok(written) => Ok(written),
            Err(e) => Err(self.refused(api, kind, name, name, &revision, e).await),
        }
    }

    /// Writes `body`'s spec under `expected`, with no read first: the API server refuses it
    /// (409) if the object moved on, and the caller reads then.
    async fn patch_under(
        &self,
        api: &Api<DynamicObject>,
        kind: &str,
        name: &str,
        object_name: &str,
        expected: &Revision,
        body: Value,
    ) -> Result<Revision, StoreError> {
        let spec = body.get("spec").cloned().unwrap_or_else(|| json!({}));
        let patch = precondition_and_set(expected, "spec", spec);
        match api
            .patch(
                object_name,
                &PatchParams::default(),
                &Patch::Json::<()>(patch),
            )
            .await
        {
            Ok(written) => Ok(revision_of(&written)),
            Err(kube::Error::Api(status)) if status.code == 404 => Err(StoreError::NotFound {
                kind: kind.to_owned(),
                name: name.to_owned(),
            }),
            Err(e) => Err(self
                .refused(api, kind, name, object_name, expected, e)
                .await),
        }
    }

    /// The error for a write the API server refused: a conflict names the version the object
    /// is at now (read again, as the server's answer does not say).
    async fn refused(
        &self,
        api: &Api<DynamicObject>,
        kind: &str,
        name: &str,
        object_name: &str,
        expected: &Revision,
        e: kube::Error,
    ) -> StoreError {
        match &e {
            kube::Error::Api(status) if status.code == 409 => {
                let actual = match api.get_opt(object_name).await {
                    Ok(Some(o)) => revision_of(&o),
                    Ok(None) => Revision::Opaque("(deleted)".into()),
                    Err(_) => Revision::Opaque("(unknown)".into()),
                };
                StoreError::Conflict {
                    kind: kind.to_owned(),
                    name: name.to_owned(),
                    expected: expected.clone(),
                    actual,
                }
            }
            _ => self.error(kind, name, e),
        }
    }
}

fn revision_of(object: &DynamicObject) -> Revision {
    Revision::Opaque(object.metadata.resource_version.clone().unwrap_or_default())
}

/// A JSON patch that holds only if the object is still at `revision` and then sets the
/// top-level field `field`.
fn precondition_and_set(revision: &Revision, field: &str, value: Value) -> json_patch::Patch {
    serde_json::from_value(json!([
        { "op": "replace", "path": "/metadata/resourceVersion", "value": revision.to_string() },
        { "op": "add", "path": format!("/{field}"), "value": value },
    ]))
    .expect("a well-formed JSON patch")
}

impl Store for KubeStore {
    async fn get(&self, kind: &str, name: &str) -> Result<Option<RawObject>, StoreError> {
        let mapping = self.mapping(kind)?;
        let object = self
            .api_for(mapping, Some(name))
            .get_opt(&Self::object_name(mapping, name))
            .await
            .map_err(|e| self.error(kind, name, e))?;
        Ok(object.and_then(|o| self.raw(kind, mapping, &o)))
    }

    async fn list(&self, kind: &str) -> Result<Vec<RawObject>, StoreError> {
        let mapping = self.mapping(kind)?;
        let list = self
            .api(mapping)
            .list(&ListParams::default())
            .await
            .map_err(|e| self.error(kind, "(list)", e))?;
        let mut out: Vec<RawObject> = list
            .items
            .iter()
            .filter_map(|o| self.raw(kind, mapping, o))
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    async fn create(&self, kind: &str, name: &str, value: Vec<u8>) -> Result<Revision, StoreError> {
        // The API server refuses the same names; checking here words it as the other stores do.
        ipam_core::store::check_name(kind, name)?;
        let mapping = self.mapping(kind)?;
        if mapping.written_by_others() {
            return Err(self.read_only(kind, name, "create"));
        }
        let resource = mapping.resource();
        let api = self.api(mapping);
        let (mut body, status) = Self::split(mapping, &value).map_err(|e| decode(kind, name, e))?;
        let object_name = Self::object_name(mapping, name);
        body["apiVersion"] = json!(resource.api_version);
        body["kind"] = json!(resource.kind);
        let labels = body["metadata"]["labels"].take();
        body["metadata"] = json!({ "name": object_name });
        if !labels.is_null() {
            body["metadata"]["labels"] = labels;
        }
        let object: DynamicObject = serde_json::from_value(body).expect("a DynamicObject");
        let created = api
            .create(&PostParams::default(), &object)
            .await
            .map_err(|e| self.error(kind, name, e))?;
        let done = match status {
            Some(status) => {
                self.write_status(&api, mapping, kind, &object_name, created, &status)
                    .await?
            }
            None => created,
        };
        Ok(revision_of(&done))
    }

    async fn update(
        &self,
        kind: &str,
        name: &str,
        value: Vec<u8>,
        expected: &Revision,
    ) -> Result<Revision, StoreError> {
        let mapping = self.mapping(kind)?;
        if let Mapping::EndpointSlice | Mapping::Namespace | Mapping::Node = mapping {
            return Err(self.read_only(kind, name, "change"));
        }
        let api = self.api_for(mapping, Some(name));
        let (mut body, status) = Self::split(mapping, &value).map_err(|e| decode(kind, name, e))?;
        let labels = body
            .as_object_mut()
            .and_then(|b| b.remove("metadata"))
            .and_then(|mut m| m.get_mut("labels").map(Value::take));
        let object_name = Self::object_name(mapping, name);
        if let Mapping::Lease = mapping {
            // A lease renewal is one write: its spec, under the revision the renewer holds.
            return self
                .patch_under(&api, kind, name, &object_name, expected, body)
                .await;
        }
        let current = self
            .current_at(&api, kind, name, &object_name, expected)
            .await?;
        // The object's own fields (spec, or data), where they differ, under the precondition.
        let changed: Vec<(&String, &Value)> = body
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(field, value)| current.data.get(field.as_str()) != Some(*value))
            .collect();
        let labels_changed = labels.as_ref().filter(|wanted| {
            let current = json!(current.metadata.labels.clone().unwrap_or_default());
            **wanted != current
        });
        let written = if changed.is_empty() && labels_changed.is_none() {
            current
        } else {
            let mut ops = vec![json!({
                "op": "replace", "path": "/metadata/resourceVersion", "value": expected.to_string()
            })];
            for (field, value) in changed {
                ops.push(json!({ "op": "add", "path": format!("/{field}"), "value": value }));
            }
            if let Some(labels) = labels_changed {
                ops.push(json!({ "op": "add", "path": "/metadata/labels", "value": labels }));
            }
            let patch: json_patch::Patch =
                serde_json::from_value(Value::Array(ops)).expect("a well-formed JSON patch");
            match api
                .patch(
                    &object_name,
                    &PatchParams::default(),
                    &Patch::Json::<()>(patch),
                )
                .await
            {
                Ok(written) => written,
                Err(e) => {
                    return Err(self
                        .refused(&api, kind, name, &object_name, expected, e)
                        .await);
                }
            }
        };
        let done = match status {
            Some(status) => {
                self.write_status(&api, mapping, kind, &object_name, written, &status)
                    .await?
            }
            None => written,
        };
        Ok(revision_of(&done))
    }

    /// Only the status subresource is written (for the kinds that have one): the spec is the
    /// user's as kubectl applied it, without the defaults the engine's value carries, and the
    /// writers of a status hold no right to patch the object itself (deploy/base/rbac.yaml).
    async fn update_status(
        &self,
        kind: &str,
        name: &str,
        value: Vec<u8>,
        expected: &Revision,
    ) -> Result<Revision, StoreError> {
        let mapping = self.mapping(kind)?;
        let (_, Some(status)) = Self::split(mapping, &value).map_err(|e| decode(kind, name, e))?
        else {
            // A kind without a status: the whole object is its writer's.
            return self.update(kind, name, value, expected).await;
        };
        let api = self.api_for(mapping, Some(name));
        let object_name = Self::object_name(mapping, name);
        let current = self
            .current_at(&api, kind, name, &object_name, expected)
            .await?;
        let done = self
            .write_status(&api, mapping, kind, &object_name, current, &status)
            .await?;
        Ok(revision_of(&done))
    }

    async fn delete(
        &self,
        kind: &str,
        name: &str,
        expected: Option<&Revision>,
    ) -> Result<(), StoreError> {
        let mapping = self.mapping(kind)?;
        if mapping.written_by_others() {
            return Err(self.read_only(kind, name, "delete"));
        }
        let params = DeleteParams {
            preconditions: expected.map(|r| Preconditions {
                resource_version: Some(r.to_string()),
                uid: None,
            }),
            ..DeleteParams::default()
        };
        let api = self.api(mapping);
        let object_name = Self::object_name(mapping, name);
        match api.delete(&object_name, &params).await {
            Ok(_) => Ok(()),
            // Deleting nothing is not an error.
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(e) => {
                let expected = expected.cloned().unwrap_or(Revision::Opaque(String::new()));
                Err(self
                    .refused(&api, kind, name, &object_name, &expected, e)
                    .await)
            }
        }
    }

    async fn watch(&self, kind: &str) -> Result<Watch, StoreError> {
        let mapping = self.mapping(kind)?.clone();
        let api = self.api(&mapping);
        let mut events = watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        let initial = self.first_listing(kind, &mapping, &mut events).await?;
        let (tx, rx) = tokio::sync::mpsc::channel(WATCH_BUFFER);
        let follower = Follower {
            store: self.clone(),
            kind: kind.to_owned(),
            mapping,
            relisting: None,
        };
        tokio::spawn(follower.run(events, tx));
        // kube-runtime's watcher does not expose the listing's resourceVersion.
        Ok(Watch::new(initial, Revision::Opaque(String::new()), rx))
    }
}

/// What kube-runtime's watcher yields for one kind.
type WatchEvents =
    futures_util::stream::BoxStream<'static, Result<watcher::Event<DynamicObject>, watcher::Error>>;

impl KubeStore {
    /// The watch's snapshot: its first listing, sorted by name.
    async fn first_listing(
        &self,
        kind: &str,
        mapping: &Mapping,
        events: &mut WatchEvents,
    ) -> Result<Vec<RawObject>, StoreError> {
        let mut initial = Vec::new();
        loop {
            match events.next().await {
                Some(Ok(watcher::Event::Init)) => initial.clear(),
                Some(Ok(watcher::Event::InitApply(o))) => {
                    initial.extend(self.raw(kind, mapping, &o));
                }
                Some(Ok(watcher::Event::InitDone)) => break,
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    return Err(StoreError::Backend {
                        location: self.describe(),
                        source: Box::new(e),
                    });
                }
                None => {
                    return Err(StoreError::Backend {
                        location: self.describe(),
                        source: "the watch ended before its first listing".into(),
                    });
                }
            }
        }
        initial.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(initial)
    }
}

/// Turns the watcher's events after the first listing into the store's, for one kind.
struct Follower {
    store: KubeStore,
    kind: String,
    mapping: Mapping,
    /// A relist in progress (after 410 Gone, or a broken watch): the objects so far.
    relisting: Option<Vec<RawObject>>,
}

impl Follower {
    async fn run(
        mut self,
        mut events: WatchEvents,
        tx: tokio::sync::mpsc::Sender<Result<WatchEvent, StoreError>>,
    ) {
        loop {
            // A reader that dropped the watch (the daemon's shared watch drops one that failed
            // and starts another) ends it now, not at the watcher's next event: a watch
            // refused with 403 would otherwise be retried for up to the watcher's 30 s backoff.
            let event = tokio::select! {
                event = events.next() => event,
                () = tx.closed() => return,
            };
            let Some(event) = event else { return };
            if let Some(out) = self.translate(event)
                && tx.send(out).await.is_err()
            {
                return;
            }
        }
    }

    /// The store's event for one of the watcher's, if it makes one.
    fn translate(
        &mut self,
        event: Result<watcher::Event<DynamicObject>, watcher::Error>,
    ) -> Option<Result<WatchEvent, StoreError>> {
        let (store, kind, mapping) = (&self.store, self.kind.as_str(), &self.mapping);
        match event {
            Ok(watcher::Event::Apply(o)) => {
                store.raw(kind, mapping, &o).map(WatchEvent::Put).map(Ok)
            }
            Ok(watcher::Event::Delete(o)) => store.raw(kind, mapping, &o).map(|r| {
                Ok(WatchEvent::Deleted {
                    kind: r.kind,
                    name: r.name,
                    revision: r.revision,
                })
            }),
            // A relist: the whole kind again.
            Ok(watcher::Event::Init) => {
                self.relisting = Some(Vec::new());
                None
            }
            Ok(watcher::Event::InitApply(o)) => {
                if let (Some(list), Some(r)) =
                    (self.relisting.as_mut(), store.raw(kind, mapping, &o))
                {
                    list.push(r);
                }
                None
            }
            Ok(watcher::Event::InitDone) => self.relisting.take().map(|objects| {
                Ok(WatchEvent::Resync {
                    kind: kind.to_owned(),
                    revision: Revision::Opaque(String::new()),
                    objects,
                })
            }),
            // 410 Gone: the watcher lists again by itself, and the listing comes as a
            // `Resync`. Not trouble: an error here would make the daemon count the kind stale
            // and list it a second time (`cluster/shared_watch.rs` in ipam-daemon).
            Err(watcher::Error::WatchError(status)) if status.code == 410 => {
                tracing::debug!(kind, "watch told 410 Gone; the watcher lists again");
                None
            }
            Err(e) => Some(Err(StoreError::Backend {
                location: store.describe(),
                source: Box::new(e),
            })),
        }
    }
}

fn decode(kind: &str, name: &str, e: String) -> StoreError {
    StoreError::Backend {
        location: format!("{kind} {name}"),
        source: format!("not a JSON object: {e}").into(),
    }
}

/// What the engine reads of a Node (`ClusterNode`): its `spec.podCIDRs`, and its
/// `status.addresses` of type InternalIP.
fn node_value(data: &Value) -> Value {
    let mut value = json!({});
    if let Some(cidrs @ Value::Array(_)) = data["spec"].get("podCIDRs") {
        value["podCIDRs"] = cidrs.clone();
    }
    let addresses: Vec<&str> = data["status"]["addresses"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["type"] == "InternalIP")
        .filter_map(|a| a["address"].as_str())
        .collect();
    if !addresses.is_empty() {
        value["addresses"] = json!(addresses);
    }
    value
}
