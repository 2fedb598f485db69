//! BIRD's configuration for one node's advertisements: written whole on every change, and
//! applied with `birdc configure`, which keeps every protocol whose configuration did not
//! change. Routes live in one static protocol per family and reach each peer through that
//! peer's own export filter, so adding or removing a Service IP, or changing its attributes,
//! changes a static protocol and filters only: BIRD re-exports over the open sessions, which are
//! never reset for it. Only a change of a peer's own settings restarts that peer's session.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    net::Ipv4Addr,
};

use ipam_core::{
    Cidr, Family,
    lb::bgp::{BgpPeerSpec, Community, NodeAdvertisements, RouteAttributes},
};

/// The BIRD protocol name of a peer: BIRD wants an identifier, resource names may hold `-` and
/// `.`; a hash of the name keeps two names that read the same apart.
pub fn protocol_name(peer: &str) -> String {
    let readable: String = peer
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .take(40)
        .collect();
    format!("peer_{readable}_{:08x}", fnv32(peer))
}

/// `text` as it may stand between BIRD's double quotes, which take no escapes: every character
/// outside a plain set becomes `?`. Names are checked by the stores, passwords by
/// `check_password`; this keeps the file valid whatever reaches it.
fn bird_text(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-._/:@ ".contains(c) {
                c
            } else {
                '?'
            }
        })
        .collect()
}

fn fnv32(s: &str) -> u32 {
    s.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// The whole configuration file for `node`.
/// The longest a BIRD recovering from a restart waits for its peers before it sends routes.
const GRACEFUL_RESTART_WAIT_S: u32 = 15;

pub fn render(node: &str, router_id: Option<Ipv4Addr>, wanted: &NodeAdvertisements) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Written by ipamd for node {node}; rewritten whole on every change: do not edit."
    );
    if let Some(id) = router_id {
        let _ = writeln!(out, "router id {id};");
    }
    if wanted.peers.values().any(|p| p.graceful_restart.is_some()) {
        // A BIRD started in recovery (after a restart of the agent) holds its routes back
        // until its graceful-restart peers are back, at most this long: a router that is down
        // must not keep them from the others.
        let _ = writeln!(out, "graceful restart wait {GRACEFUL_RESTART_WAIT_S};");
    }
    out.push_str("protocol device { scan time 10; }\n");
    if wanted.peers.values().any(|p| p.bfd.is_some()) {
        // Sessions are asked for by the BGP protocols; this only runs them.
        out.push_str("protocol bfd { }\n");
    }
    let all: BTreeSet<Cidr> = wanted.prefixes();
    for (family, protocol, v4) in [("ipv4", "services4", true), ("ipv6", "services6", false)] {
        let _ = writeln!(out, "protocol static {protocol} {{\n  {family};");
        for prefix in all.iter().filter(|p| (p.family() == Family::V4) == v4) {
            let _ = writeln!(out, "  route {prefix} unreachable;");
        }
        out.push_str("}\n");
    }
    for (name, spec) in &wanted.peers {
        let protocol = protocol_name(name);
        let routes = wanted.routes.get(name).cloned().unwrap_or_default();
        render_filter(&mut out, &protocol, &routes);
        render_peer(&mut out, name, &protocol, spec);
    }
    out
}

/// A route's attributes as BIRD sets them: communities and local preference.
type Attributes = (Vec<Community>, Option<u32>);

/// The peer's export filter: its routes grouped by attributes, one prefix set per group (a
/// trie in BIRD, so a thousand routes cost a lookup, not a thousand comparisons).
fn render_filter(out: &mut String, protocol: &str, routes: &BTreeMap<Cidr, RouteAttributes>) {
    let mut groups: BTreeMap<Attributes, Vec<Cidr>> = BTreeMap::new();
    for (prefix, attributes) in routes {
        let key = (
            attributes.communities.iter().copied().collect(),
            attributes.local_preference,
        );
        groups.entry(key).or_default().push(*prefix);
    }
    let _ = writeln!(out, "filter export_{protocol} {{");
    for ((communities, local_preference), prefixes) in groups {
        let set: Vec<String> = prefixes.iter().map(ToString::to_string).collect();
        let _ = write!(out, "  if net ~ [ {} ] then {{ ", set.join(", "));
        for community in communities {
            let _ = match community {
                Community::Standard(asn, value) => {
                    write!(out, "bgp_community.add(({asn},{value})); ")
                }
                Community::Large(asn, first, second) => {
                    write!(out, "bgp_large_community.add(({asn},{first},{second})); ")
                }
            };
        }
        if let Some(pref) = local_preference {
            let _ = write!(out, "bgp_local_pref = {pref}; ");
        }
        out.push_str("accept; }\n");
    }
    out.push_str("  reject;\n}\n");
}

