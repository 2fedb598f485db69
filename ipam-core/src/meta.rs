//! The object vocabulary every kind of resource shares, below both `pod` and `lb`: label
//! selectors as Kubernetes spells them, and status conditions.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A status condition: `type` is true or false, with a message saying why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Condition {
    #[serde(rename = "type")]
    pub kind: String,
    pub status: bool,
    pub message: String,
}

impl Condition {
    pub fn new(kind: &str, status: bool, message: impl Into<String>) -> Self {
        Self {
            kind: kind.to_owned(),
            status,
            message: message.into(),
        }
    }
}

/// A label selector (Kubernetes' `matchLabels` and `matchExpressions`); empty matches all.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Selector {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<SelectorRequirement>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SelectorRequirement {
    pub key: String,
    pub operator: SelectorOperator,
    #[serde(default)]
    pub values: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum SelectorOperator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

impl Selector {
    /// Selects everything.
    pub fn is_empty(&self) -> bool {
        self.match_labels.is_empty() && self.match_expressions.is_empty()
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.matches_by(|key| labels.get(key).map(String::as_str))
    }

    /// Whether it matches the labels `label` looks up by key.
    pub(crate) fn matches_by<'v>(&self, label: impl Fn(&str) -> Option<&'v str>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| label(k) == Some(v.as_str()))
            && self.match_expressions.iter().all(|r| {
                let value = label(&r.key);
                let listed = |v: &str| r.values.iter().any(|listed| listed == v);
                match r.operator {
                    SelectorOperator::In => value.is_some_and(listed),
                    SelectorOperator::NotIn => value.is_none_or(|v| !listed(v)),
                    SelectorOperator::Exists => value.is_some(),
                    SelectorOperator::DoesNotExist => value.is_none(),
                }
            })
    }
}
