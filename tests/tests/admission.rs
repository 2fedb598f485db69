//! deploy/base/admission.yaml's ValidatingAdmissionPolicy, evaluated offline: no Kubernetes API
//! server runs on the machines the tests run on, so its CEL is evaluated here with the `cel`
//! crate over admission requests shaped as the API server builds them (`request.userInfo` with
//! the node-name claim that service account tokens carry since Kubernetes 1.30). This checks the
//! policy's logic: an agent may write only its own node's NodeIPAM and Lease, and the denial
//! says what it may write. The API server's own evaluation (type checking, its CEL libraries)
//! must still be checked on a real cluster.

use std::{collections::HashMap, sync::Arc};

use cel::{Context, Program, Value};
use ipam_tests::deploy::documents;
use serde_json::{Value as Json, json};

const AGENT: &str = "system:serviceaccount:ipam-system:ipam-agent";

/// What the policy decides for a request.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Its match constraints or conditions leave the request alone.
    NotApplicable,
    Allowed,
    Denied(String),
}

struct Policy {
    spec: Json,
}

fn compile(expression: &Json) -> Program {
    let text = expression.as_str().expect("an expression");
    Program::compile(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn run(program: &Program, context: &Context) -> Value {
    program
        .execute(context)
        .unwrap_or_else(|e| panic!("{program:?}: {e}"))
}

/// The agent's policy on its records and leases.
const OWN_NODE: &str = "ipam-agent-own-node";
/// The agent's policy on the BGPPeers' status.
const OWN_BGP_SESSION: &str = "ipam-agent-own-bgp-session";

impl Policy {
    fn named(name: &str) -> Self {
        let policy = documents(&ipam_tests::deploy::dir().join("admission.yaml"))
            .into_iter()
            .find(|d| d["kind"] == "ValidatingAdmissionPolicy" && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("the ValidatingAdmissionPolicy {name} in deploy/"));
        Self {
            spec: policy["spec"].clone(),
        }
    }

    fn load() -> Self {
        Self::named(OWN_NODE)
    }

    /// The resource rules: group, resource (with its subresource: `bgppeers/status`) and
    /// operation.
    fn matches(&self, request: &Json) -> bool {
        let has = |list: &Json, value: &Json| {
            list.as_array()
                .is_some_and(|l| l.iter().any(|v| v == value || v == "*"))
        };
        let resource = match request["subResource"].as_str() {
            Some(sub) => json!(format!(
                "{}/{sub}",
                request["resource"]["resource"].as_str().unwrap_or_default()
            )),
            None => request["resource"]["resource"].clone(),
        };
        self.spec["matchConstraints"]["resourceRules"]
            .as_array()
            .expect("resourceRules")
            .iter()
            .any(|rule| {
                has(&rule["apiGroups"], &request["resource"]["group"])
                    && has(&rule["resources"], &resource)
                    && has(&rule["operations"], &request["operation"])
            })
    }

    fn decide(&self, request: Json) -> Verdict {
        self.decide_on(request, &Json::Null, &Json::Null)
    }

    /// As `decide`, for a write of `object` over `old_object`.
    fn decide_on(&self, request: Json, object: &Json, old_object: &Json) -> Verdict {
        if !self.matches(&request) {
            return Verdict::NotApplicable;
        }
        let mut context = Context::default();
        context.add_variable_from_value("request", cel::to_value(&request).expect("request"));
        context.add_variable_from_value("object", cel::to_value(object).expect("object"));
        context.add_variable_from_value("oldObject", cel::to_value(old_object).expect("oldObject"));
        for condition in self.spec["matchConditions"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if run(&compile(&condition["expression"]), &context) != Value::Bool(true) {
                return Verdict::NotApplicable;
            }
        }
        // Each variable sees the ones before it.
        let mut variables: HashMap<String, Value> = HashMap::new();
        for variable in self.spec["variables"].as_array().into_iter().flatten() {
            context.add_variable_from_value("variables", variables.clone());
            let value = run(&compile(&variable["expression"]), &context);
            variables.insert(variable["name"].as_str().expect("a name").to_owned(), value);
        }
        context.add_variable_from_value("variables", variables);
        for validation in self.spec["validations"].as_array().expect("validations") {
            if run(&compile(&validation["expression"]), &context) != Value::Bool(true) {
                return match run(&compile(&validation["messageExpression"]), &context) {
                    Value::String(message) => Verdict::Denied(Arc::unwrap_or_clone(message)),
                    other => panic!("the message is not a string: {other:?}"),
                };
            }
        }
        Verdict::Allowed
    }
}

/// An admission request as the API server builds it for `user` (with the node-name claim of
/// the pod's token, if any) writing `resource` object `name`.
fn request(user: &str, node: Option<&str>, operation: &str, resource: &str, name: &str) -> Json {
    let (group, namespace) = match resource {
        "leases" => ("coordination.k8s.io", "ipam-system"),
        _ => ("ipam-ebpf.io", ""),
    };
    let mut extra = json!({});
    if let Some(node) = node {
        extra["authentication.kubernetes.io/node-name"] = json!([node]);
        extra["authentication.kubernetes.io/pod-name"] = json!(["ipam-agent-x7k2p"]);
    }
    json!({
        "uid": "5c4e6a3e-0000-4000-8000-000000000001",
        "kind": { "group": group, "version": "v1", "kind": "Object" },
        "resource": { "group": group, "version": "v1", "resource": resource },
        "name": name,
        "namespace": namespace,
        "operation": operation,
        "userInfo": {
            "username": user,
            "groups": ["system:serviceaccounts", "system:serviceaccounts:ipam-system", "system:authenticated"],
            "extra": extra,
        },
    })
}

#[test]
fn an_agent_writes_only_its_own_nodes_record_and_lease() {
    let policy = Policy::load();
    let agent = |operation: &str, resource: &str, name: &str| {
        policy.decide(request(AGENT, Some("worker-1"), operation, resource, name))
    };
    for operation in ["CREATE", "UPDATE", "DELETE"] {
        assert_eq!(agent(operation, "nodeipams", "worker-1"), Verdict::Allowed);
        assert_eq!(
            agent(operation, "leases", "node-worker-1"),
            Verdict::Allowed
        );
    }
    assert_eq!(
        agent("UPDATE", "nodeipams", "worker-2"),
        Verdict::Denied(
            "the ipam agent on node worker-1 may write only worker-1, not worker-2".into()
        )
    );
    assert_eq!(
        agent("UPDATE", "leases", "node-worker-2"),
        Verdict::Denied(
            "the ipam agent on node worker-1 may write only node-worker-1, not node-worker-2"
                .into()
        )
    );
    // Not the operators' election lease either.
    assert!(matches!(
        agent("UPDATE", "leases", "ipam-operator"),
        Verdict::Denied(_)
    ));
    // A token without the node claim (a cluster older than 1.30, or a token made by hand)
    // writes nothing.
    assert!(matches!(
        policy.decide(request(AGENT, None, "UPDATE", "nodeipams", "worker-1")),
        Verdict::Denied(_)
    ));
}

#[test]
fn other_users_and_other_objects_are_left_alone() {
    let policy = Policy::load();
    let operator = "system:serviceaccount:ipam-system:ipam-operator";
    assert_eq!(
        policy.decide(request(operator, None, "UPDATE", "leases", "ipam-operator")),
        Verdict::NotApplicable
    );
    assert_eq!(
        policy.decide(request(operator, None, "UPDATE", "nodeipams", "worker-2")),
        Verdict::NotApplicable
    );
    assert_eq!(
        policy.decide(request(
            AGENT,
            Some("worker-1"),
            "UPDATE",
            "podippools",
            "default"
        )),
        Verdict::NotApplicable
    );
}

/// A BGPPeer's status as the agents write it: one session entry per node, and the
/// `Established` condition over them.
fn peer_with_sessions(sessions: &[(&str, &str)]) -> Json {
    let nodes: Vec<Json> = sessions
        .iter()
        .map(|(node, state)| json!({ "node": node, "state": state, "routesAdvertised": 2 }))
        .collect();
    let up = sessions.iter().all(|(_, state)| *state == "Established");
    json!({
        "apiVersion": "ipam-ebpf.io/v1alpha1", "kind": "BGPPeer",
        "metadata": { "name": "tor" },
        "spec": { "peerAddress": "192.0.2.1", "peerASN": 64500, "localASN": 64512 },
        "status": {
            "nodes": nodes,
            "conditions": [{ "type": "Established", "status": if up { "True" } else { "False" },
                "reason": "Sessions", "message": "", "lastTransitionTime": "2026-12-07T00:00:00Z" }],
        },
    })
}

/// An agent writes into a BGPPeer's status its own node's session, as `bgp::status` does
/// (its own entry put in place, the others left as they are), and nothing of another node's: a compromised
/// worker-1 reporting worker-2's session up, or taking it out, is refused (issue 58).
#[test]
fn an_agent_writes_only_its_own_session_into_a_bgp_peers_status() {
    let policy = Policy::named(OWN_BGP_SESSION);
    let write = |node: Option<&str>, old: &Json, new: &Json| {
        let mut request = request(AGENT, node, "UPDATE", "bgppeers", "tor");
        request["subResource"] = json!("status");
        policy.decide_on(request, new, old)
    };
    let before = peer_with_sessions(&[("worker-1", "Active"), ("worker-2", "Active")]);
    // Its own entry, changed, added or taken out: allowed.
    for after in [
        peer_with_sessions(&[("worker-1", "Established"), ("worker-2", "Active")]),
        peer_with_sessions(&[("worker-2", "Active")]),
    ] {
        assert_eq!(write(Some("worker-1"), &before, &after), Verdict::Allowed);
    }
    let first = json!({ "apiVersion": "ipam-ebpf.io/v1alpha1", "kind": "BGPPeer",
        "metadata": { "name": "tor" }, "spec": {} });
    assert_eq!(
        write(
            Some("worker-1"),
            &first,
            &peer_with_sessions(&[("worker-1", "Active")])
        ),
        Verdict::Allowed,
        "the first session into a status that had none"
    );
    // Another node's entry, changed, added or taken out: refused, and said so.
    let refused = "the ipam agent on node worker-1 may write only its own session into the \
                   status of BGPPeer tor, not another node's";
    for after in [
        peer_with_sessions(&[("worker-1", "Active"), ("worker-2", "Established")]),
        peer_with_sessions(&[("worker-1", "Active")]),
        peer_with_sessions(&[
            ("worker-1", "Active"),
            ("worker-2", "Active"),
            ("worker-3", "Established"),
        ]),
    ] {
        assert_eq!(
            write(Some("worker-1"), &before, &after),
            Verdict::Denied(refused.into())
        );
    }
    // The others' entries compared in their order and by the fields the agents write: an
    // entry out of order stays allowed as it was, a field only a newer release writes (or an
    // empty reason spelt out) is not compared, a changed count of routes is.
    let unsorted = peer_with_sessions(&[("worker-3", "Active"), ("worker-1", "Active")]);
    let mut newer = peer_with_sessions(&[("worker-3", "Active"), ("worker-1", "Established")]);
    // A field a newer release's CRD defines, which this release's agent does not write back.
    newer["status"]["nodes"][0]["holdTimeSeconds"] = json!(90);
    newer["status"]["nodes"][0]["reason"] = json!("");
    assert_eq!(write(Some("worker-1"), &unsorted, &newer), Verdict::Allowed);
    let mut more_routes = newer.clone();
    more_routes["status"]["nodes"][0]["routesAdvertised"] = json!(40);
    assert_eq!(
        write(Some("worker-1"), &unsorted, &more_routes),
        Verdict::Denied(refused.into())
    );
    // The Established condition says what the entries say, and is there.
    let condition_refused = |up: &str| {
        Verdict::Denied(format!(
            "the Established condition of BGPPeer tor must say whether every node's session is \
             Established: {up}"
        ))
    };
    let mut lying = peer_with_sessions(&[("worker-1", "Established"), ("worker-2", "Active")]);
    lying["status"]["conditions"][0]["status"] = json!("True");
    assert_eq!(
        write(Some("worker-1"), &before, &lying),
        condition_refused("False")
    );
    let all_up = peer_with_sessions(&[("worker-1", "Established"), ("worker-2", "Established")]);
    let one_up = peer_with_sessions(&[("worker-1", "Active"), ("worker-2", "Established")]);
    let mut denying = all_up.clone();
    denying["status"]["conditions"][0]["status"] = json!("False");
    assert_eq!(write(Some("worker-1"), &one_up, &all_up), Verdict::Allowed);
    assert_eq!(
        write(Some("worker-1"), &one_up, &denying),
        condition_refused("True")
    );
    let mut hiding = lying.clone();
    hiding["status"]
        .as_object_mut()
        .unwrap()
        .remove("conditions");
    assert_eq!(
        write(Some("worker-1"), &before, &hiding),
        condition_refused("False")
    );
    // A token without the node claim writes nothing; the operator and the spec are left alone.
    assert!(matches!(write(None, &before, &before), Verdict::Denied(_)));
    let operator = "system:serviceaccount:ipam-system:ipam-operator";
    let mut by_operator = request(operator, None, "UPDATE", "bgppeers", "tor");
    by_operator["subResource"] = json!("status");
    assert_eq!(
        policy.decide_on(by_operator, &before, &before),
        Verdict::NotApplicable
    );
    assert_eq!(
        policy.decide_on(
            request(AGENT, Some("worker-1"), "UPDATE", "bgppeers", "tor"),
            &before,
            &before
        ),
        Verdict::NotApplicable
    );
}
