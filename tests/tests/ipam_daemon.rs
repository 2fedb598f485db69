//! IPAM in a real `ipamd` process (standalone role, embedded store).
//!
//! Pools per network: in multi-pool mode a network configuration may name the pool of its
//! pods; pods of two networks get addresses of two pools and reach each other, and a pool
//! that does not exist is named in the error.
//!
//! The multi-pool deadlock seed end to end: the router address's pool does not exist yet; the
//! daemon keeps running and says what it waits for, and gets its router address as soon as the
//! pool appears. The address survives SIGKILL and restart, and a restart with another IPAM mode
//! is refused with a message that says how to migrate.

use std::time::{Duration, Instant};

use ipam_core::pod::published::{PublishedStatus, read_status};
use ipam_tests::{BpffsRoot, TempFile, daemon::Daemon, netns::Netns, unique};

struct Setup {
    ns: Netns,
    root: BpffsRoot,
    dir: std::path::PathBuf,
    config: TempFile,
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Setup {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(unique("ipamd-state-"));
        Self {
            ns: Netns::new("ipam"),
            root: BpffsRoot::new(),
            dir,
            config: TempFile::new("ipamd-ipam", "toml"),
        }
    }

    fn write(&self, mode: &str, pools: &str) {
        std::fs::write(
            &self.config.0,
            format!(
                "[datapath]\nbpffs_root = \"{}\"\n\n[ipam]\nmode = \"{mode}\"\nnode_name = \"worker-1\"\nstore = \"{d}/store.redb\"\nstate_dir = \"{d}/node\"\nsocket = \"{d}/api/ipamd.sock\"\ninfra_pool = \"hrz\"\ningress = true\n{pools}",
                self.root.0.display(),
                d = self.dir.display()
            ),
        )
        .unwrap();
    }

    fn status(&self) -> Option<PublishedStatus> {
        read_status(&self.dir.join("node")).ok()
    }

