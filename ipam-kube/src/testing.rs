//! An in-process stand-in for the Kubernetes API server, for tests only: no API server is
//! packaged for the machines the tests run on. It speaks the HTTP API the store uses, with the
//! server's rules where the store depends on them:
//!
//! - every write gets a new resourceVersion (an opaque string to clients); a write that
//!   changes nothing keeps the old one;
//! - a create of an existing name is `409 AlreadyExists`; a write whose object (or patch)
//!   carries another resourceVersion than the stored one is `409 Conflict`, as is a delete
//!   whose preconditions do not hold;
//! - with the status subresource (every custom resource), writes to the object leave its
//!   status as it was and writes to `/status` change nothing else;
//! - JSON patches (RFC 6902) and merge patches;
//! - lists carry the collection's resourceVersion; watches stream every change after the
//!   resourceVersion asked for, and answer `410 Gone` (an `ERROR` event, as the server does)
//!   when that version is older than the history kept, which makes clients list again.
//!
//! - field selectors of equalities (`spec.nodeName=n1,metadata.name=x`) on lists and watches
//!   (a watch leaves out changes to objects that do not match; the server would also send a
//!   `DELETED` for an object that stops matching, which none of the fields the store selects
//!   by can do);
//! - metadata-only lists and watches (`Accept: ...;as=PartialObjectMetadataList`), as
//!   `PartialObjectMetadata` objects.
//!
//! - a right taken away (`refuse`): that user's requests of that verb on that resource are
//!   answered `403 Forbidden` as RBAC answers them (to test a client that lacks, say, the
//!   `watch` right while `list` works).
//!
//! What it does not do: authentication, admission, schema validation, label selectors,
//! pagination (it returns everything at once, which the API allows).

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    body::{Body, Bytes},
    extract::{Request, State},
    http::{Method, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde_json::{Value, json};
use tokio::sync::broadcast;

/// How many changes the stand-in remembers for watches that resume.
const HISTORY: usize = 10_000;

/// A running stand-in; it stops when dropped.
pub struct StandIn {
    pub address: SocketAddr,
    state: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

struct Shared {
    store: Mutex<Objects>,
    /// Every kind of request served (for RBAC checks), with how many of each.
    requests: Mutex<BTreeMap<Served, u64>>,
    changes: broadcast::Sender<Change>,
    /// Bumped to end every open watch (as a restarting API server does).
    cut: tokio::sync::watch::Sender<u64>,
    /// (user, verb, resource) answered 403 Forbidden.
    refused: Mutex<std::collections::BTreeSet<(String, String, String)>>,
}

#[derive(Default)]
struct Objects {
    revision: u64,
    /// collection path (`/apis/g/v/plural` or `/api/v1/namespaces/ns/configmaps`) -> name ->
    /// object.
    items: BTreeMap<String, BTreeMap<String, Value>>,
    /// (revision, collection, event type, object), oldest first.
    history: std::collections::VecDeque<Change>,
    /// Watches from a revision before this one are answered 410 Gone.
    oldest: u64,
}

impl Objects {
    /// The object `name` of the target's collection, as stored.
    fn find(&self, target: &Target, name: &str) -> Option<Value> {
        self.items.get(&target.collection)?.get(name).cloned()
    }
}

#[derive(Clone, Debug)]
struct Change {
    revision: u64,
    collection: String,
    kind: &'static str,
    object: Value,
}

impl StandIn {
    /// Starts a stand-in on a free loopback port.
    pub async fn start() -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let address = listener.local_addr()?;
        let (changes, _) = broadcast::channel(HISTORY);
        let state = Arc::new(Shared {
            store: Mutex::new(Objects::default()),
            requests: Mutex::default(),
            changes,
            cut: tokio::sync::watch::Sender::new(0),
            refused: Mutex::default(),
        });
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(state.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(Self {
            address,
            state,
            stop: Some(stop),
        })
    }

    /// Refuses `user` the right to `verb` `resource` (a plural, `services`) from now on, with
    /// the 403 Forbidden RBAC answers: the request is still recorded as made.
    pub fn refuse(&self, user: &str, verb: &str, resource: &str) {
        self.state.refused.lock().expect("stand-in lock").insert((
            user.to_owned(),
            verb.to_owned(),
            resource.to_owned(),
        ));
    }

    /// A kube client for it.
    pub fn client(&self) -> kube::Client {
        let url: http::Uri = format!("http://{}", self.address)
            .parse()
            .expect("a loopback URL");
        let config = kube::Config::new(url);
        kube::Client::try_from(config).expect("a client for the stand-in")
    }

    /// Forgets the change history and every resourceVersion handed out so far, as an API
    /// server whose watch cache started again after etcd compacted: every watch that resumes
    /// is answered 410 Gone and must list again.
    pub fn compact(&self) {
        let mut store = self.state.store.lock().expect("stand-in lock");
        store.history.clear();
        store.oldest = store.revision + 2;
    }

    /// Every kind of request served so far.
    pub fn requests(&self) -> std::collections::BTreeSet<Served> {
        self.request_counts().into_keys().collect()
    }

    /// How many requests of each kind were served so far.
    pub fn request_counts(&self) -> BTreeMap<Served, u64> {
        self.state.requests.lock().expect("stand-in lock").clone()
    }

    /// Ends every open watch; clients resume from the last version they saw (and, after
    /// `compact`, are told 410 Gone and list again).
    pub fn end_watches(&self) {
        self.state.cut.send_modify(|n| *n += 1);
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A kind of request, as RBAC sees it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Served {
    /// Who made it: the bearer token the client sent to the stand-in (tests give each client
    /// its own), or `anonymous`; the user name on a real API server.
    pub user: String,
    /// The verb as RBAC names it: get, list, watch, create, update, patch, delete.
    pub verb: String,
    /// The API group, `""` for the core group.
    pub group: String,
    /// `plural`, or `plural/subresource`.
    pub resource: String,
}

/// A request's target: the collection, and the object and subresource if any.
#[derive(Clone)]
struct Target {
    /// The API group (`""` for the core group) and the resource, `plural[/status]`.
    group: String,
    resource: String,
    /// Where the objects are kept: `/api/v1/namespaces/ns/services`, `/apis/g/v/plural`.
    collection: String,
    /// For a request over every namespace (`/api/v1/services`): what the collections of each
    /// namespace start and end with.
    every_namespace: Option<(String, String)>,
    name: Option<String>,
    status: bool,
    /// The resource has a status subresource (custom resources do; ConfigMaps and Leases not).
    has_status: bool,
}

fn target(path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    // /api/v1/... or /apis/group/version/...
    let base = match *parts.first()? {
        "api" => 2,
        "apis" => 3,
        _ => return None,
    };
    let mut rest = &parts[base..];
    let api = parts[..base].join("/");
    let mut prefix = api.clone();
    let namespaced = rest.first() == Some(&"namespaces") && rest.len() >= 3;
    if namespaced {
        prefix = format!("{prefix}/namespaces/{}", rest[1]);
        rest = &rest[2..];
    }
    let plural = rest.first()?;
    // Custom resources and Services have a status subresource; Leases and ConfigMaps not.
    let custom = (parts[0] == "apis" && parts[1] != "coordination.k8s.io") || *plural == "services";
    let status = rest.get(2) == Some(&"status");
    Some(Target {
        group: if parts[0] == "api" {
            String::new()
        } else {
            parts[1].to_owned()
        },
        resource: if status {
            format!("{plural}/status")
        } else {
            (*plural).to_owned()
        },
        collection: format!("/{prefix}/{plural}"),
        every_namespace: (!namespaced)
            .then(|| (format!("/{api}/namespaces/"), format!("/{plural}"))),
        name: rest.get(1).map(|s| (*s).to_owned()),
        status,
        has_status: custom,
    })
}

async fn handle(State(state): State<Arc<Shared>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let Some(target) = target(parts.uri.path()) else {
        return status(StatusCode::NOT_FOUND, "NotFound", "no such path");
    };
    let query: BTreeMap<String, String> = parts
        .uri
        .query()
        .map(|q| {
            q.split('&')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_owned(), percent_decoded(v)))
                .collect()
        })
        .unwrap_or_default();
    let view = View {
        fields: query
            .get("fieldSelector")
            .map(|f| {
                f.split(',')
                    .filter_map(|term| {
                        let (path, value) =
                            term.split_once("==").or_else(|| term.split_once('='))?;
                        Some((path.to_owned(), value.to_owned()))
                    })
                    .collect()
            })
            .unwrap_or_default(),
        metadata_only: parts
            .headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("as=PartialObjectMetadata")),
    };
    let Ok(body) = axum::body::to_bytes(body, 16 << 20).await else {
        return status(StatusCode::BAD_REQUEST, "BadRequest", "unreadable body");
    };
    let watching = query.get("watch").is_some_and(|w| w == "true" || w == "1");
    let verb = match (&parts.method, &target.name) {
        (&Method::GET, None) if watching => "watch",
        (&Method::GET, None) => "list",
        (&Method::GET, Some(_)) => "get",
        (&Method::POST, _) => "create",
        (&Method::PUT, _) => "update",
        (&Method::PATCH, _) => "patch",
        (&Method::DELETE, _) => "delete",
        _ => "other",
    };
    let user = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("anonymous")
        .to_owned();
    *state
        .requests
        .lock()
        .expect("stand-in lock")
        .entry(Served {
            user: user.clone(),
            verb: verb.to_owned(),
            group: target.group.clone(),
            resource: target.resource.clone(),
        })
        .or_default() += 1;
    let refused = state.refused.lock().expect("stand-in lock").contains(&(
        user.clone(),
        verb.to_owned(),
        target.resource.clone(),
    ));
    if refused {
        // As RBAC words it.
        let message = format!(
            "{resource} is forbidden: User \"{user}\" cannot {verb} resource \"{resource}\" in \
             API group \"{group}\" at the cluster scope",
            resource = target.resource,
            group = target.group,
        );
        return status(StatusCode::FORBIDDEN, "Forbidden", &message);
    }
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    match (&parts.method, &target.name) {
        (&Method::GET, None) if watching => watch(&state, &target, &query, view),
        (&Method::GET, None) => list(&state, &target, &view),
        (&Method::GET, Some(name)) => get(&state, &target, name),
        (&Method::POST, None) => create(&state, &target, &body),
        (&Method::PUT, Some(name)) => match serde_json::from_slice::<Value>(&body) {
            Ok(new) => write(&state, &target, name, |_| Ok(new)),
            Err(e) => status(StatusCode::BAD_REQUEST, "BadRequest", &e.to_string()),
        },
        (&Method::PATCH, Some(name)) => write(&state, &target, name, |current| {
            patched(current, &body, &content_type)
        }),
        (&Method::DELETE, Some(name)) => delete(&state, &target, name, &body),
        _ => status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "not served by the stand-in",
        ),
    }
}

