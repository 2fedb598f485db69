//! Counts of addresses and blocks, which exceed 64 bits in IPv6 pools, in JSON: a number while
//! it fits a signed 64-bit integer (what Kubernetes and most JSON readers hold exactly), a
//! decimal string beyond. Both forms are read back. In a CRD schema this is Kubernetes'
//! int-or-string.

use serde::{Deserializer, Serializer};

pub fn serialize<S: Serializer>(n: &u128, s: S) -> Result<S::Ok, S::Error> {
    match i64::try_from(*n) {
        Ok(small) => s.serialize_i64(small),
        Err(_) => s.serialize_str(&n.to_string()),
    }
}

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u128, D::Error> {
    d.deserialize_any(CountVisitor)
}

struct CountVisitor;

impl serde::de::Visitor<'_> for CountVisitor {
    type Value = u128;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a non-negative count, as a number or a decimal string")
    }

    fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<u128, E> {
        Ok(u128::from(n))
    }

    fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<u128, E> {
        u128::try_from(n).map_err(|_| E::custom(format!("{n} is negative; a count is not")))
    }

    fn visit_u128<E: serde::de::Error>(self, n: u128) -> Result<u128, E> {
        Ok(n)
    }

    /// Counts beyond 64 bits were once written as plain numbers, which JSON readers see as
    /// floats: close enough for a usage figure the operator rewrites on its next pass.
    fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<u128, E> {
        if n >= 0.0 {
            Ok(n as u128)
        } else {
            Err(E::custom(format!("{n} is negative; a count is not")))
        }
    }

    fn visit_str<E: serde::de::Error>(self, t: &str) -> Result<u128, E> {
        t.parse()
            .map_err(|_| E::custom(format!("{t:?} is not a count")))
    }
}

/// The schema of a count: Kubernetes' int-or-string.
#[cfg(feature = "schema")]
pub struct Schema;

#[cfg(feature = "schema")]
impl schemars::JsonSchema for Schema {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Count".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "x-kubernetes-int-or-string": true,
            "anyOf": [{ "type": "integer" }, { "type": "string" }]
        })
    }
}

#[cfg(test)]
mod tests {
    #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
    struct C(#[serde(with = "super")] u128);

    #[test]
    fn small_counts_are_numbers_and_big_ones_strings_both_read_back() {
        for (n, json) in [
            (256u128, "256".to_owned()),
            (1 << 72, format!("\"{}\"", 1u128 << 72)),
        ] {
            assert_eq!(serde_json::to_string(&C(n)).unwrap(), json);
            assert_eq!(serde_json::from_str::<C>(&json).unwrap(), C(n));
        }
        // As an earlier version wrote a count beyond 64 bits.
        let legacy = (1u128 << 72).to_string();
        assert_eq!(serde_json::from_str::<C>(&legacy).unwrap(), C(1 << 72));
        assert!(serde_json::from_str::<C>("-1").is_err());
    }
}
