//! A real BGP router for the tests: FRR (Debian's frr: zebra, bfdd, bgpd) in a namespace of its
//! own, a different implementation from the BIRD the agents drive. It installs what it learns
//! into its namespace's kernel (multipath routes for ECMP), so a client behind it reaches the
//! Service IPs as one behind a top-of-rack switch would.

use std::{
    net::IpAddr,
    path::PathBuf,
    process::{Child, Stdio},
    time::Duration,
};

use crate::{TempDir, netns::Netns};

/// FRR's daemons, in the order they start (bgpd and bfdd register with zebra).
const DAEMONS: [&str; 3] = ["zebra", "bfdd", "bgpd"];

/// bfdd's profiles: FRR's default detection is 3 x 300 ms; `fast` is 3 x 100 ms.
const BFD_PROFILES: &str = "bfd\n profile fast\n  receive-interval 100\n  transmit-interval 100\n \
                            exit\nexit\n";

pub struct FrrRouter {
    pub ns: Netns,
    dir: TempDir,
    children: Vec<Child>,
}

impl FrrRouter {
    /// Starts FRR in `ns` with `bgpd_config` (bgpd's part of an frr.conf) and BFD profile
    /// `fast` (100 ms, multiplier 3, for `neighbor X bfd profile fast`), and waits until each
    /// daemon answers on its vty.
    pub fn start(ns: Netns, bgpd_config: &str) -> Self {
        let dir = TempDir::new("frr-");
        // FRR drops to its own user: it must write its sockets and pid files here.
        std::fs::set_permissions(&dir.0, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .expect("open the router's directory to FRR's user");
        let mut router = Self {
            ns,
            dir,
            children: Vec::new(),
        };
        // ECMP over L4: connections from one client spread over the next hops, as on a
        // fabric switch (the kernel's default hashes addresses only).
        router
            .ns
            .command("sysctl")
            .args(["-q", "-w", "net.ipv4.fib_multipath_hash_policy=1"])
            .status()
            .expect("sysctl");
        router
            .ns
            .command("sysctl")
            .args(["-q", "-w", "net.ipv6.fib_multipath_hash_policy=1"])
            .status()
            .expect("sysctl");
        router
            .ns
            .command("sysctl")
            .args(["-q", "-w", "net.ipv4.ip_forward=1"])
            .status()
            .expect("sysctl");
        router
            .ns
            .command("sysctl")
            .args(["-q", "-w", "net.ipv6.conf.all.forwarding=1"])
            .status()
            .expect("sysctl");
        for daemon in DAEMONS {
            let config = router.path(&format!("{daemon}.conf"));
            let text = match daemon {
                "bgpd" => bgpd_config,
                "bfdd" => BFD_PROFILES,
                _ => "",
            };
            std::fs::write(&config, text).expect("write FRR configuration");
            let log =
                std::fs::File::create(router.path(&format!("{daemon}.log"))).expect("FRR log file");
            let child = router
                .ns
                .command(format!("/usr/lib/frr/{daemon}"))
                .arg("-f")
                .arg(&config)
                .arg("-i")
                .arg(router.path(&format!("{daemon}.pid")))
                .arg("--vty_socket")
                .arg(&router.dir.0)
                .arg("-z")
                .arg(router.path("zserv.api"))
                .args(["--log", "stdout"])
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log"))
                .stderr(log)
                .spawn()
                .unwrap_or_else(|e| {
                    panic!("cannot start FRR's {daemon} (cargo xtask setup installs frr): {e}")
                });
            router.children.push(child);
            router.wait_for_vty(daemon);
        }
        router
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.0.join(file)
    }

    fn wait_for_vty(&self, daemon: &str) {
        let socket = self.path(&format!("{daemon}.vty"));
        for _ in 0..200 {
            if socket.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("FRR's {daemon} never opened its vty:\n{}", self.logs());
    }

    /// Runs vtysh commands against this router; returns what they print.
    pub fn vtysh(&self, commands: &[&str]) -> String {
        let mut command = std::process::Command::new("vtysh");
        command.arg("--vty_socket").arg(&self.dir.0);
        for c in commands {
            command.arg("-c").arg(c);
        }
        let out = command.output().expect("vtysh");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The next hops of the kernel route to `ip` (a host route), empty while there is none.
    pub fn next_hops(&self, ip: IpAddr) -> Vec<IpAddr> {
        let prefix = if ip.is_ipv4() { 32 } else { 128 };
        self.next_hops_of(&format!("{ip}/{prefix}"))
    }

    /// The next hops of the kernel route to exactly `prefix` (`198.51.100.0/24`), empty while
    /// there is none.
    pub fn next_hops_of(&self, prefix: &str) -> Vec<IpAddr> {
        let family = if prefix.contains(':') { "-6" } else { "-4" };
        let out = self
            .ns
            .command("ip")
            .args([family, "-j", "route", "show", "exact", prefix])
            .output()
            .expect("ip route");
        let routes: serde_json::Value =
            serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
        let mut hops = Vec::new();
        for route in routes.as_array().into_iter().flatten() {
            let gateways = match route.get("nexthops") {
                Some(list) => list
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|h| h.get("gateway"))
                    .collect::<Vec<_>>(),
                None => route.get("gateway").into_iter().collect(),
            };
            hops.extend(
                gateways
                    .into_iter()
                    .filter_map(|g| g.as_str()?.parse::<IpAddr>().ok()),
            );
        }
        hops.sort();
        hops
    }

    /// How many times bgpd's session with `neighbor` came up (FRR's `connectionsEstablished`):
    /// a reconfiguration that reset the session would raise it.
    pub fn sessions_established(&self, neighbor: IpAddr) -> u64 {
        let text = self.vtysh(&[&format!("show bgp neighbors {neighbor} json")]);
        let json: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        json[neighbor.to_string()]["connectionsEstablished"]
            .as_u64()
            .unwrap_or(0)
    }

    /// FRR's logs, for a failing test's message.
    pub fn logs(&self) -> String {
        DAEMONS
            .iter()
            .map(|d| {
                let text =
                    std::fs::read_to_string(self.path(&format!("{d}.log"))).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(30).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                format!("--- {d} ---\n{}\n", tail.join("\n"))
            })
            .collect()
    }
}

impl Drop for FrrRouter {
    fn drop(&mut self) {
        for child in self.children.iter_mut().rev() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
