//! Pod endpoints: the pod interfaces the main CNI plugin set up, as the datapath must know them.
//!
//! The table is persisted in `<state_dir>/endpoints.json` (atomic rename) before an answer goes
//! back, and the endpoint map plus the pod programs' links are pinned, so a restarted daemon
//! finds both and reconciles one with the other: pods stay connected through restarts.

use std::{
    collections::{BTreeMap, HashSet},
    io,
    net::IpAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use ipam_api::{
    endpoint_table,
    types::{AttachmentId, Endpoint},
};
use ipam_common::pod::{PodEndpoint, PodStat};
use ipam_core::atomic_file;
use thiserror::Error;

use ipam_datapath::{Datapath, DatapathError, PodProgram, pinned_pod_links};
use ipam_netlink::iface;

/// The registered endpoints of this node, keyed by owner (`AttachmentId::owner`).
pub struct Endpoints {
    datapath: Arc<Mutex<Datapath>>,
    file: PathBuf,
    table: Mutex<BTreeMap<String, Endpoint>>,
    /// The links pinned by the previous daemon were adopted (this daemon's program swapped in);
    /// later reconciliations only re-attach missing links.
    adopted: std::sync::atomic::AtomicBool,
}

/// What a reconciliation changed.
#[derive(Debug, Default)]
pub struct EndpointReport {
    /// Endpoints whose veth is gone (pod deleted without CNI DEL): forgotten.
    pub vanished: Vec<String>,
    /// Map entries that belonged to no endpoint: removed.
    pub stale_entries: Vec<IpAddr>,
    /// Endpoints whose program link was adopted from the previous daemon.
    pub adopted: usize,
}

/// Why an endpoint could not be registered, removed or reconciled.
#[derive(Debug, Error)]
pub enum EndpointError {
    /// The plugin claims an address the daemon did not allocate to the attachment.
    #[error(
        "container {container} interface {ifname}: address {ip} is not allocated to it (it \
         holds {held:?}); run CNI ADD again"
    )]
    NotAllocated {
        container: String,
        ifname: String,
        ip: IpAddr,
        held: Vec<IpAddr>,
    },
    #[error("container {container}: {source}")]
    Datapath {
        container: String,
        #[source]
        source: DatapathError,
    },
    #[error(transparent)]
    Reconcile(#[from] DatapathError),
    #[error("cannot write the endpoint table {file}: {source}; check the state directory")]
    Persist {
        file: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl EndpointError {
    fn datapath(id: &AttachmentId) -> impl FnOnce(DatapathError) -> Self {
        let container = id.container_id.clone();
        move |source| Self::Datapath { container, source }
    }
}

impl Endpoints {
    /// Loads the persisted table (an absent file is an empty table).
    pub fn open(datapath: Arc<Mutex<Datapath>>, state_dir: &Path) -> io::Result<Self> {
        let file = state_dir.join(endpoint_table::FILE);
        let table = endpoint_table::read(state_dir)
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "{} is not a valid endpoint table ({e}); move it away to start without \
                         it (pods then need CNI ADD again)",
                        file.display()
                    ),
                )
            })?
            .into_iter()
            .map(|e| (e.id.owner(), e))
            .collect();
        Ok(Self {
            datapath,
            file,
            table: Mutex::new(table),
            adopted: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Programs the datapath for `endpoint`: map entries for its addresses, the pod program on
    /// its host veth. `held` are the addresses the daemon allocated to the attachment; an
    /// endpoint may only claim those.
    pub fn register(&self, endpoint: Endpoint, held: &[IpAddr]) -> Result<(), EndpointError> {
        let owner = endpoint.id.owner();
        if let Some(ip) = endpoint.ips.iter().find(|ip| !held.contains(ip)) {
            return Err(EndpointError::NotAllocated {
                container: endpoint.id.container_id.clone(),
                ifname: endpoint.id.ifname.clone(),
                ip: *ip,
                held: held.to_vec(),
            });
        }
        let mut table = self.table.lock().expect("endpoint table lock");
        let previous = table.get(&owner).cloned();
        let mut datapath = self.datapath.lock().expect("datapath lock");
        if let Some(old) = &previous {
            unprogram(&mut datapath, old, Some(&endpoint))
                .map_err(EndpointError::datapath(&endpoint.id))?;
        }
        if let Err(e) = program(&mut datapath, &endpoint) {
            // Leave nothing half-done: the runtime retries the ADD.
            let _ = unprogram(&mut datapath, &endpoint, None);
            return Err(EndpointError::datapath(&endpoint.id)(e));
        }
        drop(datapath);
        table.insert(owner.clone(), endpoint.clone());
        persist(&self.file, &table)?;
        tracing::info!(
            owner = owner.as_str(),
            pod = endpoint.pod.as_deref(),
            host_ifname = endpoint.host_ifname.as_str(),
            ips = ?endpoint.ips,
            "endpoint registered"
        );
        Ok(())
    }

    /// Forgets the endpoint of `id`, if there is one.
    pub fn remove(&self, id: &AttachmentId) -> Result<Option<Endpoint>, EndpointError> {
        let mut table = self.table.lock().expect("endpoint table lock");
        let Some(endpoint) = table.get(&id.owner()).cloned() else {
            return Ok(None);
        };
        unprogram(
            &mut self.datapath.lock().expect("datapath lock"),
            &endpoint,
            None,
        )
        .map_err(EndpointError::datapath(id))?;
        table.remove(&id.owner());
        persist(&self.file, &table)?;
        tracing::info!(
            owner = id.owner().as_str(),
            ips = ?endpoint.ips,
            "endpoint removed"
        );
        Ok(Some(endpoint))
    }

    /// Files the endpoint registered under `id`'s legacy key (before attachments carried their
    /// network) under `id`; nothing to do when there is none.
    pub fn adopt(&self, id: &AttachmentId) -> Result<(), EndpointError> {
        let mut table = self.table.lock().expect("endpoint table lock");
        let Some(mut endpoint) = table.remove(&id.legacy_owner()) else {
            return Ok(());
        };
        endpoint.id = id.clone();
        table.insert(id.owner(), endpoint);
        persist(&self.file, &table)
    }

    /// Removes every endpoint of `network` whose attachment is not in `valid` (CNI GC of that
    /// network); other networks' endpoints stay.
    pub fn retain(
        &self,
        network: &str,
        valid: &HashSet<&AttachmentId>,
    ) -> Result<Vec<AttachmentId>, EndpointError> {
        let stale: Vec<AttachmentId> = self
            .table
            .lock()
            .expect("endpoint table lock")
            .values()
            .filter(|e| e.id.network == network && !valid.contains(&e.id))
            .map(|e| e.id.clone())
            .collect();
        for id in &stale {
            self.remove(id)?;
        }
        Ok(stale)
    }

    pub fn list(&self) -> Vec<Endpoint> {
        self.table
            .lock()
            .expect("endpoint table lock")
            .values()
            .cloned()
            .collect()
    }

    /// The datapath's counters by name.
    pub fn stats(&self) -> Result<Vec<(String, u64)>, DatapathError> {
        let stats = self
            .datapath
            .lock()
            .expect("datapath lock")
            .pods()
            .stats()?;
        Ok(PodStat::ALL
            .iter()
            .map(|s| (s.name().to_owned(), stats.get(*s)))
            .collect())
    }

    /// Brings the datapath in line with the table: endpoints whose veth is gone are forgotten,
    /// every other one gets its map entries and program (adopting the pinned links of the
    /// previous daemon), and map entries or links that belong to no endpoint are removed.
    pub fn reconcile(&self) -> Result<EndpointReport, EndpointError> {
        let mut report = EndpointReport::default();
        let mut table = self.table.lock().expect("endpoint table lock");
        let mut datapath = self.datapath.lock().expect("datapath lock");
        let vanished: Vec<String> = table
            .iter()
            .filter(|(_, e)| iface::name(e.host_ifindex) != e.host_ifname)
            .map(|(owner, _)| owner.clone())
            .collect();
        for owner in &vanished {
            if let Some(endpoint) = table.remove(owner) {
                unprogram(&mut datapath, &endpoint, None)?;
            }
        }
        report.vanished = vanished;
        let mut wanted = HashSet::new();
        let first = !self.adopted.swap(true, std::sync::atomic::Ordering::SeqCst);
        for endpoint in table.values() {
            let linked = PodProgram::POD_VETH.into_iter().all(|program| {
                datapath.pod_program_pinned(program, &endpoint.host_ifname, endpoint.host_ifindex)
            });
            if first || !linked {
                if program(&mut datapath, endpoint)? {
                    report.adopted += 1;
                }
            } else {
                write_entries(&mut datapath, endpoint)?;
            }
            wanted.extend(endpoint.ips.iter().copied());
        }
        for (ip, _) in datapath.pods().list()? {
            if !wanted.contains(&ip) {
                datapath.pods().remove(ip)?;
                report.stale_entries.push(ip);
            }
        }
        for link in pinned_pod_links(datapath.root())? {
            let owned = table
                .values()
                .any(|e| e.host_ifindex == link.ifindex && e.host_ifname == link.interface);
            if link.program.on_pod_veth() && !owned {
                datapath.detach_pod_program(link.program, &link.interface, link.ifindex)?;
            }
        }
        if !report.vanished.is_empty() {
            persist(&self.file, &table)?;
        }
        Ok(report)
    }
}

/// Map entries and programs for one endpoint; `true` when the links of the pod's veth were
/// adopted (its ingress link: an older daemon's pod may lack the egress one, attached here).
fn program(datapath: &mut Datapath, endpoint: &Endpoint) -> Result<bool, DatapathError> {
    // The programs first: once the entries let other pods reach this one, what it sends is
    // already checked, and what the stack sends it already noted.
    let mut adopted = false;
    for program in PodProgram::POD_VETH {
        let this =
            datapath.attach_pod_program(program, &endpoint.host_ifname, endpoint.host_ifindex)?;
        adopted |= program == PodProgram::FromContainer && this;
    }
    write_entries(datapath, endpoint)?;
    Ok(adopted)
}

/// The endpoint map entries of one endpoint (identical entries are left alone).
fn write_entries(datapath: &mut Datapath, endpoint: &Endpoint) -> Result<(), DatapathError> {
    let value = PodEndpoint {
        host_ifindex: endpoint.host_ifindex,
        pod_mac: endpoint.pod_mac.0,
        host_mac: endpoint.host_mac.0,
    };
    for ip in &endpoint.ips {
        datapath.pods().insert(*ip, value)?;
    }
    Ok(())
}

/// Removes what `program` made for `old`, keeping what `new` (its replacement) still needs.
fn unprogram(
    datapath: &mut Datapath,
    old: &Endpoint,
    new: Option<&Endpoint>,
) -> Result<(), DatapathError> {
    for ip in &old.ips {
        if !new.is_some_and(|n| n.ips.contains(ip)) {
            datapath.pods().remove(*ip)?;
        }
    }
    let same_link =
        new.is_some_and(|n| n.host_ifindex == old.host_ifindex && n.host_ifname == old.host_ifname);
    if !same_link {
        for program in PodProgram::POD_VETH {
            datapath.detach_pod_program(program, &old.host_ifname, old.host_ifindex)?;
        }
    }
    Ok(())
}

fn persist(file: &Path, table: &BTreeMap<String, Endpoint>) -> Result<(), EndpointError> {
    let endpoints: Vec<&Endpoint> = table.values().collect();
    let bytes = serde_json::to_vec_pretty(&endpoints).expect("endpoints serialise");
    atomic_file::replace(file, &bytes)
        .map(drop)
        .map_err(|source| EndpointError::Persist {
            file: file.to_owned(),
            source,
        })
}
