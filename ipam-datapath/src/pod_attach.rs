//! Attaching the pod programs (TC ingress and egress, tcx links) to pod veths and uplinks, with the links
//! pinned (`links`) so that pods keep their datapath while the daemon restarts. A restarted
//! daemon adopts each pinned link and swaps its own program in.

use std::path::Path;

use aya::programs::{
    LinkOrder, SchedClassifier, TcAttachType,
    links::{FdLink, PinnedLink},
};
use ipam_common::program_names;

use super::{
    Datapath, DatapathError,
    links::{self, AdoptError, LinkPin, LinkedProgram},
    program_mut,
};

/// The pod programs and where they go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodProgram {
    /// On each pod's host-side veth, ingress: what the pod sends.
    FromContainer,
    /// On each pod's host-side veth, egress: what the kernel stack sends the pod.
    ToContainer,
    /// On the node's uplinks, ingress: traffic for local pods from other hosts.
    FromUplink,
    /// On the node's uplinks, egress: what the stack routes from local pods to other nodes'.
    ToUplink,
}

impl PodProgram {
    /// The programs every pod's host-side veth carries.
    pub const POD_VETH: [Self; 2] = [Self::FromContainer, Self::ToContainer];
    /// The programs every uplink carries.
    pub const UPLINK: [Self; 2] = [Self::FromUplink, Self::ToUplink];

    pub fn name(self) -> &'static str {
        match self {
            Self::FromContainer => program_names::POD_FROM_CONTAINER,
            Self::ToContainer => program_names::POD_TO_CONTAINER,
            Self::FromUplink => program_names::POD_FROM_UPLINK,
            Self::ToUplink => program_names::POD_TO_UPLINK,
        }
    }

    /// Whether it runs on packets the interface receives or sends.
    pub fn attach_type(self) -> TcAttachType {
        match self {
            Self::FromContainer | Self::FromUplink => TcAttachType::Ingress,
            Self::ToContainer | Self::ToUplink => TcAttachType::Egress,
        }
    }

    /// Whether it runs on a pod's host-side veth (rather than an uplink).
    pub fn on_pod_veth(self) -> bool {
        Self::POD_VETH.contains(&self)
    }
}

/// One pinned pod program link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodLink {
    pub program: PodProgram,
    pub interface: String,
    pub ifindex: u32,
}

impl PodLink {
    fn pin(&self) -> LinkPin {
        pod_pin(self.program, &self.interface, self.ifindex)
    }
}

fn pod_pin(program: PodProgram, interface: &str, ifindex: u32) -> LinkPin {
    LinkPin::new(LinkedProgram::Pod(program), interface, ifindex)
}

/// The pod program links pinned under `root`.
pub fn pinned_pod_links(root: &Path) -> Result<Vec<PodLink>, DatapathError> {
    Ok(links::pinned_links(root)?
        .into_iter()
        .filter_map(|pin| match pin.program {
            LinkedProgram::Pod(program) => Some(PodLink {
                program,
                interface: pin.interface,
                ifindex: pin.ifindex,
            }),
            LinkedProgram::Responder(_) => None,
        })
        .collect())
}

/// Removes the pin of `link` under `root`, which detaches it (nothing else holds pod links).
/// Removing a pin that is not there is not an error.
pub fn unpin_pod_link(root: &Path, link: &PodLink) -> Result<(), DatapathError> {
    links::unpin(root, &link.pin())
}

impl Datapath {
    /// Makes sure `program` runs at its TC hook of `interface` (index `ifindex`): adopts the pinned
    /// link of a previous daemon (swapping this daemon's program in) or attaches and pins anew.
    /// Returns `true` when the link was adopted.
    pub fn attach_pod_program(
        &mut self,
        program: PodProgram,
        interface: &str,
        ifindex: u32,
    ) -> Result<bool, DatapathError> {
        let link_pin = pod_pin(program, interface, ifindex);
        let pin = link_pin.path(&self.root);
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
        links::attach_tc(
            self.pod_program(program),
            &link_pin,
            program.attach_type(),
            LinkOrder::last(),
            &root,
        )?;
        Ok(false)
    }

    /// Whether `program` has a pinned link on the interface.
    pub fn pod_program_pinned(&self, program: PodProgram, interface: &str, ifindex: u32) -> bool {
        pod_pin(program, interface, ifindex).exists(&self.root)
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

    fn adopt_pod_link(&mut self, program: PodProgram, pin: &Path) -> Result<(), AdoptError> {
        let link = FdLink::from(PinnedLink::from_pin(pin)?);
        links::adopt_tc_link(self.pod_program(program), link)
    }
}
