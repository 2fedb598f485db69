//! The lab: a "node" namespace where `ipamd` announces a LoadBalancer-style IP, and a "client"
//! namespace on the same link that finds it with ARP/NDP and talks to it. Then two pods are added
//! to the node with `ipam-cni` exactly as a container runtime adds them, and talk to each other,
//! to the node and to the client through the TC pod datapath. Everything is created here and
//! removed at the end, also when a step fails.

use std::{
    io::{Read as _, Write as _},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, TcpListener, TcpStream},
    time::{Duration, Instant},
};

use ipam_api::types::Mac;
use ipam_tests::{
    BpffsRoot, TempDir, TempFile,
    cni::run_cni,
    daemon::{Daemon, wait_for_maps},
    netns::{Netns, veth},
    pod_net::{reaches, reaches_from},
    resolve::Resolver,
    run, workspace_binary,
};

const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 80, 0, 1);
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 80, 0, 2);
const SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 80, 0, 100);
const NODE_V6: Ipv6Addr = Ipv6Addr::new(0xfd80, 0, 0, 0, 0, 0, 0, 1);
const CLIENT_V6: Ipv6Addr = Ipv6Addr::new(0xfd80, 0, 0, 0, 0, 0, 0, 2);
const SERVICE_V6: Ipv6Addr = Ipv6Addr::new(0xfd80, 0, 0, 0, 0, 0, 0, 0x100);

fn step(n: u32, text: &str) {
    println!("\n[{n}] {text}");
}

