//! The endpoint table the daemon keeps in its state directory: every pod interface registered
//! through the API, replaced whole on each change. The daemon writes it; `ipamctl` reads it to
//! name the pod behind an address, with the daemon running or not.

use std::{io, path::Path};

use crate::types::Endpoint;

/// The table's file name under the daemon's state directory.
pub const FILE: &str = "endpoints.json";

/// The endpoint table as the daemon last persisted it under `state_dir` (for `ipamctl`); no file
/// is an empty table.
pub fn read(state_dir: &Path) -> io::Result<Vec<Endpoint>> {
    match std::fs::read(state_dir.join(FILE)) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}
