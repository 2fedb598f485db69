//! Files replaced whole: after a crash a reader finds the old content or the new, never a mix,
//! and once `replace` returns the new content survives a power loss. The daemon's state files
//! (status, endpoint table) and the allocation log's compaction all go through here.

use std::{
    fs::File,
    io::{self, Write as _},
    path::Path,
};

/// Replaces `path` with `bytes`: written to a temporary file in the same directory, synced,
/// renamed over `path`, and the directory synced. Returns the new file, open for reading and
/// writing at its end.
pub fn replace(path: &Path, bytes: &[u8]) -> io::Result<File> {
    let dir = parent(path);
    let mut temp = tempfile::Builder::new()
        .prefix(".")
        .suffix(".tmp")
        .tempfile_in(dir)?;
    temp.write_all(bytes)?;
    temp.as_file().sync_all()?;
    let file = temp.persist(path).map_err(|e| e.error)?;
    sync_dir(path)?;
    Ok(file)
}

/// Makes a rename or creation in `path`'s directory durable.
pub fn sync_dir(path: &Path) -> io::Result<()> {
    File::open(parent(path))?.sync_all()
}

fn parent(path: &Path) -> &Path {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_whole_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        replace(&path, b"first, longer content").unwrap();
        let mut file = replace(&path, b"second").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        file.write_all(b"+").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second+");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["state.json"]);
    }
}
