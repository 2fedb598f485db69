//! The cluster key files: read at start, and read again every few seconds so that a rotation
//! (a Secret updated in place, or files replaced by hand) takes effect without a restart.
//!
//! A key is the file's bytes, trailing whitespace removed (so `head -c 32 /dev/urandom | base64
//! > key` and `kubectl create secret generic --from-file` both work as they are).

use std::path::{Path, PathBuf};

use ipam_gossip::{KeyError, Keyring};
use thiserror::Error;

use ipam_config::GossipSettings;

#[derive(Debug, Error)]
pub(super) enum KeyFileError {
    #[error(
        "cannot read gossip key file {path}: {source}; create it (the same key on every node: \
         `head -c 32 /dev/urandom | base64 > {path}`) or mount the cluster's gossip Secret there"
    )]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Key(#[from] KeyError),
}

/// The configured key files and what they held when last read.
pub(super) struct KeyFiles {
    sign: PathBuf,
    also_accept: Vec<PathBuf>,
    loaded: Option<Vec<Vec<u8>>>,
}

impl KeyFiles {
    pub(super) fn new(settings: &GossipSettings) -> Self {
        Self {
            sign: settings.key_file.clone(),
            also_accept: settings.also_accept_key_files.clone(),
            loaded: None,
        }
    }

    /// The keyring from the files, if they changed since last read (or were never read).
    pub(super) fn reload(&mut self) -> Result<Option<Keyring>, KeyFileError> {
        let paths: Vec<&Path> = std::iter::once(self.sign.as_path())
            .chain(self.also_accept.iter().map(PathBuf::as_path))
            .collect();
        let contents = paths
            .iter()
            .map(|path| read_key(path))
            .collect::<Result<Vec<_>, _>>()?;
        if self.loaded.as_ref() == Some(&contents) {
            return Ok(None);
        }
        let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        let keyring = Keyring::new(
            (names[0].as_str(), contents[0].as_slice()),
            names[1..]
                .iter()
                .map(String::as_str)
                .zip(contents[1..].iter().map(Vec::as_slice)),
        )?;
        self.loaded = Some(contents);
        Ok(Some(keyring))
    }
}

fn read_key(path: &Path) -> Result<Vec<u8>, KeyFileError> {
    let mut bytes = std::fs::read(path).map_err(|source| KeyFileError::Read {
        path: path.to_owned(),
        source,
    })?;
    while bytes.last().is_some_and(u8::is_ascii_whitespace) {
        bytes.pop();
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(dir: &Path, accept: &[&str]) -> GossipSettings {
        toml::from_str::<GossipSettings>(&format!(
            "key_file = {:?}\nalso_accept_key_files = {:?}",
            dir.join("new"),
            accept.iter().map(|a| dir.join(a)).collect::<Vec<_>>()
        ))
        .unwrap()
    }

    #[test]
    fn keys_are_read_once_and_again_only_when_a_file_changes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("new"), "k".repeat(44) + "\n").unwrap();
        std::fs::write(dir.path().join("old"), "o".repeat(44)).unwrap();
        let mut keys = KeyFiles::new(&settings(dir.path(), &["old"]));
        assert!(keys.reload().unwrap().is_some());
        assert!(keys.reload().unwrap().is_none(), "unchanged");
        std::fs::write(dir.path().join("old"), "p".repeat(44)).unwrap();
        assert!(keys.reload().unwrap().is_some(), "rotated");
    }

    #[test]
    fn a_missing_short_or_repeated_key_is_refused_by_file_name() {
        let dir = tempfile::tempdir().unwrap();
        let missing = KeyFiles::new(&settings(dir.path(), &[]))
            .reload()
            .unwrap_err()
            .to_string();
        assert!(
            missing.contains(&format!("{}", dir.path().join("new").display())),
            "{missing}"
        );

        std::fs::write(dir.path().join("new"), "short\n").unwrap();
        let short = KeyFiles::new(&settings(dir.path(), &[]))
            .reload()
            .unwrap_err()
            .to_string();
        assert!(short.contains("is 5 bytes"), "{short}");

        std::fs::write(dir.path().join("new"), "k".repeat(44)).unwrap();
        std::fs::write(dir.path().join("old"), "k".repeat(44) + "\n").unwrap();
        let twice = KeyFiles::new(&settings(dir.path(), &["old"]))
            .reload()
            .unwrap_err()
            .to_string();
        assert!(twice.contains("are the same key"), "{twice}");
    }
}
