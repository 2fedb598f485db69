//! Fixed pod addresses: the addresses a pod asks for, at most one per family, from its
//! annotations (`ipam-ebpf.io/ip-addresses`, or Calico's `cni.projectcalico.org/ipAddrs`) or
//! from the runtime (the CNI `ips` capability). Checked here before anything is allocated, so
//! a bad request is refused whole, naming the pod and the address.

use std::{collections::BTreeMap, net::IpAddr};

use thiserror::Error;

use crate::Family;

/// This project's annotation: `"10.0.5.7"`, `"10.0.5.7,fd00:5::7"` or a JSON list of them.
pub const IP_ADDRESSES_ANNOTATION: &str = "ipam-ebpf.io/ip-addresses";
/// Calico's annotation, read as Calico writes it: a JSON list (`["10.0.5.7"]`).
pub const CALICO_IP_ADDRS_ANNOTATION: &str = "cni.projectcalico.org/ipAddrs";

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FixedError {
    #[error(
        "{who}: annotation {annotation} is {value:?}, not a list of addresses ({why}); write \
         one address per family, as \"10.0.5.7\" or \"10.0.5.7,fd00:5::7\""
    )]
    BadAnnotation {
        who: String,
        annotation: &'static str,
        value: String,
        why: String,
    },
    #[error(
        "{who}: annotations {IP_ADDRESSES_ANNOTATION} ({ours}) and {CALICO_IP_ADDRS_ANNOTATION} \
         ({calico}) ask for different addresses; keep one of them"
    )]
    Disagree {
        who: String,
        ours: String,
        calico: String,
    },
    #[error(
        "{who}: asks for two {} addresses ({first}, {second}); a pod gets one address per family",
        family.name()
    )]
    TwoOfOneFamily {
        who: String,
        family: Family,
        first: IpAddr,
        second: IpAddr,
    },
    #[error(
        "{who}: asks for {ip}, an {} address, but this node gives pods {} addresses only",
        Family::of(*ip).name(),
        served.iter().map(|f| f.name()).collect::<Vec<_>>().join(" and ")
    )]
    FamilyNotServed {
        who: String,
        ip: IpAddr,
        served: Vec<Family>,
    },
}

/// The addresses `who`'s annotations ask for (none: empty).
pub fn annotated(
    who: &str,
    annotations: &BTreeMap<String, String>,
) -> Result<Vec<IpAddr>, FixedError> {
    let read = |annotation: &'static str| -> Result<Option<Vec<IpAddr>>, FixedError> {
        let Some(value) = annotations.get(annotation) else {
            return Ok(None);
        };
        parse_list(value)
            .map(Some)
            .map_err(|why| FixedError::BadAnnotation {
                who: who.to_owned(),
                annotation,
                value: value.clone(),
                why,
            })
    };
    let ours = read(IP_ADDRESSES_ANNOTATION)?;
    let calico = read(CALICO_IP_ADDRS_ANNOTATION)?;
    match (ours, calico) {
        (Some(ours), Some(calico)) if sorted(&ours) != sorted(&calico) => {
            Err(FixedError::Disagree {
                who: who.to_owned(),
                ours: join(&ours),
                calico: join(&calico),
            })
        }
        (Some(ips), _) | (None, Some(ips)) => Ok(ips),
        (None, None) => Ok(Vec::new()),
    }
}

/// Refuses a request this node cannot serve: two addresses of one family, or a family the
/// node does not give pods.
pub fn check(who: &str, ips: &[IpAddr], served: &[Family]) -> Result<(), FixedError> {
    for (i, ip) in ips.iter().enumerate() {
        if let Some(other) = ips[..i].iter().find(|o| Family::of(**o) == Family::of(*ip)) {
            return Err(FixedError::TwoOfOneFamily {
                who: who.to_owned(),
                family: Family::of(*ip),
                first: *other,
                second: *ip,
            });
        }
        if !served.contains(&Family::of(*ip)) {
            return Err(FixedError::FamilyNotServed {
                who: who.to_owned(),
                ip: *ip,
                served: served.to_vec(),
            });
        }
    }
    Ok(())
}

/// `a,b`, `["a", "b"]`; an address may carry a prefix length (`10.0.5.7/24`, as the CNI `ips`
/// capability writes it), which is dropped: the prefix is the node block's.
pub fn parse_list(value: &str) -> Result<Vec<IpAddr>, String> {
    let items: Vec<String> = if value.trim_start().starts_with('[') {
        serde_json::from_str(value).map_err(|e| format!("not a JSON list of strings: {e}"))?
    } else {
        value
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    };
    items.iter().map(|item| parse_address(item)).collect()
}

/// One address, with or without a prefix length.
pub fn parse_address(item: &str) -> Result<IpAddr, String> {
    let address = item.trim().split_once('/').map_or(item.trim(), |(a, _)| a);
    address
        .parse()
        .map_err(|_| format!("{item:?} is not an IP address"))
}

fn sorted(ips: &[IpAddr]) -> Vec<IpAddr> {
    let mut ips = ips.to_vec();
    ips.sort();
    ips
}

fn join(ips: &[IpAddr]) -> String {
    ips.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_util::string_map as annotations;

    #[test]
    fn both_spellings_and_both_forms_are_read() {
        let ours = annotations(&[(IP_ADDRESSES_ANNOTATION, "10.0.5.7, fd00:5::7")]);
        let calico = annotations(&[(CALICO_IP_ADDRS_ANNOTATION, r#"["fd00:5::7","10.0.5.7"]"#)]);
        let want: Vec<IpAddr> = vec!["10.0.5.7".parse().unwrap(), "fd00:5::7".parse().unwrap()];
        assert_eq!(annotated("pod a/b", &ours).unwrap(), want);
        assert_eq!(sorted(&annotated("pod a/b", &calico).unwrap()), want);
        let mut both = ours.clone();
        both.extend(calico);
        assert_eq!(annotated("pod a/b", &both).unwrap(), want, "they agree");
        assert!(annotated("pod a/b", &BTreeMap::new()).unwrap().is_empty());
        assert_eq!(parse_list("10.0.5.7/24").unwrap(), want[..1]);
    }

    #[test]
    fn bad_requests_name_the_pod_and_what_to_do() {
        let bad = annotations(&[(IP_ADDRESSES_ANNOTATION, "10.0.5.x")]);
        let e = annotated("pod shop/db-0", &bad).unwrap_err().to_string();
        assert!(
            e.contains("pod shop/db-0") && e.contains("\"10.0.5.x\""),
            "{e}"
        );
        let differ = annotations(&[
            (IP_ADDRESSES_ANNOTATION, "10.0.5.7"),
            (CALICO_IP_ADDRS_ANNOTATION, r#"["10.0.5.8"]"#),
        ]);
        assert!(matches!(
            annotated("pod shop/db-0", &differ),
            Err(FixedError::Disagree { .. })
        ));
        let two: Vec<IpAddr> = vec!["10.0.5.7".parse().unwrap(), "10.0.5.8".parse().unwrap()];
        let e = check("pod shop/db-0", &two, &[Family::V4])
            .unwrap_err()
            .to_string();
        assert!(e.contains("two IPv4 addresses (10.0.5.7, 10.0.5.8)"), "{e}");
        let v6: Vec<IpAddr> = vec!["fd00::7".parse().unwrap()];
        let e = check("pod shop/db-0", &v6, &[Family::V4])
            .unwrap_err()
            .to_string();
        assert!(e.contains("gives pods IPv4 addresses only"), "{e}");
    }
}
