//! `ipamd` announcing IPs between real network namespaces: a "node" namespace runs the daemon,
//! "client" namespaces on other ends of veth pairs ask for the announced IPs.

use std::{
    io::{Read as _, Write as _},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, TcpListener, TcpStream},
    time::{Duration, Instant},
};

use ipam_daemon::net::frames::{ARP_REPLY, NA_SOLICITED_OVERRIDE};
use ipam_datapath::{AttachMode, ResponderMaps};
use ipam_tests::{
    BpffsRoot, TempFile,
    daemon::{Daemon, wait_for_maps},
    netns::{Netns, veth},
    resolve::Resolver,
};

const ANNOUNCED: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 100);
const ANNOUNCED_V6: Ipv6Addr = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 0x100);
const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
const CLIENT_V6: Ipv6Addr = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 2);
const OTHER_IP: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 2);
const TIMEOUT: Duration = Duration::from_millis(300);

/// node(n0) <-> client(c0) and node(n1) <-> other(o0); the daemon announces on n0 only.
struct Lab {
    node: Netns,
    client: Netns,
    other: Netns,
    root: BpffsRoot,
    config: TempFile,
}

impl Lab {
    fn new() -> Self {
        let node = Netns::new("node");
        let client = Netns::new("cli");
        let other = Netns::new("oth");
        veth(&node, "n0", &client, "c0");
        veth(&node, "n1", &other, "o0");
        node.add_address("n0", &format!("{NODE_IP}/24"));
        node.add_address("n1", "10.78.0.1/24");
        client.add_address("c0", &format!("{CLIENT_IP}/24"));
        client.add_address("c0", &format!("{CLIENT_V6}/64"));
        other.add_address("o0", &format!("{OTHER_IP}/24"));
        let config = TempFile::new("ipamd", "toml");
        Self {
            node,
            client,
            other,
            root: BpffsRoot::new(),
            config,
        }
    }

    fn write_config(&self, liveness_ms: u64, attach: &str, announcements: &[(IpAddr, &str)]) {
        let mut text = format!(
            "[datapath]\nbpffs_root = \"{}\"\nliveness_timeout_ms = {liveness_ms}\nheartbeat_interval_ms = {}\n\n[interfaces.n0]\nattach = \"{attach}\"\n",
            self.root.0.display(),
            liveness_ms / 5,
        );
        for (ip, dev) in announcements {
            text.push_str(&format!(
                "\n[[announcement]]\nip = \"{ip}\"\ninterface = \"{dev}\"\n"
            ));
        }
        std::fs::write(&self.config.0, text).expect("write config");
    }

    fn standard_config(&self) {
        self.write_config(
            3000,
            "auto",
            &[
                (IpAddr::V4(ANNOUNCED), "n0"),
                (IpAddr::V6(ANNOUNCED_V6), "n0"),
            ],
        );
    }

    fn start(&self) -> Daemon {
        Daemon::start(&self.node, &self.config.0)
    }

    fn wait_announced(&self, count: usize) {
        wait_for_maps(
            &self.root.0,
            Duration::from_secs(20),
            "announcements",
            |m| {
                m.list().map(|l| l.len() == count).unwrap_or(false)
                    && m.config().map(|c| c.heartbeat_ns != 0).unwrap_or(false)
            },
        );
    }

    fn client_arp(&self, target: Ipv4Addr) -> Option<ipam_daemon::net::frames::ArpFrame> {
        self.client
            .run(move || Resolver::new("c0").arp(CLIENT_IP, target, TIMEOUT))
    }
}