fn render_peer(out: &mut String, name: &str, protocol: &str, spec: &BgpPeerSpec) {
    let _ = writeln!(out, "protocol bgp {protocol} {{");
    let _ = writeln!(out, "  description \"BGPPeer {}\";", bird_text(name));
    let _ = writeln!(out, "  local as {};", spec.local_asn);
    let _ = writeln!(
        out,
        "  neighbor {} port {} as {};",
        spec.peer_address, spec.peer_port, spec.peer_asn
    );
    let hold = spec.hold_time_seconds;
    let keepalive = spec.keep_alive_time_seconds.unwrap_or(hold / 3);
    let _ = writeln!(
        out,
        "  hold time {hold}; keepalive time {keepalive}; connect retry time {};",
        spec.connect_retry_time_seconds
    );
    // BIRD waits a minute after an error by default, doubling up to five: a session that
    // failed once while the router started would then stay down far longer than the router.
    out.push_str("  error wait time 1, 10;\n");
    if let Some(password) = &spec.password {
        let _ = writeln!(out, "  password \"{password}\";");
    }
    if spec.ttl_security {
        out.push_str("  ttl security on;\n");
    }
    if let Some(hops) = spec.ebgp_multihop {
        let _ = writeln!(out, "  multihop {hops};");
    }
    if let Some(gr) = &spec.graceful_restart {
        let _ = writeln!(
            out,
            "  graceful restart on; graceful restart time {};",
            gr.restart_time_seconds
        );
    }
    if let Some(bfd) = &spec.bfd {
        let _ = writeln!(
            out,
            "  bfd {{ min rx interval {} ms; min tx interval {} ms; multiplier {}; }};",
            bfd.receive_interval_ms, bfd.transmit_interval_ms, bfd.detect_multiplier
        );
    }
    let family = if spec.peer_address.is_ipv4() {
        "ipv4"
    } else {
        "ipv6"
    };
    let _ = writeln!(
        out,
        "  {family} {{ import none; export filter export_{protocol}; next hop self; }};\n}}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipam_core::lb::bgp::{Bfd, GracefulRestart};
    use std::process::Command;

    fn peer(address: &str) -> BgpPeerSpec {
        serde_json::from_value(serde_json::json!({
            "peerAddress": address, "peerASN": 64500, "localASN": 64512, "holdTimeSeconds": 3
        }))
        .unwrap()
    }

    fn wanted() -> NodeAdvertisements {
        let mut tor = peer("10.0.0.1");
        tor.password = Some("s3cret".into());
        tor.ttl_security = true;
        tor.bfd = Some(Bfd {
            receive_interval_ms: 100,
            transmit_interval_ms: 100,
            detect_multiplier: 3,
        });
        tor.graceful_restart = Some(GracefulRestart {
            restart_time_seconds: 60,
        });
        let mut v6 = peer("fd00::1");
        v6.ebgp_multihop = Some(2);
        let mut out = NodeAdvertisements::default();
        out.peers.insert("tor-a.rack1".into(), tor);
        out.peers.insert("tor-v6".into(), v6);
        let plain = RouteAttributes::default();
        let tagged = RouteAttributes {
            communities: [
                Community::Standard(64512, 100),
                Community::Large(64512, 7, 9),
            ]
            .into(),
            local_preference: Some(200),
            services: Default::default(),
            ips: Default::default(),
        };
        out.routes.insert(
            "tor-a.rack1".into(),
            [
                ("198.51.100.10/32".parse().unwrap(), plain.clone()),
                ("198.51.100.11/32".parse().unwrap(), tagged.clone()),
                ("198.51.100.12/32".parse().unwrap(), tagged),
            ]
            .into(),
        );
        out.routes.insert(
            "tor-v6".into(),
            [("2001:db8::10/128".parse().unwrap(), plain)].into(),
        );
        out
    }

    #[test]
    fn routes_sharing_attributes_share_one_prefix_set() {
        let text = render("node-a", Some(Ipv4Addr::new(10, 0, 0, 2)), &wanted());
        let protocol = protocol_name("tor-a.rack1");
        assert!(text.contains(&format!(
            "filter export_{protocol} {{\n  if net ~ [ 198.51.100.10/32 ] then {{ accept; }}\n  \
             if net ~ [ 198.51.100.11/32, 198.51.100.12/32 ] then {{ \
             bgp_community.add((64512,100)); bgp_large_community.add((64512,7,9)); \
             bgp_local_pref = 200; accept; }}\n  reject;\n}}"
        )), "{text}");
        assert!(
            text.contains("route 2001:db8::10/128 unreachable;"),
            "{text}"
        );
    }

    #[test]
    fn names_that_read_the_same_get_different_protocols() {
        assert_ne!(protocol_name("tor-a"), protocol_name("tor.a"));
        assert!(protocol_name("tor-a").starts_with("peer_tor_a_"));
    }

    /// The real BIRD (Debian's bird2, installed by `cargo xtask setup`) parses what is
    /// rendered: every option the resources can set, both families, BFD and none, and a peer
    /// whose name holds a quote and a line break (stored before the stores checked names).
    #[test]
    fn bird_accepts_the_rendered_configuration() {
        let dir = std::env::temp_dir().join(format!("ipam-bird-parse-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut odd = wanted();
        let spec = odd.peers.remove("tor-a.rack1").unwrap();
        let routes = odd.routes.remove("tor-a.rack1").unwrap();
        odd.peers.insert("rack\"1\n}".into(), spec);
        odd.routes.insert("rack\"1\n}".into(), routes);
        for (i, wanted) in [wanted(), NodeAdvertisements::default(), odd]
            .iter()
            .enumerate()
        {
            let file = dir.join(format!("bird{i}.conf"));
            std::fs::write(&file, render("node-a", None, wanted)).unwrap();
            let parsed = Command::new("bird")
                .arg("-p")
                .arg("-c")
                .arg(&file)
                .output()
                .expect("bird is installed (cargo xtask setup installs bird2)");
            assert!(
                parsed.status.success(),
                "bird refused {}: {}",
                file.display(),
                String::from_utf8_lossy(&parsed.stderr)
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