    fn wait_for(
        &self,
        daemon: &Daemon,
        what: &str,
        done: impl Fn(&PublishedStatus) -> bool,
    ) -> PublishedStatus {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(s) = self.status()
                && done(&s)
            {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; status: {:#?}\nlog:\n{}",
                self.status(),
                daemon.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

const HRZ: &str =
    "[[ipam.pool]]\nname = \"hrz\"\nipv4 = { cidrs = [\"10.60.0.0/16\"], maskSize = 26 }\n";

#[test]
fn router_address_waits_for_its_pool_survives_sigkill_and_mode_change_is_refused() {
    let s = Setup::new();
    // Pre-allocation 0 and the router's pool not there yet: Cilium crash-looped here.
    s.write("multi-pool", "");
    let mut daemon = Daemon::start(&s.ns, &s.config.0);
    let waiting = s.wait_for(&daemon, "the daemon to report what it waits for", |st| {
        st.waiting.is_some()
    });
    assert!(
        waiting.waiting.as_deref().unwrap().contains("pool hrz"),
        "{waiting:?}"
    );
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        daemon.running(),
        "the daemon must not exit while waiting:\n{}",
        daemon.log_text()
    );
    let log = daemon.log_text();
    assert!(
        log.contains("waiting for the operator to assign an IPv4 block of pool hrz"),
        "{log}"
    );
    let node_problem = s.status().unwrap().node_conditions;
    assert!(
        node_problem
            .iter()
            .any(|c| !c.status && c.message.contains("pool hrz does not exist")),
        "{node_problem:?}"
    );

    // The pool appears (configuration reloaded): the block arrives and the router gets its address.
    s.write("multi-pool", HRZ);
    daemon.signal(nix::sys::signal::Signal::SIGHUP);
    let ready = s.wait_for(&daemon, "the router address", |st| {
        st.infra.get("router").is_some_and(|m| !m.is_empty())
    });
    let router = *ready.infra["router"].values().next().unwrap();
    assert!(
        "10.60.0.0/26"
            .parse::<ipam_core::Cidr>()
            .unwrap()
            .contains(router),
        "{router}"
    );
    let ready = s.wait_for(&daemon, "the health address too", |st| {
        st.infra.contains_key("health") && st.infra.contains_key("ingress") && st.waiting.is_none()
    });
    assert_eq!(
        ready.node_blocks.len(),
        1,
        "router, health and ingress fit in one /26"
    );
    let ingress = *ready.infra["ingress"].values().next().unwrap();

    // SIGKILL and restart: restored before anything new, the router keeps its address.
    daemon.kill();
    std::fs::remove_file(s.dir.join("node/status.json")).unwrap();
    let daemon = Daemon::start(&s.ns, &s.config.0);
    let again = s.wait_for(&daemon, "the restarted daemon's router address", |st| {
        st.infra.contains_key("router")
    });
    assert_eq!(*again.infra["router"].values().next().unwrap(), router);
    let again = s.wait_for(&daemon, "the restarted daemon's ingress address", |st| {
        st.infra.contains_key("ingress")
    });
    assert_eq!(*again.infra["ingress"].values().next().unwrap(), ingress);
    let log = daemon.wait_log("IPAM state restored", Duration::from_secs(10));
    // A log written to a file (as a container's is to a pipe) carries no colour escapes.
    assert!(
        !log.contains('\x1b'),
        "ANSI escapes in a log that is not a terminal:\n{log}"
    );
    daemon.kill();

    // Another mode on the same cluster state: refused at start, with the way out.
    s.write("cluster-pool", HRZ);
    let mut wrong = Daemon::start(&s.ns, &s.config.0);
    let deadline = Instant::now() + Duration::from_secs(20);
    while wrong.running() {
        assert!(
            Instant::now() < deadline,
            "a daemon with another mode must refuse to start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = wrong.log_text();
    assert!(
        log.contains("multi-pool") && log.contains("cluster-pool") && log.contains("migrate"),
        "{log}"
    );
}

const TENANT: &str =
    "[[ipam.pool]]\nname = \"tenant\"\nipv4 = { cidrs = [\"10.61.0.0/16\"], maskSize = 27 }\n";

#[test]
fn a_network_configuration_names_the_pool_of_its_pods() {
    use ipam_tests::{
        cni::run_cni,
        pod_net::{reaches, result_address},
        workspace_binary,
    };
    let s = Setup::new();
    s.write("multi-pool", &format!("{HRZ}{TENANT}"));
    let daemon = Daemon::start(&s.ns, &s.config.0);
    s.wait_for(&daemon, "the router address", |st| {
        st.infra.contains_key("router") && st.waiting.is_none()
    });
    let conf = |pool: Option<&str>| {
        let mut conf = serde_json::json!({
            "cniVersion": "1.1.0", "name": "podnet", "type": "ipam-cni",
            "socket": s.dir.join("api/ipamd.sock"), "timeoutMs": 5000,
        });
        if let Some(pool) = pool {
            conf["pool"] = pool.into();
        }
        conf
    };
    // ADD until it is served: the first ADD of a pool asks for its block and is told to retry.
    let add = |container: &str, pod: &Netns, pool: Option<&str>| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (ok, result) = run_cni(
                &workspace_binary("ipam-cni"),
                Some(&s.ns),
                "ADD",
                container,
                "eth0",
                Some(pod),
                &conf(pool),
            );
            if ok {
                return result_address(&result).expect("an address");
            }
            assert_eq!(result["code"], 11, "{result}");
            assert!(
                Instant::now() < deadline,
                "{container} got no address: {result}\n{}",
                daemon.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let (plain, tenant) = (Netns::new("np-plain"), Netns::new("np-tenant"));
    let plain_ip = add("c-plain", &plain, None);
    let tenant_ip = add("c-tenant", &tenant, Some("tenant"));
    assert!(plain_ip.starts_with("10.60."), "{plain_ip}");
    assert!(tenant_ip.starts_with("10.61."), "{tenant_ip}");
    assert!(
        reaches(&tenant, &plain_ip),
        "tenant pod cannot reach {plain_ip}"
    );
    assert!(
        reaches(&plain, &tenant_ip),
        "plain pod cannot reach {tenant_ip}"
    );
    assert!(
        daemon.log_text().contains("from=\"network configuration\""),
        "the log says where the pool came from"
    );

    // A pool that does not exist: named, with the pools there are, and what to fix.
    let typo = Netns::new("np-typo");
    let (ok, result) = run_cni(
        &workspace_binary("ipam-cni"),
        Some(&s.ns),
        "ADD",
        "c-typo",
        "eth0",
        Some(&typo),
        &conf(Some("tenat")),
    );
    assert!(!ok);
    let message = result["msg"].as_str().unwrap_or_default();
    assert!(
        message.contains("pool tenat")
            && message.contains("hrz, tenant")
            && message.contains("\"pool\""),
        "{result}"
    );
    daemon.kill();
}
