//! Field names that changed to Kubernetes' spelling. Kubernetes writes initialisms in capitals
//! (`loadBalancerIPs`, `externalIPs`, `podCIDRs`), and so do Cilium's CRDs; the first versions
//! of these resources wrote `loadBalancerIps`, and a printer column or a user's YAML that used
//! the Kubernetes spelling then read nothing. The new spelling is the one written; the old one
//! is still read (serde aliases on the fields), and whoever reads an object that still uses it
//! says so, once per object and process, with the name to use instead.

use std::collections::BTreeSet;

use serde_json::Value;

/// A field of `kind` whose name was `old` and is `new` now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Renamed {
    pub kind: &'static str,
    /// Where the field sits in the stored document, e.g. `spec`.
    pub parent: &'static str,
    pub old: &'static str,
    pub new: &'static str,
}

/// Every renamed field. A rename is added here and as `alias = old` on the field, together.
pub const RENAMED: &[Renamed] = &[
    Renamed {
        kind: "LoadBalancerIPPool",
        parent: "spec",
        old: "allowFirstLastIps",
        new: "allowFirstLastIPs",
    },
    Renamed {
        kind: "Service",
        parent: "spec",
        old: "requestedIps",
        new: "requestedIPs",
    },
    Renamed {
        kind: "Service",
        parent: "spec",
        old: "externalIps",
        new: "externalIPs",
    },
    Renamed {
        kind: "L2AnnouncementPolicy",
        parent: "spec",
        old: "loadBalancerIps",
        new: "loadBalancerIPs",
    },
    Renamed {
        kind: "L2AnnouncementPolicy",
        parent: "spec",
        old: "externalIps",
        new: "externalIPs",
    },
    Renamed {
        kind: "NodeIPAM",
        parent: "spec",
        old: "podCidrs",
        new: "podCIDRs",
    },
];

/// The renamed fields `document` (an object of `kind` as stored: `{spec, status}`) still
/// spells the old way.
pub fn old_spellings(kind: &str, document: &Value) -> Vec<Renamed> {
    RENAMED
        .iter()
        .filter(|r| r.kind == kind && document[r.parent].get(r.old).is_some())
        .copied()
        .collect()
}

/// Logs, once per object and process, each old spelling the stored object `kind/name` still
/// uses. Cheap when there is none: the JSON is parsed only when one of the old names occurs in
/// it at all.
pub fn note_old_spellings(kind: &str, name: &str, json: &[u8]) {
    let candidates = RENAMED.iter().filter(|r| r.kind == kind);
    if !candidates.clone().any(|r| contains(json, r.old)) {
        return;
    }
    let Ok(document) = serde_json::from_slice::<Value>(json) else {
        return;
    };
    let old = old_spellings(kind, &document);
    if old.is_empty() || !first_time(kind, name) {
        return;
    }
    for r in old {
        tracing::warn!(
            kind,
            name,
            "{kind} {name}: {} is the old spelling of {}.{}; it is still read, but write {} \
             (re-apply the object with the new name)",
            r.old,
            r.parent,
            r.new,
            r.new
        );
    }
}

fn contains(json: &[u8], key: &str) -> bool {
    let quoted = format!("\"{key}\"");
    json.windows(quoted.len()).any(|w| w == quoted.as_bytes())
}

/// Whether `kind/name` is noted for the first time in this process.
fn first_time(kind: &str, name: &str) -> bool {
    static NOTED: std::sync::Mutex<BTreeSet<(String, String)>> =
        std::sync::Mutex::new(BTreeSet::new());
    NOTED
        .lock()
        .is_ok_and(|mut noted| noted.insert((kind.to_owned(), name.to_owned())))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn old_spellings_are_found_where_they_are_and_only_there() {
        let old = json!({ "spec": { "loadBalancerIps": false, "interfaces": ["eth0"] } });
        let found = old_spellings("L2AnnouncementPolicy", &old);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].new, "loadBalancerIPs");
        let new = json!({ "spec": { "loadBalancerIPs": false } });
        assert!(old_spellings("L2AnnouncementPolicy", &new).is_empty());
        // The same word in a label's value is not a field.
        let label = json!({ "spec": { "labels": { "x": "loadBalancerIps" } } });
        assert!(old_spellings("Service", &label).is_empty());
        assert!(first_time("Service", "shop/web"));
        assert!(!first_time("Service", "shop/web"), "noted once per object");
    }
}