/// Why a write is refused: what the API server answers.
struct Refusal {
    code: StatusCode,
    reason: &'static str,
    message: String,
}

impl Refusal {
    fn response(&self) -> Response {
        status(self.code, self.reason, &self.message)
    }
}

fn patched(current: &Value, body: &Bytes, content_type: &str) -> Result<Value, Refusal> {
    let bad = |message: String| Refusal {
        code: StatusCode::UNPROCESSABLE_ENTITY,
        reason: "Invalid",
        message,
    };
    let mut doc = current.clone();
    if content_type.starts_with("application/json-patch+json") {
        let patch: json_patch::Patch =
            serde_json::from_slice(body).map_err(|e| bad(e.to_string()))?;
        json_patch::patch(&mut doc, &patch).map_err(|e| bad(e.to_string()))?;
    } else if content_type.starts_with("application/merge-patch+json") {
        let patch: Value = serde_json::from_slice(body).map_err(|e| bad(e.to_string()))?;
        json_patch::merge(&mut doc, &patch);
    } else {
        return Err(Refusal {
            code: StatusCode::UNSUPPORTED_MEDIA_TYPE,
            reason: "UnsupportedMediaType",
            message: format!("patch type {content_type:?} is not served by the stand-in"),
        });
    }
    Ok(doc)
}

