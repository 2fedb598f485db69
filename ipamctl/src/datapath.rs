//! The commands that read this node's pinned eBPF maps: they work while the daemon runs,
//! restarts or is stopped.

use std::{collections::BTreeMap, net::IpAddr, path::Path, time::Duration};

use ipam_api::endpoint_table;
use ipam_api::types::Mac;
use ipam_common::{l2::ResponderStat, pod::PodStat};
use ipam_datapath::{PodMaps, ResponderMaps, clock, pinned_attachments};
use ipam_netlink::iface;
use serde::Serialize;

use crate::output::{Output, emit, table};

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Announcement {
    ip: IpAddr,
    interface: String,
    ifindex: u32,
    mac: String,
    replies: u64,
}

pub(crate) fn announcements(root: &Path, output: Output) -> anyhow::Result<()> {
    let maps = ResponderMaps::from_pins(root)?;
    let answer: Vec<Announcement> = maps
        .list()?
        .into_iter()
        .map(|e| Announcement {
            ip: e.ip,
            interface: iface::name(e.ifindex),
            ifindex: e.ifindex,
            mac: Mac(e.mac).to_string(),
            replies: e.replies,
        })
        .collect();
    emit(output, &answer, |entries| {
        let mut rows = table(["IP", "INTERFACE", "MAC", "REPLIES"]);
        for e in entries {
            rows.add_row([
                e.ip.to_string(),
                e.interface.clone(),
                e.mac.clone(),
                e.replies.to_string(),
            ]);
        }
        println!("{rows}");
        if entries.is_empty() {
            println!("(no IP is announced)");
        }
    })
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Endpoint {
    ip: IpAddr,
    host_veth: String,
    ifindex: u32,
    pod_mac: String,
    gateway_mac: String,
    /// The pod (namespace/name) or container; absent when the endpoint table does not name it.
    owner: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Endpoints {
    endpoints: Vec<Endpoint>,
    counters: BTreeMap<&'static str, u64>,
}

pub(crate) fn endpoints(root: &Path, state_dir: &Path, output: Output) -> anyhow::Result<()> {
    let maps = PodMaps::from_pins(root)?;
    let persisted = endpoint_table::read(state_dir).unwrap_or_else(|e| {
        eprintln!(
            "(cannot read the endpoint table under {}: {e}; owners not shown)",
            state_dir.display()
        );
        Vec::new()
    });
    let owner = |ip: &IpAddr| {
        persisted
            .iter()
            .find(|e| e.ips.contains(ip))
            .map(|e| e.pod.clone().unwrap_or_else(|| e.id.owner()))
    };
    let stats = maps.stats()?;
    let answer = Endpoints {
        endpoints: maps
            .list()?
            .into_iter()
            .map(|(ip, e)| Endpoint {
                ip,
                host_veth: iface::name(e.host_ifindex),
                ifindex: e.host_ifindex,
                pod_mac: Mac(e.pod_mac).to_string(),
                gateway_mac: Mac(e.host_mac).to_string(),
                owner: owner(&ip),
            })
            .collect(),
        counters: PodStat::ALL
            .iter()
            .map(|s| (s.name(), stats.get(*s)))
            .collect(),
    };
    emit(output, &answer, |answer| {
        let mut rows = table([
            "POD IP",
            "HOST VETH",
            "IFINDEX",
            "POD MAC",
            "GATEWAY MAC",
            "OWNER",
        ]);
        for e in &answer.endpoints {
            rows.add_row([
                e.ip.to_string(),
                e.host_veth.clone(),
                e.ifindex.to_string(),
                e.pod_mac.clone(),
                e.gateway_mac.clone(),
                e.owner.clone().unwrap_or_else(|| "?".into()),
            ]);
        }
        println!("{rows}");
        if answer.endpoints.is_empty() {
            println!("(no pod endpoint)");
        }
        println!("counters:");
        for (name, n) in &answer.counters {
            println!("  {name:<20} {n}");
        }
    })
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
enum ResponderState {
    /// The daemon's heartbeat is recent: the responders answer.
    Answering,
    /// The heartbeat is older than the liveness timeout: the responders stay silent.
    Silent,
    /// No heartbeat was ever written.
    NeverStarted,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Attachment {
    interface: String,
    ifindex: u32,
    form: &'static str,
    /// False when the interface with that index is gone.
    present: bool,
    caveat: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ResponderStatus {
    state: ResponderState,
    heartbeat_age_ms: Option<u64>,
    liveness_timeout_ms: u64,
    attachments: Vec<Attachment>,
    counters: BTreeMap<&'static str, u64>,
    announcements: usize,
}

pub(crate) fn status(root: &Path, output: Output) -> anyhow::Result<()> {
    let maps = ResponderMaps::from_pins(root)?;
    let config = maps.config()?;
    let timeout = Duration::from_nanos(config.max_staleness_ns);
    let age = (config.heartbeat_ns != 0)
        .then(|| Duration::from_nanos(clock::monotonic_ns().saturating_sub(config.heartbeat_ns)));
    let stats = maps.stats()?;
    let answer = ResponderStatus {
        state: match age {
            None => ResponderState::NeverStarted,
            Some(age) if age <= timeout => ResponderState::Answering,
            Some(_) => ResponderState::Silent,
        },
        heartbeat_age_ms: age.map(|a| a.as_millis() as u64),
        liveness_timeout_ms: timeout.as_millis() as u64,
        attachments: pinned_attachments(root)?
            .into_iter()
            .map(|a| Attachment {
                present: iface::index(&a.interface).ok() == Some(a.ifindex),
                caveat: a.caveat(),
                interface: a.interface,
                ifindex: a.ifindex,
                form: a.form.name(),
            })
            .collect(),
        counters: ResponderStat::ALL
            .iter()
            .map(|s| (s.name(), stats.get(*s)))
            .collect(),
        announcements: maps.list()?.len(),
    };
    emit(output, &answer, |s| {
        let timeout_ms = s.liveness_timeout_ms;
        match (&s.state, s.heartbeat_age_ms) {
            (ResponderState::NeverStarted, _) | (_, None) => {
                println!("responders: SILENT (the daemon has never written a heartbeat)");
            }
            (state, Some(age)) => {
                let state = match state {
                    ResponderState::Answering => "ANSWERING",
                    _ => "SILENT (daemon not alive: start or fix ipamd)",
                };
                println!(
                    "responders: {state}; last heartbeat {age} ms ago, liveness timeout {timeout_ms} ms"
                );
            }
        }
        println!("attachments:");
        for a in &s.attachments {
            let note = if a.present { "" } else { " (interface gone)" };
            println!(
                "  {} (ifindex {}): {}{note}",
                a.interface, a.ifindex, a.form
            );
            if let Some(caveat) = &a.caveat {
                println!("    WARNING: {caveat}");
            }
        }
        if s.attachments.is_empty() {
            println!("  (none)");
        }
        println!("counters:");
        for (name, n) in &s.counters {
            println!("  {name:<14} {n}");
        }
        println!("announcements: {}", s.announcements);
    })
}
