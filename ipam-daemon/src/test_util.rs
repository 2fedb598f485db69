//! Helpers for unit tests.

use std::path::{Path, PathBuf};

/// A temporary path (file or directory) unique to this process and name, removed on drop, so a
/// failing test leaves nothing behind.
pub struct TempPath(PathBuf);

impl TempPath {
    pub fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!("ipam-unit-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_dir_all(&path);
        Self(path)
    }
}

impl std::ops::Deref for TempPath {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
