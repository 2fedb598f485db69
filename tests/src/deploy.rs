//! The manifests in deploy/, read as JSON values for the tests that check them.

use std::path::{Path, PathBuf};

use serde::Deserialize as _;
use serde_json::Value;

/// The base manifests (deploy/base), which `kubectl apply -k deploy` installs.
pub fn dir() -> PathBuf {
    root().join("base")
}

/// The deploy/ directory.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// The overlay `name` (deploy/overlays/NAME).
pub fn overlay(name: &str) -> PathBuf {
    root().join("overlays").join(name)
}

/// Every YAML document of `file`, as JSON.
pub fn documents(file: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| {
            let value = serde_yaml_ng::Value::deserialize(doc)
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            serde_json::to_value(value).expect("YAML as JSON")
        })
        .filter(|v| !v.is_null())
        .collect()
}