impl Target {
    /// Whether a list or watch of this target covers the objects kept in `collection`.
    fn covers(&self, collection: &str) -> bool {
        collection == self.collection
            || self.every_namespace.as_ref().is_some_and(|(start, end)| {
                collection.starts_with(start.as_str()) && collection.ends_with(end.as_str())
            })
    }
}

/// What a list or watch shows: the objects its field selector matches, whole or their
/// metadata only.
#[derive(Clone, Default)]
struct View {
    /// (dotted path, value) pairs that must all hold.
    fields: Vec<(String, String)>,
    metadata_only: bool,
}

impl View {
    fn shows(&self, object: &Value) -> bool {
        self.fields.iter().all(|(path, value)| {
            let found = path
                .split('.')
                .try_fold(object, |v, key| v.get(key))
                .and_then(Value::as_str)
                .unwrap_or("");
            found == value
        })
    }

    fn of(&self, object: &Value) -> Value {
        if self.metadata_only {
            json!({
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": object["metadata"],
            })
        } else {
            object.clone()
        }
    }
}

/// A query parameter's value with its `%XX` escapes decoded.
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn list(state: &Shared, target: &Target, view: &View) -> Response {
    let store = state.store.lock().expect("stand-in lock");
    let items: Vec<Value> = store
        .items
        .iter()
        .filter(|(collection, _)| target.covers(collection))
        .flat_map(|(_, objects)| objects.values())
        .filter(|o| view.shows(o))
        .map(|o| view.of(o))
        .collect();
    json_response(
        StatusCode::OK,
        &json!({
            "kind": if view.metadata_only { "PartialObjectMetadataList" } else { "List" },
            "apiVersion": if view.metadata_only { "meta.k8s.io/v1" } else { "v1" },
            "metadata": { "resourceVersion": store.revision.to_string() },
            "items": items,
        }),
    )
}