#[test]
fn announced_ip_is_answered_with_the_right_mac_on_its_interface_only() {
    let lab = Lab::new();
    lab.standard_config();
    let node_mac = lab.node.mac("n0");
    let client_mac = lab.client.mac("c0");

    // Listen before the daemon starts: its first announcement is a gratuitous ARP.
    let garp = lab.client.spawn(|| {
        Resolver::new("c0").next_arp(Duration::from_secs(20), |f| {
            f.sender_ip == ANNOUNCED && f.target_ip == ANNOUNCED
        })
    });
    let _daemon = lab.start();
    lab.wait_announced(2);
    let garp = garp
        .join()
        .unwrap()
        .expect("gratuitous ARP on first announcement");
    assert_eq!((garp.eth_src, garp.sender_mac), (node_mac, node_mac));

    let reply = lab.client_arp(ANNOUNCED).expect("announced IP is answered");
    assert_eq!(reply.op, ARP_REPLY);
    assert_eq!(reply.eth_src, node_mac);
    assert_eq!(reply.sender_mac, node_mac);
    assert_eq!(reply.eth_dst, client_mac);
    assert_eq!(reply.target_mac, client_mac);
    assert_eq!(reply.target_ip, CLIENT_IP);

    let na = lab
        .client
        .run(|| Resolver::new("c0").ndp(CLIENT_V6, ANNOUNCED_V6, TIMEOUT))
        .expect("announced IPv6 is answered");
    assert!(na.checksum_valid());
    assert_eq!(na.lladdr_option, Some((2, node_mac)));
    assert_eq!(
        (na.src, na.dst, na.flags),
        (ANNOUNCED_V6, CLIENT_V6, NA_SOLICITED_OVERRIDE)
    );

    // The pinned map dumps with its types (BTF), as the README says.
    let map = lab.root.0.join("maps/L2_RESPONDER");
    let dump: serde_json::Value = serde_json::from_str(&ipam_tests::run(
        "bpftool",
        &["--json", "map", "dump", "pinned", map.to_str().unwrap()],
    ))
    .expect("bpftool prints JSON");
    let entries = dump.as_array().expect("an array of entries");
    assert_eq!(entries.len(), 2);
    let mac: Vec<u64> = entries[0]["formatted"]["values"][0]["value"]["mac"]
        .as_array()
        .expect("typed value with a mac field")
        .iter()
        .map(|b| b.as_u64().unwrap())
        .collect();
    assert_eq!(
        mac,
        node_mac.iter().map(|b| u64::from(*b)).collect::<Vec<_>>()
    );

    // Not announced on n1: a neighbour there gets no answer (nor does the kernel give one).
    let on_other_link = lab
        .other
        .run(|| Resolver::new("o0").arp(OTHER_IP, ANNOUNCED, TIMEOUT));
    assert_eq!(on_other_link, None);
    // Not announced at all.
    assert_eq!(lab.client_arp(Ipv4Addr::new(10, 77, 0, 101)), None);

    // Ordinary traffic through the announcing interface is untouched: ARP for the node's own
    // address (answered by the kernel), ping, and a TCP exchange.
    let own = lab
        .client_arp(NODE_IP)
        .expect("kernel still answers for the node's own IP");
    assert_eq!(own.sender_mac, node_mac);
    lab.client.run(|| {
        ipam_tests::run(
            "ping",
            &["-c", "2", "-W", "1", "-i", "0.2", &NODE_IP.to_string()],
        )
    });
    let listener = lab
        .node
        .run(|| TcpListener::bind((NODE_IP, 7077)).expect("listen"));
    let server = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().expect("accept");
        let mut buf = [0u8; 5];
        conn.read_exact(&mut buf).expect("read");
        conn.write_all(&buf).expect("echo");
    });
    let echoed = lab.client.run(|| {
        let mut s = TcpStream::connect_timeout(&(NODE_IP, 7077).into(), Duration::from_secs(2))
            .expect("connect");
        s.write_all(b"hello").unwrap();
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf).unwrap();
        buf
    });
    server.join().unwrap();
    assert_eq!(&echoed, b"hello");
}

#[test]
fn withdrawn_ip_stops_being_answered_after_reload() {
    let lab = Lab::new();
    lab.standard_config();
    let daemon = lab.start();
    lab.wait_announced(2);
    assert!(lab.client_arp(ANNOUNCED).is_some());

    lab.write_config(3000, "auto", &[(IpAddr::V6(ANNOUNCED_V6), "n0")]);
    daemon.signal(nix::sys::signal::Signal::SIGHUP);
    lab.wait_announced(1);
    assert_eq!(
        lab.client_arp(ANNOUNCED),
        None,
        "withdrawn IP must not be answered"
    );

    // A broken file on reload is reported and the running configuration kept.
    std::fs::write(&lab.config.0, "[[announcement]]\nip = \"not an ip\"\n").unwrap();
    daemon.signal(nix::sys::signal::Signal::SIGHUP);
    ipam_tests::cluster::wait_until(
        Duration::from_secs(5),
        "the broken reload reported",
        || {
            daemon
                .log_text()
                .contains("keeping the running configuration")
        },
        || daemon.log_text(),
    );
    let maps = ipam_datapath::ResponderMaps::from_pins(&lab.root.0).unwrap();
    assert_eq!(maps.list().unwrap().len(), 1);
    assert!(
        daemon
            .log_text()
            .contains("keeping the running configuration"),
        "{}",
        daemon.log_text()
    );
}

