//! What each pool keeps, and for whom, as the agent last read it: the addresses only a pod
//! asking for them gets, the namespaces the pool serves, and its addresses bound to
//! namespaces. Kept in the state directory: a restarted agent serves pods before its first
//! look at the store (the store may be down), and must neither hand a reserved address to a
//! pod that did not ask for it nor give an asked-for one to a pod it is not kept for. A file
//! of the release before holds the reserved addresses alone.

use std::{collections::BTreeMap, path::Path};

use ipam_core::{
    Cidr,
    meta::Selector,
    pod::{
        fixed::PoolTenancy,
        multipool::Tenants,
        pool::{PodIpPoolSpec, Reservation},
    },
};
use serde::{Deserialize, Serialize};

const FILE: &str = "reserved.json";

/// What one pool keeps, and for whom.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct PoolKeeps {
    /// Addresses handed out only to a pod that asks for one.
    pub(super) requested_only: Vec<Cidr>,
    /// Who the pool serves.
    #[serde(default)]
    pub(super) namespaces: Vec<String>,
    #[serde(default)]
    pub(super) namespace_selector: Selector,
    /// Its addresses bound to namespaces.
    #[serde(default)]
    pub(super) reservations: Vec<Reservation>,
}

impl PoolKeeps {
    pub(super) fn of(spec: &PodIpPoolSpec) -> Self {
        Self {
            requested_only: spec.reserved_cidrs(),
            namespaces: spec.namespaces.clone(),
            namespace_selector: spec.namespace_selector.clone(),
            reservations: spec.reservations.clone(),
        }
    }

    pub(super) fn tenancy(&self) -> PoolTenancy {
        let serves = Tenants {
            namespaces: self.namespaces.clone(),
            selector: self.namespace_selector.clone(),
        };
        PoolTenancy::new(serves, &self.reservations)
    }
}

/// The file as this release writes it, or as the release before wrote it (the reserved
/// addresses alone: who they are for is read from the store again).
#[derive(Deserialize)]
#[serde(untagged)]
enum Saved {
    Keeps(BTreeMap<String, PoolKeeps>),
    Cidrs(BTreeMap<String, Vec<Cidr>>),
}

/// What the last run saved; none when there is no file or it does not parse (said in the
/// log: the store pass fills it in again).
pub(super) fn load(state_dir: &Path) -> BTreeMap<String, PoolKeeps> {
    let path = state_dir.join(FILE);
    let text = match std::fs::read(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return BTreeMap::new(),
        Err(e) => {
            tracing::warn!(path = %path.display(), "cannot read the reserved addresses: {e}");
            return BTreeMap::new();
        }
    };
    match serde_json::from_slice(&text) {
        Ok(Saved::Keeps(keeps)) => keeps,
        // The release before had no reservations bound to namespaces: until the store pass,
        // its reserved addresses go to whoever asks, as they did.
        Ok(Saved::Cidrs(cidrs)) => cidrs
            .into_iter()
            .map(|(pool, requested_only)| {
                let keeps = PoolKeeps {
                    requested_only,
                    ..PoolKeeps::default()
                };
                (pool, keeps)
            })
            .collect(),
        Err(e) => {
            tracing::warn!(
                path = %path.display(),
                "the reserved addresses do not parse ({e}); they are read from the store again"
            );
            BTreeMap::new()
        }
    }
}

/// Saves `keeps`; a failure is logged (the next change tries again).
pub(super) fn save(state_dir: &Path, keeps: &BTreeMap<String, PoolKeeps>) {
    let path = state_dir.join(FILE);
    let bytes = serde_json::to_vec(keeps).expect("pools' keeps serialise");
    if let Err(e) = ipam_core::atomic_file::replace(&path, &bytes) {
        tracing::warn!(path = %path.display(), "cannot save the reserved addresses: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saved_keeps_are_loaded_back() {
        let dir = std::env::temp_dir().join(format!("ipam-reserved-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(load(&dir).is_empty());
        let keeps: BTreeMap<String, PoolKeeps> = [(
            "default".to_owned(),
            PoolKeeps {
                requested_only: vec![
                    "10.0.0.7/32".parse().unwrap(),
                    "10.0.0.8/32".parse().unwrap(),
                ],
                namespaces: vec!["tenant-a".into(), "tenant-b".into()],
                namespace_selector: Selector::default(),
                reservations: vec![Reservation {
                    addresses: vec!["10.0.0.8".into()],
                    namespaces: vec!["tenant-a".into()],
                    namespace_selector: Selector::default(),
                }],
            },
        )]
        .into();
        save(&dir, &keeps);
        assert_eq!(load(&dir), keeps);
        // The release before's file: its reserved addresses are kept.
        std::fs::write(dir.join(FILE), br#"{"default":["10.0.0.7/32"]}"#).unwrap();
        assert_eq!(
            load(&dir)["default"].requested_only,
            ["10.0.0.7/32".parse().unwrap()]
        );
        std::fs::write(dir.join(FILE), b"{").unwrap();
        assert!(load(&dir).is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