fn get(state: &Shared, target: &Target, name: &str) -> Response {
    let store = state.store.lock().expect("stand-in lock");
    match store.find(target, name) {
        Some(object) => json_response(StatusCode::OK, &object),
        None => not_found(name),
    }
}

fn create(state: &Shared, target: &Target, body: &Bytes) -> Response {
    let mut object: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", &e.to_string()),
    };
    let Some(name) = object["metadata"]["name"].as_str().map(str::to_owned) else {
        return status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            "metadata.name is required",
        );
    };
    let mut store = state.store.lock().expect("stand-in lock");
    if store
        .items
        .get(&target.collection)
        .is_some_and(|m| m.contains_key(&name))
    {
        return status(
            StatusCode::CONFLICT,
            "AlreadyExists",
            &format!("{name} already exists"),
        );
    }
    if target.has_status {
        // POST ignores the status, as PUT does.
        if let Some(map) = object.as_object_mut() {
            map.remove("status");
        }
    }
    store.revision += 1;
    let revision = store.revision;
    let meta = &mut object["metadata"];
    if let Some(namespace) = target
        .collection
        .split("/namespaces/")
        .nth(1)
        .and_then(|r| r.split('/').next())
    {
        meta["namespace"] = json!(namespace);
    }
    meta["resourceVersion"] = json!(revision.to_string());
    meta["uid"] = json!(format!("stand-in-{revision}"));
    meta["generation"] = json!(1);
    meta["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
    store
        .items
        .entry(target.collection.clone())
        .or_default()
        .insert(name, object.clone());
    record(&mut store, state, target, "ADDED", &object);
    json_response(StatusCode::CREATED, &object)
}

/// A PUT or PATCH: `change` turns the stored object into the new one; the status
/// subresource rules and the resourceVersion precondition apply.
fn write(
    state: &Shared,
    target: &Target,
    name: &str,
    change: impl FnOnce(&Value) -> Result<Value, Refusal>,
) -> Response {
    let mut store = state.store.lock().expect("stand-in lock");
    let Some(current) = store.find(target, name) else {
        return not_found(name);
    };
    let mut new = match change(&current) {
        Ok(v) => v,
        Err(refusal) => return refusal.response(),
    };
    let current_version = current["metadata"]["resourceVersion"].clone();
    let asked = &new["metadata"]["resourceVersion"];
    if !asked.is_null() && *asked != current_version {
        return status(
            StatusCode::CONFLICT,
            "Conflict",
            &format!(
                "Operation cannot be fulfilled on {name}: the object has been modified; please \
                 apply your changes to the latest version and try again"
            ),
        );
    }
    if target.has_status {
        // Writes to the object keep its status; writes to /status keep everything else.
        let kept = if target.status {
            let mut kept = current.clone();
            kept["status"] = new.get("status").cloned().unwrap_or(Value::Null);
            kept
        } else {
            let mut kept = new.clone();
            match current.get("status") {
                Some(s) => kept["status"] = s.clone(),
                None => {
                    if let Some(map) = kept.as_object_mut() {
                        map.remove("status");
                    }
                }
            }
            kept
        };
        new = kept;
    }
    if let Some(map) = new.as_object_mut()
        && map.get("status") == Some(&Value::Null)
    {
        map.remove("status");
    }
    // Metadata the server owns stays as it was, except the version of a real change (the
    // namespace too: a replace that leaves it out gets the path's, as from the server).
    for key in [
        "uid",
        "creationTimestamp",
        "generation",
        "name",
        "namespace",
    ] {
        if let Some(value) = current["metadata"].get(key) {
            new["metadata"][key] = value.clone();
        }
    }
    new["metadata"]["resourceVersion"] = current_version;
    if new == current {
        return json_response(StatusCode::OK, &current);
    }
    if new.get("spec") != current.get("spec") {
        let generation = current["metadata"]["generation"].as_i64().unwrap_or(1) + 1;
        new["metadata"]["generation"] = json!(generation);
    }
    store.revision += 1;
    new["metadata"]["resourceVersion"] = json!(store.revision.to_string());
    store
        .items
        .entry(target.collection.clone())
        .or_default()
        .insert(name.to_owned(), new.clone());
    record(&mut store, state, target, "MODIFIED", &new);
    json_response(StatusCode::OK, &new)
}

