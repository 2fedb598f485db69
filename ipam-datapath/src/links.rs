//! Pinned program links, the one place that names, lists and removes them.
//!
//! Every attachment of every program is a link pinned at `links/<program>-<interface>-<ifindex>`
//! under the daemon's root, where `<program>` is `l2_responder-<form>` or a pod program's name.
//! A pin outlives the daemon, so the interface keeps its program while the daemon restarts; the
//! next daemon adopts the link and swaps its own program in (`bpf_link_update`).

use std::path::{Path, PathBuf};

use aya::programs::{
    LinkOrder, ProgramError, SchedClassifier, TcAttachType,
    links::{FdLink, LinkError},
    tc::{SchedClassifierLink, TcAttachOptions},
};
use thiserror::Error;

use super::{AttachForm, DatapathError, PodProgram};

/// The program a pinned link carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LinkedProgram {
    Responder(AttachForm),
    Pod(PodProgram),
}

const RESPONDER_PREFIX: &str = "l2_responder";

impl LinkedProgram {
    const ALL: [Self; 7] = [
        Self::Responder(AttachForm::XdpNative),
        Self::Responder(AttachForm::XdpGeneric),
        Self::Responder(AttachForm::Tc),
        Self::Pod(PodProgram::FromContainer),
        Self::Pod(PodProgram::ToContainer),
        Self::Pod(PodProgram::FromUplink),
        Self::Pod(PodProgram::ToUplink),
    ];

    /// The program's part of the pin name, also how errors and logs name it.
    pub(crate) fn pin_prefix(self) -> String {
        match self {
            Self::Responder(form) => format!("{RESPONDER_PREFIX}-{}", form.name()),
            Self::Pod(program) => program.name().to_owned(),
        }
    }
}

/// One pinned link: which program, on which interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LinkPin {
    pub(crate) program: LinkedProgram,
    pub(crate) interface: String,
    pub(crate) ifindex: u32,
}

impl LinkPin {
    pub(crate) fn new(program: LinkedProgram, interface: &str, ifindex: u32) -> Self {
        Self {
            program,
            interface: interface.to_owned(),
            ifindex,
        }
    }

    pub(crate) fn path(&self, root: &Path) -> PathBuf {
        root.join("links").join(format!(
            "{}-{}-{}",
            self.program.pin_prefix(),
            self.interface,
            self.ifindex
        ))
    }

    /// The inverse of the file name of [`LinkPin::path`]; `None` for other files.
    fn parse(name: &str) -> Option<Self> {
        // Longest prefix first would matter if one prefix were a prefix of another followed by
        // '-'; none is, so the first match is the only one.
        let (program, rest) = LinkedProgram::ALL.into_iter().find_map(|p| {
            let rest = name.strip_prefix(&p.pin_prefix())?.strip_prefix('-')?;
            Some((p, rest))
        })?;
        let (interface, ifindex) = rest.rsplit_once('-')?;
        Some(Self {
            program,
            interface: interface.to_owned(),
            ifindex: ifindex.parse().ok()?,
        })
    }

    pub(crate) fn exists(&self, root: &Path) -> bool {
        self.path(root).exists()
    }
}

/// Every link pinned under `root`.
pub(crate) fn pinned_links(root: &Path) -> Result<Vec<LinkPin>, DatapathError> {
    let dir = root.join("links");
    let entries = std::fs::read_dir(&dir).map_err(|source| DatapathError::PinDir {
        path: dir.clone(),
        source,
    })?;
    Ok(entries
        .filter_map(Result::ok)
        .filter_map(|e| LinkPin::parse(e.file_name().to_str()?))
        .collect())
}

/// Removes the pin, which detaches the link (nothing else holds it). Removing a pin that is not
/// there is not an error: a deleted interface takes its links with it.
pub(crate) fn unpin(root: &Path, link: &LinkPin) -> Result<(), DatapathError> {
    let path = link.path(root);
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(DatapathError::PinDir { path, source }),
    }
}

/// Why a pinned link could not be adopted; the caller then attaches afresh.
#[derive(Debug, Error)]
pub(crate) enum AdoptError {
    #[error("the pinned link is unusable: {0}")]
    Link(#[from] LinkError),
    #[error("the program cannot take over the link: {0}")]
    Program(#[from] ProgramError),
}

/// Attaches `classifier` at TC `hook` of `interface` (a tcx link at `order`), pins the link at
/// `pin` and leaves it owned by the pin only.
pub(super) fn attach_tc(
    classifier: &mut SchedClassifier,
    pin: &LinkPin,
    hook: TcAttachType,
    order: LinkOrder,
    root: &Path,
) -> Result<(), DatapathError> {
    let attach_error = |source| DatapathError::Attach {
        interface: pin.interface.clone(),
        program: pin.program.pin_prefix(),
        source: Box::new(source),
    };
    let id = classifier
        .attach_with_options(&pin.interface, hook, TcAttachOptions::TcxOrder(order))
        .map_err(attach_error)?;
    let link = classifier.take_link(id).map_err(attach_error)?;
    let fd_link = FdLink::try_from(link).map_err(|e| pin_error(pin, root, e))?;
    pin_link(fd_link, pin, root)
}

/// Pins `link` where `pin` says.
pub(super) fn pin_link(link: FdLink, pin: &LinkPin, root: &Path) -> Result<(), DatapathError> {
    link.pin(pin.path(root))
        .map(drop)
        .map_err(|e| pin_error(pin, root, e))
}

/// Swaps `classifier` into a TC link adopted from a pin (`bpf_link_update`), leaving the link
/// owned by the pin: a link the program still owned would be detached when this process exits.
pub(super) fn adopt_tc_link(
    classifier: &mut SchedClassifier,
    link: FdLink,
) -> Result<(), AdoptError> {
    let id = classifier.attach_to_link(SchedClassifierLink::try_from(link)?)?;
    drop(classifier.take_link(id)?);
    Ok(())
}

pub(super) fn pin_error(
    pin: &LinkPin,
    root: &Path,
    source: impl std::error::Error + Send + Sync + 'static,
) -> DatapathError {
    DatapathError::PinLink {
        program: pin.program.pin_prefix(),
        interface: pin.interface.clone(),
        path: pin.path(root),
        source: Box::new(source),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pin_names_round_trip_for_every_program() {
        let root = Path::new("/r");
        for program in LinkedProgram::ALL {
            for (iface, idx) in [("eth0", 2), ("veth-a-b", 17), ("ipam1a2b-c", 0)] {
                let pin = LinkPin::new(program, iface, idx);
                let path = pin.path(root);
                let name = path.file_name().unwrap().to_str().unwrap();
                assert_eq!(LinkPin::parse(name), Some(pin));
            }
        }
        assert_eq!(LinkPin::parse("other-tc-eth0-2"), None);
        assert_eq!(LinkPin::parse("l2_responder-xdp-eth0-2"), None);
        assert_eq!(LinkPin::parse("pod_from_container-eth0-x"), None);
    }
}
