//! Fixed pod addresses: the addresses a pod asks for, at most one per family, from its
//! annotations (`ipam-ebpf.io/ip-addresses`, or Calico's `cni.projectcalico.org/ipAddrs`) or
//! from the runtime (the CNI `ips` capability). Checked here before anything is allocated, so
//! a bad request is refused whole, naming the pod and the address.

use std::{collections::BTreeMap, net::IpAddr};

use thiserror::Error;

use crate::{
    Cidr, Family,
    pod::multipool::{Labels, Tenants},
};

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

/// What a pool keeps for whom: who it serves, and its addresses bound to namespaces.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolTenancy {
    pub serves: Tenants,
    pub bound: Vec<(Cidr, Tenants)>,
}

impl PoolTenancy {
    /// A pool's, from its spec.
    pub fn of(spec: &crate::pod::pool::PodIpPoolSpec) -> Self {
        Self::new(Tenants::of(spec), &spec.reservations)
    }

    /// Of a pool serving `serves`, with `reservations`.
    pub fn new(serves: Tenants, reservations: &[crate::pod::pool::Reservation]) -> Self {
        Self {
            serves,
            bound: reservations
                .iter()
                .flat_map(|r| {
                    let tenants = Tenants::of_reservation(r);
                    r.cidrs().into_iter().map(move |c| (c, tenants.clone()))
                })
                .collect(),
        }
    }

    /// Whether telling needs the namespace's labels (a selector somewhere).
    pub fn selects_by_labels(&self) -> bool {
        self.serves.selects_by_labels() || self.bound.iter().any(|(_, t)| t.selects_by_labels())
    }

    /// Why `who`, a pod of `namespace` with its labels (`None`: a container that is not a
    /// pod), may not be given `ip` of pool `pool` it asked for: the pool serves other
    /// namespaces (the node's own pool too: asking for an address is naming its pool), or
    /// the address is reserved for other namespaces. `None` when it may.
    pub fn refusal(
        &self,
        who: &str,
        pool: &str,
        ip: IpAddr,
        namespace: Option<(&str, &Labels)>,
    ) -> Option<String> {
        if let Some(why) = self.serves.refusal(namespace) {
            return Some(format!("{who}: asks for {ip} of pool {pool}, which {why}"));
        }
        let (cidr, tenants) = self.bound.iter().find(|(c, _)| c.contains(ip))?;
        let why = tenants.refusal_of_reserved(namespace)?;
        Some(format!(
            "{who}: asks for {ip}, which pool {pool} reserves ({cidr}, spec.reservations): the \
             reservation {why}"
        ))
    }
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

    #[test]
    fn an_asked_address_is_given_only_to_the_tenants_it_is_kept_for() {
        use crate::{meta::Selector, pod::pool::Reservation};

        let tenancy = |pool_namespaces: &[&str], reservation: Option<Reservation>| {
            let mut spec: crate::pod::pool::PodIpPoolSpec = serde_json::from_value(
                serde_json::json!({ "ipv4": { "cidrs": ["10.0.0.0/16"], "maskSize": 24 } }),
            )
            .unwrap();
            spec.namespaces = pool_namespaces.iter().map(|n| (*n).to_owned()).collect();
            spec.reservations = reservation.into_iter().collect();
            PoolTenancy::of(&spec)
        };
        let labels = |pairs: &[(&str, &str)]| -> Labels {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let none = Labels::new();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let for_a = Reservation {
            addresses: vec!["10.0.0.10".into()],
            namespaces: vec!["tenant-a".into()],
            namespace_selector: Selector::default(),
        };
        let open = tenancy(&[], Some(for_a.clone()));
        // The reserved address: tenant-a's pods only; any other address: anyone.
        assert_eq!(
            open.refusal(
                "pod tenant-a/db-0",
                "p",
                ip("10.0.0.10"),
                Some(("tenant-a", &none))
            ),
            None
        );
        let why = open
            .refusal(
                "pod tenant-b/x",
                "p",
                ip("10.0.0.10"),
                Some(("tenant-b", &none)),
            )
            .unwrap();
        assert!(
            why.contains("pod tenant-b/x")
                && why.contains("10.0.0.10")
                && why.contains("pool p")
                && why.contains("tenant-a, not tenant-b"),
            "{why}"
        );
        assert!(
            open.refusal("container c", "p", ip("10.0.0.10"), None)
                .is_some()
        );
        assert_eq!(
            open.refusal(
                "pod tenant-b/x",
                "p",
                ip("10.0.0.11"),
                Some(("tenant-b", &none))
            ),
            None
        );
        // A pool of tenant-a's: no address of it to another tenant, asked for or not.
        let owned = tenancy(&["tenant-a"], None);
        let why = owned
            .refusal(
                "pod tenant-b/x",
                "p",
                ip("10.0.0.11"),
                Some(("tenant-b", &none)),
            )
            .unwrap();
        assert!(
            why.contains("serves only pods of the namespaces tenant-a"),
            "{why}"
        );
        // By labels.
        let by_label = tenancy(
            &[],
            Some(Reservation {
                addresses: vec!["10.0.0.10".into()],
                namespaces: Vec::new(),
                namespace_selector: serde_json::from_value(
                    serde_json::json!({ "matchLabels": { "tenant": "a" } }),
                )
                .unwrap(),
            }),
        );
        assert!(by_label.selects_by_labels());
        let a = labels(&[("tenant", "a")]);
        assert_eq!(
            by_label.refusal("pod ns1/x", "p", ip("10.0.0.10"), Some(("ns1", &a))),
            None
        );
        let why = by_label
            .refusal("pod ns2/x", "p", ip("10.0.0.10"), Some(("ns2", &none)))
            .unwrap();
        assert!(
            why.contains("namespaceSelector") && why.contains("ns2"),
            "{why}"
        );
    }
}