fn delete(state: &Shared, target: &Target, name: &str, body: &Bytes) -> Response {
    let options: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let mut store = state.store.lock().expect("stand-in lock");
    let Some(current) = store.find(target, name) else {
        return not_found(name);
    };
    let precondition = &options["preconditions"]["resourceVersion"];
    if !precondition.is_null() && *precondition != current["metadata"]["resourceVersion"] {
        return status(
            StatusCode::CONFLICT,
            "Conflict",
            &format!("Precondition failed for {name}: the resourceVersion differs"),
        );
    }
    if let Some(m) = store.items.get_mut(&target.collection) {
        m.remove(name);
    }
    store.revision += 1;
    let mut gone = current;
    gone["metadata"]["resourceVersion"] = json!(store.revision.to_string());
    record(&mut store, state, target, "DELETED", &gone);
    json_response(
        StatusCode::OK,
        &json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 200}),
    )
}

fn record(
    store: &mut Objects,
    state: &Shared,
    target: &Target,
    kind: &'static str,
    object: &Value,
) {
    let change = Change {
        revision: store.revision,
        collection: target.collection.clone(),
        kind,
        object: object.clone(),
    };
    store.history.push_back(change.clone());
    while store.history.len() > HISTORY {
        if let Some(old) = store.history.pop_front() {
            store.oldest = old.revision + 1;
        }
    }
    let _ = state.changes.send(change);
}

fn watch(
    state: &Arc<Shared>,
    target: &Target,
    query: &BTreeMap<String, String>,
    view: View,
) -> Response {
    let since: u64 = query
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let timeout = Duration::from_secs(
        query
            .get("timeoutSeconds")
            .and_then(|v| v.parse().ok())
            .unwrap_or(290),
    );
    let (backlog, mut live) = {
        let store = state.store.lock().expect("stand-in lock");
        let live = state.changes.subscribe();
        if since != 0 && since + 1 < store.oldest {
            let gone = json!({
                "type": "ERROR",
                "object": {
                    "kind": "Status", "apiVersion": "v1", "status": "Failure",
                    "reason": "Expired", "code": 410,
                    "message": format!("too old resource version: {since} ({})", store.oldest - 1),
                }
            });
            return Response::builder()
                .status(StatusCode::OK)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(format!("{gone}\n")))
                .expect("a response");
        }
        let backlog: Vec<Change> = store
            .history
            .iter()
            .filter(|c| c.revision > since && target.covers(&c.collection))
            .filter(|c| view.shows(&c.object))
            .cloned()
            .collect();
        (backlog, live)
    };
    let target = target.clone();
    let mut cut = state.cut.subscribe();
    cut.mark_unchanged();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(256);
    tokio::spawn(async move {
        let line = |c: &Change| {
            Bytes::from(format!(
                "{}\n",
                json!({"type": c.kind, "object": view.of(&c.object)})
            ))
        };
        let mut last = since;
        for c in &backlog {
            last = c.revision;
            if tx.send(Ok(line(c))).await.is_err() {
                return;
            }
        }
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                () = &mut deadline => return,
                _ = cut.changed() => return,
                change = live.recv() => match change {
                    Ok(c) if c.revision > last && target.covers(&c.collection) && view.shows(&c.object) => {
                        last = c.revision;
                        if tx.send(Ok(line(&c))).await.is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    // Too slow a reader: end the watch; the client resumes from `last`.
                    Err(_) => return,
                },
            }
        }
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        ))
        .expect("a response")
}

fn json_response(code: StatusCode, value: &Value) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response()
}

fn not_found(name: &str) -> Response {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        &format!("{name} not found"),
    )
}

fn status(code: StatusCode, reason: &str, message: &str) -> Response {
    json_response(
        code,
        &json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code.as_u16(),
        }),
    )
}
