//! The pools' reserved addresses as the agent last read them, kept in the state directory:
//! a restarted agent serves pods before its first look at the store (the store may be down),
//! and must not hand a reserved address to a pod that did not ask for it meanwhile.

use std::{collections::BTreeMap, path::Path};

use ipam_core::Cidr;

const FILE: &str = "reserved.json";

/// The reserved addresses saved by the last run; none when there is no file or it does not
/// parse (said in the log: the store pass fills them in again).
pub(super) fn load(state_dir: &Path) -> BTreeMap<String, Vec<Cidr>> {
    let path = state_dir.join(FILE);
    let text = match std::fs::read(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return BTreeMap::new(),
        Err(e) => {
            tracing::warn!(path = %path.display(), "cannot read the reserved addresses: {e}");
            return BTreeMap::new();
        }
    };
    serde_json::from_slice(&text).unwrap_or_else(|e| {
        tracing::warn!(
            path = %path.display(),
            "the reserved addresses do not parse ({e}); they are read from the store again"
        );
        BTreeMap::new()
    })
}

/// Saves `reserved`; a failure is logged (the next change tries again).
pub(super) fn save(state_dir: &Path, reserved: &BTreeMap<String, Vec<Cidr>>) {
    let path = state_dir.join(FILE);
    let bytes = serde_json::to_vec(reserved).expect("CIDRs serialise");
    if let Err(e) = ipam_core::atomic_file::replace(&path, &bytes) {
        tracing::warn!(path = %path.display(), "cannot save the reserved addresses: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saved_reserved_addresses_are_loaded_back() {
        let dir = std::env::temp_dir().join(format!("ipam-reserved-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(load(&dir).is_empty());
        let reserved: BTreeMap<String, Vec<Cidr>> =
            [("default".to_owned(), vec!["10.0.0.7/32".parse().unwrap()])].into();
        save(&dir, &reserved);
        assert_eq!(load(&dir), reserved);
        std::fs::write(dir.join(FILE), b"{").unwrap();
        assert!(load(&dir).is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