/// An address is announced on an interface, not on the VLANs behind it: a tagged request passes
/// untouched in every attach form. (The TC form once answered it: the kernel moves the tag into
/// the skb's metadata before TC runs.) This kernel has no `vlan` device type, so the client
/// sends the tagged frame from a raw socket; the node's receive path untags it exactly as it
/// would a frame from a VLAN device.
#[test]
fn vlan_tagged_requests_are_not_answered_in_any_form() {
    for attach in ["tc", "xdp-generic"] {
        let lab = Lab::new();
        lab.write_config(3000, attach, &[(IpAddr::V4(ANNOUNCED), "n0")]);
        let daemon = lab.start();
        lab.wait_announced(1);
        let replies = || {
            ResponderMaps::from_pins(&lab.root.0)
                .expect("pinned maps")
                .list()
                .expect("entries")
                .iter()
                .map(|e| e.replies)
                .sum::<u64>()
        };
        let before = replies();
        let tagged_reply = lab.client.run(|| {
            let resolver = Resolver::new("c0");
            resolver.send_tagged_arp(CLIENT_IP, ANNOUNCED, 10);
            // An answer is addressed to the client; gratuitous announcements of a newly
            // answered IP (repeated for two seconds) are not answers.
            resolver.next_arp(TIMEOUT, |f| {
                f.op == ARP_REPLY && f.sender_ip == ANNOUNCED && f.target_ip == CLIENT_IP
            })
        });
        assert_eq!(
            tagged_reply, None,
            "{attach}: a tagged request was answered"
        );
        assert_eq!(replies(), before, "{attach}: the responder counted a reply");
        // The same request untagged is answered: the set-up itself works.
        assert!(
            lab.client_arp(ANNOUNCED).is_some(),
            "{attach}: untagged request not answered; log:\n{}",
            daemon.log_text()
        );
        assert_eq!(replies(), before + 1, "{attach}");
    }
}

#[test]
fn every_attach_form_answers() {
    for attach in ["tc", "xdp-generic", "xdp-native"] {
        let lab = Lab::new();
        let peer_root = BpffsRoot::new();
        if attach == "xdp-native" {
            // Native XDP_TX on a veth reaches the peer only if the peer runs an XDP program
            // itself (see docs/datapath.md); give it our responder with nothing announced,
            // which passes every frame.
            let root = peer_root.0.clone();
            lab.client.run(move || {
                let mut peer = ipam_datapath::Datapath::open(&root).expect("peer datapath");
                peer.attach_responder("c0", AttachMode::XdpNative)
                    .expect("peer XDP");
            });
        }
        lab.write_config(3000, attach, &[(IpAddr::V4(ANNOUNCED), "n0")]);
        let daemon = lab.start();
        lab.wait_announced(1);
        let reply = lab.client_arp(ANNOUNCED);
        assert!(
            reply.is_some(),
            "{attach}: no answer; daemon log:\n{}",
            daemon.log_text()
        );
        daemon.wait_log(&format!("form=\"{attach}\""), Duration::from_secs(10));
        // Native XDP on a veth works only thanks to the peer's program: the daemon and
        // `ipamctl status` say so rather than report a plain success.
        let ipamctl = ipam_tests::workspace_binary("ipamctl");
        let root = lab.root.0.clone();
        let status = lab.node.run(move || {
            ipam_tests::run(
                ipamctl.to_str().unwrap(),
                &["--bpffs-root", root.to_str().unwrap(), "status"],
            )
        });
        let ipamctl = ipam_tests::workspace_binary("ipamctl");
        let root = lab.root.0.clone();
        let json = lab.node.run(move || {
            ipam_tests::run(
                ipamctl.to_str().unwrap(),
                &[
                    "--bpffs-root",
                    root.to_str().unwrap(),
                    "status",
                    "-o",
                    "json",
                ],
            )
        });
        let json: serde_json::Value = serde_json::from_str(&json).expect("status -o json");
        assert_eq!(json["state"], "answering", "{json}");
        assert_eq!(json["announcements"], 1, "{json}");
        assert_eq!(json["attachments"][0]["interface"], "n0", "{json}");
        assert_eq!(
            json["attachments"][0]["caveat"].is_string(),
            attach == "xdp-native",
            "{json}"
        );
        if attach == "xdp-native" {
            daemon.wait_log(
                "only if the peer runs an XDP program",
                Duration::from_secs(10),
            );
            assert!(
                status.contains("WARNING: interface n0 is a veth"),
                "{status}"
            );
        } else {
            assert!(!status.contains("WARNING"), "{attach}: {status}");
        }
    }
}

