//! The input as read: every document of a file (a `List` item by item), each object's kind,
//! group, name and labels, its spec kept for the converter.

use std::collections::BTreeMap;

use ipam_core::meta::Selector;
use serde_yaml_ng::Value;

use crate::{
    MigrateError,
    fields::{Bad, Fields},
};

/// One object of the input, as read: where it is, what it is.
#[derive(Debug)]
pub struct Source {
    /// `file: document N` (and `item I` inside a `List`), 1-based as editors count.
    pub(crate) at: String,
    pub(crate) group: String,
    pub(crate) kind: String,
    pub(crate) name: String,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) spec: Value,
}

impl Source {
    /// `file: document N (Kind name)`, how errors and reports name it.
    pub fn describe(&self) -> String {
        format!("{} ({} {})", self.at, self.kind, self.name)
    }

    pub(crate) fn spec(&self) -> Result<Fields, MigrateError> {
        Fields::of("spec", self.spec.clone()).map_err(|bad| self.error(bad))
    }

    pub(crate) fn error(&self, bad: Bad) -> MigrateError {
        MigrateError::Field {
            from: self.describe(),
            field: bad.field,
            why: bad.why,
        }
    }
}

/// The pools of the input with their labels, which advertisements select by name or by label:
/// MetalLB's IPAddressPools, or Cilium's CiliumLoadBalancerIPPools.
#[derive(Debug, Default)]
pub(crate) struct Pools {
    pub(crate) labels: BTreeMap<String, BTreeMap<String, String>>,
}

impl Pools {
    /// The objects of `kind` in `group` (or with no group).
    pub(crate) fn of(sources: &[Source], group: &str, kind: &str) -> Self {
        let labels = sources
            .iter()
            .filter(|s| s.kind == kind && (s.group == group || s.group.is_empty()))
            .map(|s| (s.name.clone(), s.labels.clone()))
            .collect();
        Self { labels }
    }

    pub(crate) fn selected_by(&self, selector: &Selector) -> impl Iterator<Item = &String> {
        self.labels
            .iter()
            .filter(move |(_, labels)| selector.matches(labels))
            .map(|(name, _)| name)
    }
}

/// Reads every document of `text` (from `file`), expanding `List`s as `kubectl get -o yaml`
/// writes them.
pub fn read(file: &str, text: &str) -> Result<Vec<Source>, MigrateError> {
    use serde::Deserialize as _;
    let mut sources = Vec::new();
    for (index, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let document = index + 1;
        let value = Value::deserialize(doc).map_err(|source| MigrateError::Yaml {
            file: file.to_owned(),
            document,
            source,
        })?;
        if value.is_null() {
            continue;
        }
        let at = format!("{file}: document {document}");
        let is_list = value
            .get("kind")
            .and_then(Value::as_str)
            .is_some_and(|k| k == "List" || k.ends_with("List"));
        if is_list {
            let items = Fields::of("", value)
                .and_then(|mut list| list.list("items"))
                .map_err(|bad| MigrateError::Field {
                    from: at.clone(),
                    field: bad.field,
                    why: bad.why,
                })?;
            for (i, (_, item)) in items.into_iter().enumerate() {
                sources.push(source(format!("{at} item {}", i + 1), item)?);
            }
        } else {
            sources.push(source(at, value)?);
        }
    }
    Ok(sources)
}

/// One object: its kind, group, name and labels read, its spec kept for the converter.
fn source(at: String, value: Value) -> Result<Source, MigrateError> {
    let fail = |bad: Bad| MigrateError::Field {
        from: at.clone(),
        field: bad.field,
        why: bad.why,
    };
    let mut top = Fields::of("", value).map_err(fail)?;
    let kind = top
        .string("kind")
        .map_err(fail)?
        .ok_or_else(|| fail(Bad::new("kind", "missing: every object names its kind")))?;
    let api_version = top.string("apiVersion").map_err(fail)?.unwrap_or_default();
    let group = api_version
        .rsplit_once('/')
        .map_or("", |(group, _)| group)
        .to_owned();
    let mut metadata = top
        .fields("metadata")
        .map_err(fail)?
        .ok_or_else(|| fail(Bad::new("metadata", "missing: every object has a name")))?;
    let name = metadata.string("name").map_err(fail)?.ok_or_else(|| {
        fail(Bad::new(
            "metadata.name",
            "missing: every object has a name",
        ))
    })?;
    let mut labels = BTreeMap::new();
    if let Some(mut l) = metadata.fields("labels").map_err(fail)? {
        for key in l.keys() {
            if let Some(v) = l.string(&key).map_err(fail)? {
                labels.insert(key, v);
            }
        }
    }
    let spec = top.take("spec").map(|(_, v)| v).unwrap_or(Value::Null);
    Ok(Source {
        at,
        group,
        kind,
        name,
        labels,
        spec,
    })
}
