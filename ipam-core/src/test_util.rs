//! Helpers for unit tests.

use std::path::{Path, PathBuf};

/// A temporary path named `name` inside a fresh temporary directory; both go when it is dropped,
/// so a failing test leaves nothing behind.
pub(crate) struct TempPath {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl TempPath {
    pub(crate) fn new(name: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("ipam-unit-")
            .tempdir()
            .expect("temporary directory");
        let path = dir.path().join(name);
        Self { _dir: dir, path }
    }
}

impl std::ops::Deref for TempPath {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.path
    }
}

/// A map of annotations (or labels) from `(key, value)` pairs.
pub(crate) fn string_map(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}