#[test]
fn hung_daemon_goes_silent_and_answers_again_when_it_recovers() {
    let lab = Lab::new();
    lab.write_config(1000, "auto", &[(IpAddr::V4(ANNOUNCED), "n0")]);
    let daemon = lab.start();
    lab.wait_announced(1);
    assert!(lab.client_arp(ANNOUNCED).is_some());

    daemon.signal(nix::sys::signal::Signal::SIGSTOP);
    std::thread::sleep(Duration::from_millis(1600));
    let while_hung = lab.client_arp(ANNOUNCED);
    daemon.signal(nix::sys::signal::Signal::SIGCONT);
    assert_eq!(while_hung, None, "a hung daemon's responder must go silent");

    let deadline = Instant::now() + Duration::from_secs(3);
    while lab.client_arp(ANNOUNCED).is_none() {
        assert!(
            Instant::now() < deadline,
            "responder did not come back after the daemon resumed"
        );
    }
}

#[test]
fn sigkill_and_restart_leave_no_request_unanswered() {
    let lab = Lab::new();
    lab.write_config(3000, "auto", &[(IpAddr::V4(ANNOUNCED), "n0")]);
    let first = lab.start();
    lab.wait_announced(1);

    // A client resolving every 10 ms for 3 s, while the daemon is killed and started again.
    let client = lab.client.spawn(|| {
        let resolver = Resolver::new("c0");
        let mut unanswered = 0;
        let mut sent = 0;
        let end = Instant::now() + Duration::from_secs(3);
        while Instant::now() < end {
            sent += 1;
            if resolver
                .arp(CLIENT_IP, ANNOUNCED, Duration::from_millis(200))
                .is_none()
            {
                unanswered += 1;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        (sent, unanswered)
    });
    std::thread::sleep(Duration::from_millis(800));
    first.kill();
    let mut second = lab.start();
    let (sent, unanswered) = client.join().unwrap();
    assert!(sent > 100, "the client kept resolving ({sent} requests)");
    assert_eq!(
        unanswered, 0,
        "{unanswered} of {sent} requests went unanswered across the restart"
    );
    assert!(
        second.running(),
        "restarted daemon exited:\n{}",
        second.log_text()
    );
    let log = second.log_text();
    assert!(
        log.contains("adopted=true"),
        "restarted daemon adopts the pinned link:\n{log}"
    );
}

#[test]
fn missing_interface_is_waited_for_not_fatal() {
    let lab = Lab::new();
    lab.write_config(3000, "auto", &[(IpAddr::V4(ANNOUNCED), "late0")]);
    let mut daemon = lab.start();
    ipam_tests::cluster::wait_until(
        Duration::from_secs(5),
        "the daemon saying what it waits for",
        || {
            let log = daemon.log_text();
            log.contains("waiting for interface") && log.contains("late0")
        },
        || daemon.log_text(),
    );
    assert!(daemon.running(), "daemon exited:\n{}", daemon.log_text());

    // The interface appears (a late NIC, a CNI creating it): the daemon picks it up by itself.
    let late_client = Netns::new("late");
    veth(&lab.node, "late0", &late_client, "l0");
    late_client.add_address("l0", "10.77.0.3/24");
    lab.wait_announced(1);
    let reply = late_client
        .run(|| Resolver::new("l0").arp(Ipv4Addr::new(10, 77, 0, 3), ANNOUNCED, TIMEOUT));
    assert!(
        reply.is_some(),
        "no answer once the interface exists:\n{}",
        daemon.log_text()
    );
}

/// The lines of the node namespace's `/proc/net/igmp6` for `interface`: the IPv6 multicast
/// groups joined there, as 32 hex digits.
fn ipv6_groups(ns: &Netns, interface: &str) -> Vec<String> {
    let out = ns
        .command("cat")
        .arg("/proc/net/igmp6")
        .output()
        .expect("read /proc/net/igmp6");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            (fields.get(1) == Some(&interface)).then(|| fields[2].to_owned())
        })
        .collect()
}

