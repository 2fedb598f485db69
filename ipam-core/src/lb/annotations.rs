//! The annotations a Service asks with: this project's, and those users coming from Cilium
//! LB-IPAM or MetalLB already carry. Which projects' are read is a setting
//! (`AnnotationSources`, `[store] service_annotations`); among those read, the first present in
//! the order of each list below wins, and two that say different things are reported
//! (`Asked::conflicts`) while the first is used.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub const IPS_ANNOTATION: &str = "ipam-ebpf.io/ips";
pub const SHARING_KEY_ANNOTATION: &str = "ipam-ebpf.io/sharing-key";

/// The IPs a Service asks for (comma-separated): this project's, Cilium LB-IPAM's, MetalLB's
/// and MetalLB's older one.
pub const IPS_ANNOTATIONS: [&str; 4] = [
    IPS_ANNOTATION,
    "lbipam.cilium.io/ips",
    "metallb.io/loadBalancerIPs",
    "metallb.universe.tf/loadBalancerIPs",
];
/// A Service's sharing key, in the same order.
pub const SHARING_ANNOTATIONS: [&str; 4] = [
    SHARING_KEY_ANNOTATION,
    "lbipam.cilium.io/sharing-key",
    "metallb.io/allow-shared-ip",
    "metallb.universe.tf/allow-shared-ip",
];
/// The pool a Service asks for by name: this project's, MetalLB's and MetalLB's older one.
pub const POOL_ANNOTATIONS: [&str; 3] = [
    "ipam-ebpf.io/address-pool",
    "metallb.io/address-pool",
    "metallb.universe.tf/address-pool",
];
/// The namespaces whose Services may share this one's IP (comma-separated, `*` for any):
/// this project's and Cilium LB-IPAM's.
pub const SHARING_CROSS_NAMESPACE_ANNOTATIONS: [&str; 2] = [
    "ipam-ebpf.io/sharing-cross-namespace",
    "lbipam.cilium.io/sharing-cross-namespace",
];

/// The annotation prefixes that can be read, in precedence.
pub const ANNOTATION_PREFIXES: [&str; 4] = [
    "ipam-ebpf.io",
    "lbipam.cilium.io",
    "metallb.io",
    "metallb.universe.tf",
];

/// Whose annotations are read, by prefix (`ipam-ebpf.io`, `lbipam.cilium.io`, `metallb.io`,
/// `metallb.universe.tf`); default: all. The order written does not change the precedence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<String>", into = "Vec<String>")]
pub struct AnnotationSources(Vec<String>);

impl Default for AnnotationSources {
    fn default() -> Self {
        Self(
            ANNOTATION_PREFIXES
                .iter()
                .map(|p| (*p).to_owned())
                .collect(),
        )
    }
}

impl TryFrom<Vec<String>> for AnnotationSources {
    type Error = String;

    fn try_from(prefixes: Vec<String>) -> Result<Self, String> {
        for p in &prefixes {
            if !ANNOTATION_PREFIXES.contains(&p.as_str()) {
                return Err(format!(
                    "{p:?} is not an annotation prefix this project reads; use some of {}",
                    ANNOTATION_PREFIXES.join(", ")
                ));
            }
        }
        Ok(Self(prefixes))
    }
}

impl From<AnnotationSources> for Vec<String> {
    fn from(s: AnnotationSources) -> Self {
        s.0
    }
}

impl AnnotationSources {
    /// Whether `annotation` (`prefix/name`) is read.
    pub fn reads(&self, annotation: &str) -> bool {
        annotation
            .split_once('/')
            .is_some_and(|(prefix, _)| self.0.iter().any(|p| p == prefix))
    }
}

/// What a Service's annotations ask for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Asked {
    /// As written (the engine's decoding names a value that is not an IP).
    pub requested_ips: Vec<String>,
    pub sharing_key: Option<String>,
    pub sharing_cross_namespace: Vec<String>,
    pub pool: Option<String>,
    /// For each kind, two annotations read that say different things.
    pub conflicts: Vec<String>,
}

