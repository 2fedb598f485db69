//! The daemon's directory on the BPF filesystem.

use std::path::Path;

use super::DatapathError;

use nix::sys::statfs::BPF_FS_MAGIC;

/// Creates `root` (and its `maps`, `links` subdirectories) after checking it lies on bpffs:
/// pins anywhere else would fail later with an obscure error.
pub(super) fn prepare_root(root: &Path) -> Result<(), DatapathError> {
    let parent = root
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"));
    if !is_bpffs(parent) {
        return Err(DatapathError::NotBpffs {
            path: root.to_owned(),
        });
    }
    for dir in [root.join("maps"), root.join("links")] {
        std::fs::create_dir_all(&dir).map_err(|source| DatapathError::PinDir {
            path: dir.clone(),
            source,
        })?;
    }
    Ok(())
}

pub(super) fn remove_root(root: &Path) -> Result<(), DatapathError> {
    match std::fs::remove_dir_all(root) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(DatapathError::PinDir {
            path: root.to_owned(),
            source,
        }),
    }
}

fn is_bpffs(path: &Path) -> bool {
    nix::sys::statfs::statfs(path).is_ok_and(|st| st.filesystem_type() == BPF_FS_MAGIC)
}
