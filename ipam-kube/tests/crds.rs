//! The checked-in CRDs (`deploy/base/crds.yaml`) are the ones the Rust types generate, and they keep
//! to what the API server requires of them: structural schemas, the status subresource, cluster
//! scope, the validation rules. `IPAM_WRITE_CRDS=1` rewrites the file from the types.

use std::path::PathBuf;

fn checked_in() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/base/crds.yaml")
}

#[test]
fn checked_in_crds_match_the_types() {
    let generated = ipam_kube::crd::yaml();
    if std::env::var_os("IPAM_WRITE_CRDS").is_some() {
        std::fs::write(checked_in(), &generated).expect("write deploy/base/crds.yaml");
    }
    let on_disk = std::fs::read_to_string(checked_in()).expect("read deploy/base/crds.yaml");
    assert!(
        on_disk == generated,
        "deploy/base/crds.yaml differs from the CRDs the types in ipam-kube/src/crd.rs generate; \
         regenerate it with `IPAM_WRITE_CRDS=1 cargo test -p ipam-kube --test crds` and commit it"
    );
}

#[test]
fn crds_are_cluster_scoped_with_status_and_structural_schemas() {
    for crd in ipam_kube::crd::all() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let spec = &crd.spec;
        assert_eq!(spec.group, "ipam-ebpf.io", "{name}");
        assert_eq!(spec.scope, "Cluster", "{name}");
        assert_eq!(name, format!("{}.{}", spec.names.plural, spec.group));
        let version = &spec.versions[0];
        assert_eq!(
            (version.name.as_str(), version.served, version.storage),
            ("v1alpha1", true, true)
        );
        let schema = serde_json::to_value(version.schema.as_ref().unwrap()).unwrap();
        assert_structural(&schema["openAPIV3Schema"], &name);
        let has_status = schema["openAPIV3Schema"]["properties"]["status"].is_object();
        assert_eq!(
            version
                .subresources
                .as_ref()
                .is_some_and(|s| s.status.is_some()),
            has_status,
            "{name}: a status is written through the status subresource"
        );
    }
}

#[test]
fn mask_size_is_immutable_by_a_cel_rule() {
    let yaml = ipam_kube::crd::yaml();
    assert!(
        yaml.contains("rule: self.maskSize == oldSelf.maskSize"),
        "{yaml}"
    );
    assert!(yaml.contains("format: cidr"));
    assert!(yaml.contains("x-kubernetes-int-or-string: true"));
}

/// What Kubernetes calls structural: every node has a type (or is int-or-string / preserves
/// unknown fields), no `$ref`, and no type hidden in `anyOf`/`oneOf` alone.
fn assert_structural(node: &serde_json::Value, at: &str) {
    let Some(map) = node.as_object() else { return };
    assert!(!map.contains_key("$ref"), "{at}: $ref is not allowed");
    let typed = map.contains_key("type")
        || map.get("x-kubernetes-int-or-string") == Some(&serde_json::Value::Bool(true))
        || map.get("x-kubernetes-preserve-unknown-fields") == Some(&serde_json::Value::Bool(true));
    assert!(typed, "{at}: no type in {node}");
    if let Some(props) = map.get("properties").and_then(|p| p.as_object()) {
        for (key, value) in props {
            assert_structural(value, &format!("{at}.{key}"));
        }
    }
    if let Some(items) = map.get("items") {
        assert_structural(items, &format!("{at}[]"));
    }
    if let Some(values) = map.get("additionalProperties").filter(|v| v.is_object()) {
        assert_structural(values, &format!("{at}{{}}"));
    }
}

/// A printer column whose path names no field of the schema is always empty in `kubectl get`
/// (L2AnnouncementPolicy's `LB IPs` column once read `.spec.loadBalancerIPs` while the field was
/// spelled `loadBalancerIps`).
#[test]
fn every_printer_column_names_a_field_of_the_schema() {
    for crd in ipam_kube::crd::all() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let version = &crd.spec.versions[0];
        let schema = serde_json::to_value(version.schema.as_ref().unwrap()).unwrap();
        let columns = version.additional_printer_columns.as_deref().unwrap_or(&[]);
        assert!(!columns.is_empty(), "{name} has printer columns");
        for column in columns {
            let path = without_brackets(&column.json_path);
            let mut at = &schema["openAPIV3Schema"];
            for segment in path.trim_start_matches('.').split('.') {
                if segment == "metadata" {
                    break; // ObjectMeta: the API server's, not in the CRD's schema
                }
                let (field, indexed) = match segment.strip_suffix("[]") {
                    Some(field) => (field, true),
                    None => (segment, false),
                };
                at = &at["properties"][field];
                assert!(
                    at.is_object(),
                    "{name}: printer column {:?} reads {}, but the schema has no field {field:?} there",
                    column.name,
                    column.json_path
                );
                if indexed {
                    at = &at["items"];
                }
            }
        }
    }
}

/// `a[?(@.type=="Ready")].b` → `a[].b`: a filter's own dots are not steps of the path.
fn without_brackets(path: &str) -> String {
    let mut out = String::new();
    let mut depth = 0;
    for c in path.chars() {
        match c {
            '[' => {
                if depth == 0 {
                    out.push_str("[]");
                }
                depth += 1;
            }
            ']' => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out
}

/// The old spelling of a renamed field stays in the schema, marked deprecated, so the API
/// server does not prune it from objects written before the rename.
#[test]
fn renamed_fields_keep_their_old_spelling_in_the_schema() {
    for renamed in ipam_core::spelling::RENAMED {
        let Some(crd) = ipam_kube::crd::all()
            .into_iter()
            .find(|c| c.spec.names.kind == renamed.kind)
        else {
            continue; // Services are core/v1
        };
        let schema = serde_json::to_value(crd.spec.versions[0].schema.as_ref().unwrap()).unwrap();
        let fields = &schema["openAPIV3Schema"]["properties"][renamed.parent]["properties"];
        assert!(fields[renamed.new].is_object(), "{renamed:?}");
        let old = &fields[renamed.old];
        assert_eq!(old["type"], fields[renamed.new]["type"], "{renamed:?}");
        // A server-side default would put the new name beside an old one a user wrote.
        assert!(
            old.get("default").is_none() && fields[renamed.new].get("default").is_none(),
            "{renamed:?}: no schema default on either spelling"
        );
        assert!(
            old["description"]
                .as_str()
                .is_some_and(|d| d.starts_with("Deprecated") && d.contains(renamed.new)),
            "{old}"
        );
    }
}