/// A NIC that filters multicast passes a neighbour solicitation only for a group joined on
/// it, and the kernel joins nothing for an address that lives on `lo`: the daemon holds the
/// solicited-node group of each IPv6 address it answers, on the interface it answers it on,
/// and leaves it when the address goes.
#[test]
fn ipv6_answered_ips_hold_their_solicited_node_group_on_their_interface() {
    let lab = Lab::new();
    lab.standard_config();
    let group = format!(
        "{:032x}",
        u128::from(ipam_daemon::net::frames::solicited_node(ANNOUNCED_V6))
    );
    assert_eq!(group, "ff0200000000000000000001ff000100");
    assert!(
        !ipv6_groups(&lab.node, "n0").contains(&group),
        "joined before the daemon ran"
    );
    let daemon = lab.start();
    lab.wait_announced(2);
    let joined = || ipv6_groups(&lab.node, "n0").contains(&group);
    ipam_tests::cluster::wait_until(
        Duration::from_secs(5),
        "the solicited-node group joined on n0",
        joined,
        || format!("{:?}", ipv6_groups(&lab.node, "n0")),
    );
    assert!(
        !ipv6_groups(&lab.node, "n1").contains(&group),
        "joined on an interface the IP is not answered on"
    );

    lab.write_config(3000, "auto", &[(IpAddr::V4(ANNOUNCED), "n0")]);
    daemon.signal(nix::sys::signal::Signal::SIGHUP);
    lab.wait_announced(1);
    ipam_tests::cluster::wait_until(
        Duration::from_secs(5),
        "the group left once the IPv6 address is no longer answered",
        || !joined(),
        || format!("{:?}", ipv6_groups(&lab.node, "n0")),
    );
}

/// A client whose neighbour entry for an IP was confirmed a moment ago (within Linux's
/// `locktime`, 1 s: the moment a node dies while its clients talk to it) takes the new
/// owner's MAC at once from either gratuitous form the daemon sends: the request form, and
/// the reply form, whose target hardware address must be the sender's for Linux to take it
/// as gratuitous within that second (RFC 5944, 4.6; with the broadcast address there the
/// client kept the dead node's MAC).
#[test]
fn a_just_confirmed_client_entry_takes_each_gratuitous_form_at_once() {
    use ipam_daemon::net::{
        frames::{ARP_REQUEST, ArpFrame},
        packet_socket::PacketSocket,
    };
    let fabric = Netns::new("gfab");
    fabric.add_bridge("br0");
    let old = Netns::new("gold");
    let new = Netns::new("gnew");
    let client = Netns::new("gcli");
    for (ns, port) in [(&old, "gpo"), (&new, "gpn"), (&client, "gpc")] {
        veth(ns, "e0", &fabric, port);
        fabric.add_port(port, "br0");
    }
    old.add_address("e0", "10.79.0.1/24");
    new.add_address("e0", "10.79.0.2/24");
    client.add_address("e0", "10.79.0.10/24");
    let new_mac = new.mac("e0");
    let new_ifindex = new.ifindex("e0");
    for (op, ip) in [(ARP_REQUEST, "10.79.0.100"), (ARP_REPLY, "10.79.0.101")] {
        let ip: Ipv4Addr = ip.parse().unwrap();
        old.add_address("e0", &format!("{ip}/32"));
        // The client's kernel resolves the IP to the old owner, who answers: a fresh entry.
        let old_mac = old.mac("e0");
        let resolved = client.run(move || {
            let socket = std::net::UdpSocket::bind("10.79.0.10:0").unwrap();
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline {
                socket.send_to(b"x", (ip, 9)).unwrap();
                std::thread::sleep(Duration::from_millis(20));
                if client_neighbour(ip) == Some(old_mac) {
                    return true;
                }
            }
            false
        });
        assert!(resolved, "the client never resolved {ip} to the old owner");
        // The old owner dies; the new one announces at once, in one form only.
        old.down("e0");
        new.run(move || {
            PacketSocket::sender(new_ifindex)
                .and_then(|s| s.send(&ArpFrame::gratuitous(new_mac, ip, op).to_bytes()))
                .expect("send the gratuitous ARP");
        });
        std::thread::sleep(Duration::from_millis(100));
        let now = client.run(move || client_neighbour(ip));
        let form = if op == ARP_REPLY { "reply" } else { "request" };
        assert_eq!(
            now,
            Some(new_mac),
            "the client kept {ip} at {now:02x?} after the new owner's gratuitous ARP in \
             {form} form (new owner {new_mac:02x?})"
        );
        old.up("e0");
    }
}

/// The MAC this thread's network namespace holds for `ip` in its neighbour table, if any.
fn client_neighbour(ip: Ipv4Addr) -> Option<[u8; 6]> {
    let table = std::fs::read_to_string("/proc/thread-self/net/arp").ok()?;
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.first()? != &ip.to_string() {
            return None;
        }
        let mac: Vec<u8> = fields
            .get(3)?
            .split(':')
            .map(|b| u8::from_str_radix(b, 16).ok())
            .collect::<Option<_>>()?;
        <[u8; 6]>::try_from(mac).ok().filter(|m| *m != [0; 6])
    })
}
