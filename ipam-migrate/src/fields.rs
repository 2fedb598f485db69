//! Reading another project's object field by field, each with its path (`spec.blocks[1].cidr`),
//! so that a field of the wrong shape is an error naming it, and every field left unread can be
//! reported as not carried over.

use serde_yaml_ng::{Mapping, Value};

/// A field of the wrong shape: where, and what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Bad {
    pub field: String,
    pub why: String,
}

impl Bad {
    pub(crate) fn new(field: impl Into<String>, why: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            why: why.into(),
        }
    }
}

/// The fields of one mapping not yet read, with the path that leads to it.
#[derive(Debug)]
pub(crate) struct Fields {
    path: String,
    map: Mapping,
}

impl Fields {
    /// The mapping at `path`; null (an absent `spec`) reads as an empty one.
    pub(crate) fn of(path: &str, value: Value) -> Result<Self, Bad> {
        match value {
            Value::Mapping(map) => Ok(Self {
                path: path.to_owned(),
                map,
            }),
            Value::Null => Ok(Self {
                path: path.to_owned(),
                map: Mapping::new(),
            }),
            other => Err(Bad::new(
                path,
                format!("expected a mapping, found {}", shape(&other)),
            )),
        }
    }

    /// The path of the field `key` of this mapping.
    pub(crate) fn path_of(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    /// Takes `key` out (a null value counts as absent), with its path.
    pub(crate) fn take(&mut self, key: &str) -> Option<(String, Value)> {
        let value = self.map.remove(key)?;
        (!value.is_null()).then(|| (self.path_of(key), value))
    }

    pub(crate) fn string(&mut self, key: &str) -> Result<Option<String>, Bad> {
        self.take(key).map(|(path, v)| string(&path, v)).transpose()
    }

    pub(crate) fn bool(&mut self, key: &str) -> Result<Option<bool>, Bad> {
        self.take(key)
            .map(|(path, v)| match v {
                Value::Bool(b) => Ok(b),
                other => Err(Bad::new(
                    path,
                    format!("expected true or false, found {}", shape(&other)),
                )),
            })
            .transpose()
    }

    pub(crate) fn u32(&mut self, key: &str) -> Result<Option<u32>, Bad> {
        self.take(key)
            .map(|(path, v)| {
                v.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| {
                        Bad::new(
                            path,
                            format!("expected a whole number, found {}", shape(&v)),
                        )
                    })
            })
            .transpose()
    }

    /// The items of the list `key` with their paths (`key[0]`, ...); absent: none.
    pub(crate) fn list(&mut self, key: &str) -> Result<Vec<(String, Value)>, Bad> {
        let Some((path, value)) = self.take(key) else {
            return Ok(Vec::new());
        };
        match value {
            Value::Sequence(items) => Ok(items
                .into_iter()
                .enumerate()
                .map(|(i, v)| (format!("{path}[{i}]"), v))
                .collect()),
            other => Err(Bad::new(
                path,
                format!("expected a list, found {}", shape(&other)),
            )),
        }
    }

    pub(crate) fn strings(&mut self, key: &str) -> Result<Vec<String>, Bad> {
        self.list(key)?
            .into_iter()
            .map(|(path, v)| string(&path, v))
            .collect()
    }

    /// The mapping `key`, to read further; absent: `None`.
    pub(crate) fn fields(&mut self, key: &str) -> Result<Option<Fields>, Bad> {
        self.take(key)
            .map(|(path, v)| Fields::of(&path, v))
            .transpose()
    }

    /// The keys not yet read (string keys only: labels, annotations).
    pub(crate) fn keys(&self) -> Vec<String> {
        self.map
            .keys()
            .filter_map(|k| k.as_str().map(str::to_owned))
            .collect()
    }

    /// The paths of the fields left unread, in the order written.
    pub(crate) fn rest(self) -> Vec<String> {
        let path = self.path;
        self.map
            .into_iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, _)| {
                let key = match k {
                    Value::String(s) => s,
                    other => serde_yaml_ng::to_string(&other)
                        .unwrap_or_default()
                        .trim()
                        .to_owned(),
                };
                if path.is_empty() {
                    key
                } else {
                    format!("{path}.{key}")
                }
            })
            .collect()
    }
}

/// A string field; numbers and booleans are not taken for strings (a pool name `true` is a
/// mistake worth hearing about).
pub(crate) fn string(path: &str, value: Value) -> Result<String, Bad> {
    match value {
        Value::String(s) => Ok(s),
        other => Err(Bad::new(
            path,
            format!("expected a string, found {}", shape(&other)),
        )),
    }
}

/// A label selector (`matchLabels`, `matchExpressions`), as Kubernetes writes it.
pub(crate) fn selector(path: &str, value: Value) -> Result<ipam_core::meta::Selector, Bad> {
    serde_yaml_ng::from_value(value)
        .map_err(|e| Bad::new(path, format!("not a label selector: {e}")))
}

/// How a value is written, for errors.
fn shape(value: &Value) -> String {
    match value {
        Value::Null => "nothing".to_owned(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => format!("the string {s:?}"),
        Value::Sequence(_) => "a list".to_owned(),
        Value::Mapping(_) => "a mapping".to_owned(),
        Value::Tagged(t) => format!("a value tagged {}", t.tag),
    }
}

/// An address as this project writes it (`fc00:f853:ccd:e799::`, not the input's `0ccd`); as
/// given when it does not parse, for LB-IPAM to report.
pub(crate) fn canonical_ip(text: &str) -> String {
    text.trim()
        .parse::<std::net::IpAddr>()
        .map_or_else(|_| text.to_owned(), |ip| ip.to_string())
}

/// A CIDR as this project writes it; as given when it does not parse.
pub(crate) fn canonical_cidr(text: &str) -> String {
    text.trim()
        .parse::<ipam_core::Cidr>()
        .map_or_else(|_| text.to_owned(), |c| c.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(yaml: &str) -> Fields {
        Fields::of("spec", serde_yaml_ng::from_str(yaml).unwrap()).unwrap()
    }

    #[test]
    fn reads_fields_and_reports_the_rest_by_path() {
        let mut f = fields("{ a: x, b: true, c: [1, 2], d: { e: 5 }, n: null }");
        assert_eq!(f.string("a").unwrap().as_deref(), Some("x"));
        assert_eq!(f.bool("b").unwrap(), Some(true));
        assert_eq!(f.string("missing").unwrap(), None);
        let mut d = f.fields("d").unwrap().unwrap();
        assert_eq!(d.u32("e").unwrap(), Some(5));
        assert!(d.rest().is_empty());
        assert_eq!(f.rest(), vec!["spec.c".to_owned()]);
    }

    #[test]
    fn a_field_of_the_wrong_shape_is_named() {
        let mut f = fields("{ blocks: { cidr: x }, on: yes-please, items: [1] }");
        let bad = f.list("blocks").unwrap_err();
        assert_eq!(bad.field, "spec.blocks");
        assert!(bad.why.contains("expected a list"), "{bad:?}");
        let bad = f.bool("on").unwrap_err();
        assert!(bad.why.contains("\"yes-please\""), "{bad:?}");
        let bad = f.strings("items").unwrap_err();
        assert_eq!(bad.field, "spec.items[0]");
    }
}