fn main() {
    println!("IPAM lab: one node announces a service IP, a client on the same link reaches it.");
    let node = Netns::new("labnode");
    let client = Netns::new("labcli");
    let root = BpffsRoot::new();
    let config_file = TempFile::new("lab", "toml");
    let ipam_dir = TempDir::new("lab-ipam-");
    let config = config_file.0.clone();

    step(1, "Building the network");
    veth(&node, "eth0", &client, "eth0");
    node.ip(&["addr", "add", &format!("{NODE_IP}/24"), "dev", "eth0"]);
    node.ip(&[
        "-6",
        "addr",
        "add",
        &format!("{NODE_V6}/64"),
        "dev",
        "eth0",
        "nodad",
    ]);
    client.ip(&["addr", "add", &format!("{CLIENT_IP}/24"), "dev", "eth0"]);
    client.ip(&[
        "addr",
        "add",
        &format!("{CLIENT_V6}/64"),
        "dev",
        "eth0",
        "nodad",
    ]);
    // The service IP is local to the node (on lo, like a LoadBalancer VIP) so the node's kernel
    // accepts traffic for it, but the kernel must not answer ARP for it on eth0: the eBPF
    // responder does, on exactly the interfaces the daemon chooses.
    node.ip(&["addr", "add", &format!("{SERVICE_IP}/32"), "dev", "lo"]);
    node.run(|| {
        run("sysctl", &["-qw", "net.ipv4.conf.all.arp_ignore=1"]);
    });
    println!(
        "    node   namespace {:<14} eth0 {NODE_IP}/24, MAC {}",
        node.name,
        Mac(node.mac("eth0"))
    );
    println!(
        "    client namespace {:<14} eth0 {CLIENT_IP}/24, MAC {}",
        client.name,
        Mac(client.mac("eth0"))
    );

    step(
        2,
        "Starting ipamd in the node: it announces the service IPs on eth0 and runs IPAM \
         (cluster-pool, dual-stack)",
    );
    std::fs::write(
        &config,
        format!(
            "[datapath]\nbpffs_root = \"{root}\"\n\n\
             [[announcement]]\nip = \"{SERVICE_IP}\"\ninterface = \"eth0\"\n\n\
             [[announcement]]\nip = \"{SERVICE_V6}\"\ninterface = \"eth0\"\n\n\
             [ipam]\nmode = \"cluster-pool\"\nnode_name = \"lab-node\"\n\
             store = \"{dir}/store.redb\"\nstate_dir = \"{dir}/node\"\nsocket = \"{dir}/api/ipamd.sock\"\n\
             families = [\"v4\", \"v6\"]\nuplinks = [\"eth0\"]\n\n\
             [[ipam.pool]]\nname = \"default\"\n\
             ipv4 = {{ cidrs = [\"10.244.0.0/16\"], maskSize = 24 }}\n\
             ipv6 = {{ cidrs = [\"fd00:244::/104\"], maskSize = 120 }}\n",
            root = root.0.display(),
            dir = ipam_dir.0.display()
        ),
    )
    .expect("write lab config");
    println!("    config: {}", config.display());
    let started = Instant::now();
    let daemon = Daemon::start(&node, &config);
    wait_for_maps(
        &root.0,
        Duration::from_secs(20),
        "the daemon to announce",
        |m| m.list().map(|l| l.len() == 2).unwrap_or(false),
    );
    println!(
        "    ipamd is answering after {} ms; it loaded its eBPF responder and pinned it under {}",
        started.elapsed().as_millis(),
        root.0.display()
    );
    step(
        3,
        &format!("The client asks \"who has {SERVICE_IP}?\" (ARP)"),
    );
    let node_mac = node.mac("eth0");
    let answer = client.run(|| {
        let r = Resolver::new("eth0");
        let t = Instant::now();
        let a = r.arp(CLIENT_IP, SERVICE_IP, Duration::from_secs(1));
        (a, t.elapsed())
    });
    match answer {
        (Some(reply), rtt) => println!(
            "    answered in {} µs: {SERVICE_IP} is at {} (the node's eth0: {})",
            rtt.as_micros(),
            Mac(reply.sender_mac),
            if reply.sender_mac == node_mac {
                "correct"
            } else {
                "WRONG"
            }
        ),
        (None, _) => fail("no ARP answer", &daemon),
    }

    step(
        4,
        &format!("The client asks \"who has {SERVICE_V6}?\" (IPv6 neighbour solicitation)"),
    );
    match client.run(|| Resolver::new("eth0").ndp(CLIENT_V6, SERVICE_V6, Duration::from_secs(1))) {
        Some(na) => println!(
            "    neighbour advertisement: {SERVICE_V6} is at {} (checksum {})",
            Mac(na.lladdr_option.map(|o| o.1).unwrap_or_default()),
            if na.checksum_valid() {
                "valid"
            } else {
                "INVALID"
            }
        ),
        None => fail("no NDP answer", &daemon),
    }

    step(
        5,
        &format!("The client pings {SERVICE_IP} and opens a TCP connection to it"),
    );
    let ping = client.run(|| {
        run(
            "ping",
            &["-c", "3", "-i", "0.2", "-W", "1", &SERVICE_IP.to_string()],
        )
    });
    if let Some(summary) = ping.lines().find(|l| l.contains("packets transmitted")) {
        println!("    ping: {summary}");
    }
    let listener =
        node.run(|| TcpListener::bind((SERVICE_IP, 8080)).expect("listen on service IP"));
    let server = std::thread::spawn(move || {
        if let Ok((mut conn, _)) = listener.accept() {
            let _ = conn.write_all(b"hello from the service on the node\n");
        }
    });
    let greeting = client.run(|| {
        let mut s = TcpStream::connect_timeout(&(SERVICE_IP, 8080).into(), Duration::from_secs(2))
            .expect("connect to service IP");
        let mut text = String::new();
        s.read_to_string(&mut text).expect("read greeting");
        text
    });
    let _ = server.join();
    println!("    TCP {SERVICE_IP}:8080 said: {}", greeting.trim());
    let neigh = client.ip(&["neigh", "show", &SERVICE_IP.to_string()]);
    println!("    client's neighbour table: {}", neigh.trim());

    step(
        6,
        "Pods: ipam-cni (main plugin) adds two pods as a container runtime would; they talk over \
         the TC pod datapath",
    );
    let socket = ipam_dir.0.join("api/ipamd.sock");
    let pods = lab_pods(&node, &client, &socket, &daemon);

    step(
        7,
        "What the daemon logged, and what ipamctl shows (pinned eBPF maps, published IPAM status)",
    );
    for line in daemon.log_text().lines().filter(|l| l.contains("INFO")) {
        println!("    | {}", line.split("INFO ").nth(1).unwrap_or(line));
    }
    let ctl = workspace_binary("ipamctl");
    let state_dir = ipam_dir.0.join("node").display().to_string();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ipam_daemon::daemon::status::read_status(&ipam_dir.0.join("node"))
        .is_ok_and(|s| s.infra.get("router").is_some_and(|m| m.len() == 2))
    {
        if Instant::now() > deadline {
            fail("the node's router addresses did not appear", &daemon);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for args in [
        &["announcements"][..],
        &["status"][..],
        &["endpoints", "--state-dir", &state_dir][..],
        &["ipam", "status", "--state-dir", &state_dir][..],
    ] {
        let out = std::process::Command::new("nsenter")
            .arg(format!("--net={}", node.path().display()))
            .arg(&ctl)
            .arg("--bpffs-root")
            .arg(&root.0)
            .args(args)
            .output()
            .expect("run ipamctl");
        println!("    $ ipamctl {}", args.join(" "));
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            println!("    {line}");
        }
    }

    step(
        8,
        "Cleaning up: CNI DEL of the pods, stopping ipamd, removing pins, IPAM state and namespaces",
    );
    for (ns, container) in &pods {
        let (ok, out) = cni("DEL", container, ns, &socket, &node);
        if !ok {
            fail(&format!("CNI DEL of {container}: {out}"), &daemon);
        }
    }
    drop(pods);
    drop(daemon);
    drop(config_file);
    drop(ipam_dir);
    let announced = IpAddr::V4(SERVICE_IP);
    println!(
        "    done: {announced} was announced, resolved and reached, the node got its addresses \
         from the pool, two pods were wired and routed; nothing is left behind."
    );
}

fn fail(what: &str, daemon: &Daemon) -> ! {
    eprintln!(
        "LAB FAILED: {what}\n--- ipamd log ---\n{}",
        daemon.log_text()
    );
    // Destructors of the namespaces and pins run on unwinding.
    panic!("{what}");
}

fn cni(
    command: &str,
    container: &str,
    pod: &Netns,
    socket: &std::path::Path,
    node: &Netns,
) -> (bool, serde_json::Value) {
    let conf = serde_json::json!({
        "cniVersion": "1.1.0",
        "name": "lab-pods",
        "type": "ipam-cni",
        "socket": socket,
        "mtu": 1500,
    });
    run_cni(
        &workspace_binary("ipam-cni"),
        Some(node),
        command,
        container,
        "eth0",
        Some(pod),
        &conf,
    )
}

/// Adds two pods, shows their addresses and checks who reaches whom.
fn lab_pods(
    node: &Netns,
    client: &Netns,
    socket: &std::path::Path,
    daemon: &Daemon,
) -> Vec<(Netns, String)> {
    client.ip(&["route", "add", "10.244.0.0/16", "via", &NODE_IP.to_string()]);
    client.ip(&[
        "-6",
        "route",
        "add",
        "fd00:244::/104",
        "via",
        &NODE_V6.to_string(),
    ]);
    let mut pods = Vec::new();
    let mut addresses = Vec::new();
    for tag in ["labpoda", "labpodb"] {
        let ns = Netns::new(tag);
        let container = format!("lab-{}", ns.name);
        // Like a runtime: code 11 (try again later) is retried, anything else is an error.
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut said = false;
        let result = loop {
            let (ok, result) = cni("ADD", &container, &ns, socket, node);
            if ok {
                break result;
            }
            if result["code"] != 11 || Instant::now() > deadline {
                fail(&format!("CNI ADD of {container}: {result}"), daemon);
            }
            if !said {
                println!(
                    "    CNI ADD {container}: code 11, {}",
                    result["msg"].as_str().unwrap_or("?")
                );
                said = true;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        let ips: Vec<String> = result["ips"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|ip| ip["address"].as_str())
            .map(|a| a.split('/').next().unwrap_or_default().to_owned())
            .collect();
        println!(
            "    CNI ADD {container}: {} (host side {}, gateways {} and {})",
            ips.join(" and "),
            result["interfaces"][0]["name"].as_str().unwrap_or("?"),
            result["ips"][0]["gateway"].as_str().unwrap_or("?"),
            result["ips"][1]["gateway"].as_str().unwrap_or("?"),
        );
        addresses.push(ips);
        pods.push((ns, container));
    }
    let (a, b) = (&pods[0].0, &pods[1].0);
    let mut checks: Vec<(&str, &Netns, String)> = Vec::new();
    for ip in &addresses[1] {
        checks.push(("pod a -> pod b", a, ip.clone()));
    }
    for ip in &addresses[0] {
        checks.push(("pod b -> pod a", b, ip.clone()));
        checks.push(("node -> pod a", node, ip.clone()));
        checks.push(("client -> pod a (through the uplink)", client, ip.clone()));
    }
    checks.push(("pod a -> node (router address)", a, "10.244.0.1".to_owned()));
    checks.push((
        "pod a -> node (router address)",
        a,
        "fd00:244::1".to_owned(),
    ));
    checks.push(("pod b -> client", b, CLIENT_IP.to_string()));
    for (what, from, to) in &checks {
        if !reaches(from, to) {
            fail(&format!("{what}: {to} does not answer"), daemon);
        }
        println!("    ping {what:<38} {to:<16} answered");
    }
    // A pod sending from an address that is not its own is dropped by the datapath.
    a.ip(&["addr", "add", "10.244.0.250/32", "dev", "eth0"]);
    if reaches_from(a, "10.244.0.250", &addresses[1][0]) {
        fail("a spoofed source address got through", daemon);
    }
    a.ip(&["addr", "del", "10.244.0.250/32", "dev", "eth0"]);
    println!(
        "    ping {:<38} {:<16} dropped (spoof_dropped)",
        "pod a -> pod b, source 10.244.0.250", addresses[1][0]
    );
    pods
}