/// Reads `annotations` through `sources`.
pub fn read(annotations: &BTreeMap<String, String>, sources: &AnnotationSources) -> Asked {
    let same_list = |a: &str, b: &str| {
        let (mut a, mut b) = (list(a), list(b));
        a.sort_unstable();
        b.sort_unstable();
        a == b
    };
    let first = |family: &[&'static str], same: &dyn Fn(&str, &str) -> bool| {
        first_of(annotations, sources, family, same)
    };
    let (ips, ips_conflict) = first(&IPS_ANNOTATIONS, &same_list);
    let (sharing_key, key_conflict) = first(&SHARING_ANNOTATIONS, &|a, b| a == b);
    let (cross, cross_conflict) = first(&SHARING_CROSS_NAMESPACE_ANNOTATIONS, &same_list);
    let (pool, pool_conflict) = first(&POOL_ANNOTATIONS, &|a, b| a.trim() == b.trim());
    Asked {
        requested_ips: list(ips.unwrap_or(""))
            .into_iter()
            .map(str::to_owned)
            .collect(),
        sharing_key: sharing_key.map(str::to_owned),
        sharing_cross_namespace: list(cross.unwrap_or(""))
            .into_iter()
            .map(str::to_owned)
            .collect(),
        pool: pool
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(str::to_owned),
        conflicts: [ips_conflict, key_conflict, cross_conflict, pool_conflict]
            .into_iter()
            .flatten()
            .collect(),
    }
}

/// The value of the first of `family` that is read and present, and a sentence naming two of
/// them that say different things, if any.
fn first_of<'a>(
    annotations: &'a BTreeMap<String, String>,
    sources: &AnnotationSources,
    family: &[&'static str],
    same: &dyn Fn(&str, &str) -> bool,
) -> (Option<&'a str>, Option<String>) {
    let present: Vec<(&str, &str)> = family
        .iter()
        .filter(|key| sources.reads(key))
        .filter_map(|key| annotations.get(*key).map(|v| (*key, v.as_str())))
        .collect();
    let Some(&(first_key, first)) = present.first() else {
        return (None, None);
    };
    let conflict = present
        .iter()
        .find(|(_, v)| !same(first, v))
        .map(|(key, v)| {
            format!(
                "annotations {first_key} ({first}) and {key} ({v}) disagree; {first_key} is used: \
             remove one, or make them say the same"
            )
        });
    (Some(first), conflict)
}

/// The entries of a comma-separated list (IPs, namespaces), trimmed, without empty ones.
fn list(text: &str) -> Vec<&str> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_util::string_map as annotations;

    /// Only the prefixes of the setting are read: a MetalLB annotation is ignored once MetalLB
    /// is left out, and then no longer disagrees with this project's.
    #[test]
    fn only_the_configured_sources_are_read() {
        let a = annotations(&[
            ("ipam-ebpf.io/ips", "10.0.0.5"),
            ("metallb.io/loadBalancerIPs", "10.0.0.9"),
            ("metallb.io/address-pool", "public"),
            ("lbipam.cilium.io/sharing-key", "k"),
        ]);
        let all = read(&a, &AnnotationSources::default());
        assert_eq!(all.requested_ips, ["10.0.0.5"]);
        assert_eq!(all.pool.as_deref(), Some("public"));
        assert_eq!(all.sharing_key.as_deref(), Some("k"));
        assert_eq!(all.conflicts.len(), 1, "{:?}", all.conflicts);

        let own = AnnotationSources::try_from(vec!["ipam-ebpf.io".to_owned()]).unwrap();
        let mine = read(&a, &own);
        assert_eq!(mine.requested_ips, ["10.0.0.5"]);
        assert_eq!(mine.pool, None);
        assert_eq!(mine.sharing_key, None);
        assert!(mine.conflicts.is_empty());

        let metallb = AnnotationSources::try_from(vec!["metallb.io".to_owned()]).unwrap();
        assert_eq!(read(&a, &metallb).requested_ips, ["10.0.0.9"]);
        // IPv6 as IPv4: the list is read alike.
        let v6 = annotations(&[("lbipam.cilium.io/ips", " fd00::5 , 10.0.0.5")]);
        assert_eq!(
            read(&v6, &AnnotationSources::default()).requested_ips,
            ["fd00::5", "10.0.0.5"]
        );
    }

    #[test]
    fn an_unknown_prefix_is_refused_naming_the_known_ones() {
        let e = AnnotationSources::try_from(vec!["metallb.io/".to_owned()]).unwrap_err();
        assert!(
            e.contains("\"metallb.io/\"") && e.contains("lbipam.cilium.io"),
            "{e}"
        );
    }
}
