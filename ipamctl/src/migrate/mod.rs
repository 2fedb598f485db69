//! `ipamctl migrate`: Cilium's and MetalLB's resources converted into this project's
//! (`ipam_migrate`), printed as YAML ready for `kubectl apply` or `ipamctl apply`, with what was
//! dropped on stderr; the exit code says whether anything was. `--check` then asks the store
//! whether the converted pools would give every Service the IPs it holds now (`check`).

mod check;

use std::{collections::BTreeMap, path::Path};

use ipam_migrate::{Migration, Target};
use serde::Serialize;

pub(crate) use check::check;

/// The exit code when the conversion dropped a field (the output is still printed).
pub(crate) const EXIT_DROPPED: i32 = 2;
/// The exit code of `--check` when a Service would not keep its IPs.
pub(crate) const EXIT_RENUMBERED: i32 = 3;

/// A converted object as a manifest.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Manifest<'a> {
    api_version: String,
    kind: &'static str,
    metadata: ManifestMetadata<'a>,
    spec: serde_yaml_ng::Value,
}

#[derive(Serialize)]
struct ManifestMetadata<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    labels: &'a BTreeMap<String, String>,
}

/// The converted objects as YAML documents, each headed by a comment naming its source.
pub(crate) fn render(migration: &Migration) -> Result<String, serde_yaml_ng::Error> {
    use ipam_kube::crd::{GROUP, VERSION};
    let mut out = String::new();
    for c in &migration.converted {
        let spec = match &c.target {
            Target::LbPool(spec) => serde_yaml_ng::to_value(spec),
            Target::L2Policy(spec) => serde_yaml_ng::to_value(spec),
            Target::PodPool(spec) => serde_yaml_ng::to_value(spec),
            Target::BgpPeer(spec) => serde_yaml_ng::to_value(spec),
            Target::BgpAdvertisement(spec) => serde_yaml_ng::to_value(spec),
        }?;
        let yaml = serde_yaml_ng::to_string(&Manifest {
            api_version: format!("{GROUP}/{VERSION}"),
            kind: c.target.kind(),
            metadata: ManifestMetadata {
                name: &c.name,
                labels: &c.labels,
            },
            spec,
        })?;
        out.push_str(&format!("---\n# from {}\n{yaml}", c.from));
    }
    Ok(out)
}

/// `ipamctl migrate -f FILE`: prints the converted objects on stdout and what was dropped on
/// stderr; returns the exit code.
pub(crate) fn run(file: &Path) -> anyhow::Result<i32> {
    let migration = load(file)?;
    print!("{}", render(&migration)?);
    Ok(report(&migration))
}

/// Reads and converts `file` (`-`: standard input).
pub(crate) fn load(file: &Path) -> anyhow::Result<Migration> {
    let (name, text) = crate::objects::read_input(file)?;
    Ok(ipam_migrate::convert(&ipam_migrate::read(&name, &text)?)?)
}

/// Prints the notes and what was dropped on stderr; the exit code.
pub(crate) fn report(migration: &Migration) -> i32 {
    for note in &migration.notes {
        eprintln!("note: {note}");
    }
    for d in &migration.dropped {
        eprintln!("dropped: {}: {}: {}", d.from, d.field, d.why);
    }
    if migration.dropped.is_empty() {
        0
    } else {
        eprintln!(
            "{} field(s) or object(s) were not carried over (listed above); the output holds \
             everything else",
            migration.dropped.len()
        );
        EXIT_DROPPED
    }
}

#[cfg(test)]
mod tests;
