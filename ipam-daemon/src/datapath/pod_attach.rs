//! Attaching the pod programs (TC ingress, tcx links) to pod veths and uplinks, with the links
//! pinned as `links/<program>-<interface>-<ifindex>` so that pods keep their datapath while the
//! daemon restarts. A restarted daemon adopts each pinned link and swaps its own program in.

use std::path::{Path, PathBuf};

use aya::programs::{
    LinkOrder, SchedClassifier,
    links::{FdLink, PinnedLink},
};
use ipam_common::program_names;

use super::{
    Datapath, DatapathError,
    attach::{adopt_tc_link, pin_error, tc_ingress_link},
    program_mut,
};

/// The pod programs and where they go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodProgram {
    /// On each pod's host-side veth: what the pod sends.
    FromContainer,
    /// On the node's uplinks: traffic for local pods from other hosts.
    FromUplink,
}

impl PodProgram {
    pub fn name(self) -> &'static str {
        match self {
            Self::FromContainer => program_names::POD_FROM_CONTAINER,
            Self::FromUplink => program_names::POD_FROM_UPLINK,
        }
    }
}

/// One pinned pod program link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodLink {
    pub program: PodProgram,
    pub interface: String,
    pub ifindex: u32,
}

fn link_pin(root: &Path, program: PodProgram, interface: &str, ifindex: u32) -> PathBuf {
    root.join("links")
        .join(format!("{}-{interface}-{ifindex}", program.name()))
}

fn parse_link_pin(name: &str) -> Option<PodLink> {
    let (program, rest) = [PodProgram::FromContainer, PodProgram::FromUplink]
        .into_iter()
        .find_map(|p| Some((p, name.strip_prefix(p.name())?.strip_prefix('-')?)))?;
    let (interface, ifindex) = rest.rsplit_once('-')?;
    Some(PodLink {
        program,
        interface: interface.to_owned(),
        ifindex: ifindex.parse().ok()?,
    })
}

/// The pod program links pinned under `root`.
pub fn pinned_pod_links(root: &Path) -> Result<Vec<PodLink>, DatapathError> {
    let dir = root.join("links");
    let entries = std::fs::read_dir(&dir).map_err(|source| DatapathError::PinDir {
        path: dir.clone(),
        source,
    })?;
    Ok(entries
        .filter_map(Result::ok)
        .filter_map(|e| parse_link_pin(e.file_name().to_str()?))
        .collect())
}

/// Removes the pin of `link` under `root`, which detaches it (nothing else holds pod links).
/// Removing a pin that is not there is not an error.
pub fn unpin_pod_link(root: &Path, link: &PodLink) -> Result<(), DatapathError> {
    let path = link_pin(root, link.program, &link.interface, link.ifindex);
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(DatapathError::PinDir { path, source }),
    }
}

impl Datapath {
    /// Makes sure `program` runs at TC ingress of `interface` (index `ifindex`): adopts the pinned
    /// link of a previous daemon (swapping this daemon's program in) or attaches and pins anew.
    /// Returns `true` when the link was adopted.
    pub fn attach_pod_program(
        &mut self,
        program: PodProgram,
        interface: &str,
        ifindex: u32,
    ) -> Result<bool, DatapathError> {
        let pin = link_pin(&self.root, program, interface, ifindex);
        if pin.exists() {
            match self.adopt_pod_link(program, &pin) {
                Ok(()) => return Ok(true),
                Err(e) => {
                    tracing::warn!(
                        interface,
                        pin = %pin.display(),
                        "pinned {} link is stale ({e}); attaching afresh",
                        program.name()
                    );
                    let _ = std::fs::remove_file(&pin);
                }
            }
        }
        let root = self.root.clone();
        // After the L2 responder, which must see ARP and NS first on shared uplinks.
        let fd_link = tc_ingress_link(
            self.pod_program(program),
            interface,
            LinkOrder::last(),
            program.name(),
            &root,
        )?;
        fd_link
            .pin(&pin)
            .map_err(|e| pin_error(interface, &pin, e))?;
        Ok(false)
    }

    /// Whether `program` has a pinned link on the interface.
    pub fn pod_program_pinned(&self, program: PodProgram, interface: &str, ifindex: u32) -> bool {
        link_pin(&self.root, program, interface, ifindex).exists()
    }

    /// Detaches `program` from the interface by removing its pinned link; detaching what is not
    /// attached is not an error (a deleted veth takes its link with it).
    pub fn detach_pod_program(
        &self,
        program: PodProgram,
        interface: &str,
        ifindex: u32,
    ) -> Result<(), DatapathError> {
        unpin_pod_link(
            &self.root,
            &PodLink {
                program,
                interface: interface.to_owned(),
                ifindex,
            },
        )
    }

    /// A loaded pod program (also what `BPF_PROG_TEST_RUN` tests run).
    pub fn pod_program(&mut self, program: PodProgram) -> &mut SchedClassifier {
        program_mut(&mut self.ebpf, program.name())
    }

    fn adopt_pod_link(
        &mut self,
        program: PodProgram,
        pin: &Path,
    ) -> Result<(), Box<dyn std::error::Error>> {
        let link = FdLink::from(PinnedLink::from_pin(pin)?);
        adopt_tc_link(self.pod_program(program), link)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_link_pin_names_round_trip() {
        for program in [PodProgram::FromContainer, PodProgram::FromUplink] {
            for (iface, idx) in [("eth0", 2), ("ipam1a2b-c", 17)] {
                let pin = link_pin(Path::new("/r"), program, iface, idx);
                let link = parse_link_pin(pin.file_name().unwrap().to_str().unwrap()).unwrap();
                assert_eq!(
                    (link.program, link.interface.as_str(), link.ifindex),
                    (program, iface, idx)
                );
            }
        }
        assert_eq!(parse_link_pin("l2_responder-tc-eth0-2"), None);
    }
}
