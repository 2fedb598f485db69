//! Network namespaces and veth pairs owned by a test.

use std::{fs::File, path::PathBuf};

use crate::{run, unique};

/// A named network namespace (`ip netns add`), deleted on drop with everything in it.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(tag: &str) -> Self {
        let name = unique(tag);
        run("ip", &["netns", "add", &name]);
        let ns = Self { name };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }

    /// `ip -n <ns> <args>`.
    pub fn ip(&self, args: &[&str]) -> String {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend_from_slice(args);
        run("ip", &full)
    }

    /// Runs `f` on a thread that has entered this namespace, and returns its result.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let handle = self.spawn(f);
        match handle.join() {
            Ok(v) => v,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }

    /// Like `run`, without waiting.
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<T> {
        let path = self.path();
        std::thread::spawn(move || {
            let file = File::open(&path).expect("open netns");
            // Only this thread moves into the namespace.
            let moved = nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET);
            assert!(moved.is_ok(), "setns {}: {:?}", path.display(), moved);
            f()
        })
    }

    /// The MAC address of `dev` in this namespace.
    pub fn mac(&self, dev: &str) -> [u8; 6] {
        let dev = dev.to_owned();
        self.run(move || ipam_daemon::net::iface::mac(&dev).expect("mac"))
    }

    pub fn ifindex(&self, dev: &str) -> u32 {
        let dev = dev.to_owned();
        self.run(move || ipam_daemon::net::iface::index(&dev).expect("ifindex"))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// Joins `a` and `b` with a veth pair named `dev_a` in `a` and `dev_b` in `b`, both up.
pub fn veth(a: &Netns, dev_a: &str, b: &Netns, dev_b: &str) {
    let tmp_a = unique("va");
    let tmp_b = unique("vb");
    run(
        "ip",
        &[
            "link", "add", &tmp_a, "type", "veth", "peer", "name", &tmp_b,
        ],
    );
    run(
        "ip",
        &["link", "set", &tmp_a, "netns", &a.name, "name", dev_a],
    );
    run(
        "ip",
        &["link", "set", &tmp_b, "netns", &b.name, "name", dev_b],
    );
    a.ip(&["link", "set", dev_a, "up"]);
    b.ip(&["link", "set", dev_b, "up"]);
}
