//! Attaching the responder to interfaces, with links pinned so they outlive the daemon.
//!
//! On start the daemon adopts the links its predecessor pinned and atomically swaps its own
//! freshly loaded program into them (`bpf_link_update`): the interface is never without a
//! responder, which is what keeps answers flowing across restarts and upgrades.

use std::path::{Path, PathBuf};

use aya::programs::{
    LinkOrder, SchedClassifier, TcAttachType,
    links::{FdLink, PinnedLink},
    tc::{SchedClassifierLink, TcAttachOptions},
    xdp::{XdpLink, XdpMode},
};
use serde::Deserialize;

use super::{Datapath, DatapathError};
use crate::net::iface;

/// How the operator wants the responder attached to an interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttachMode {
    /// TC on virtual devices (veth, bridges: measured faster there, see docs/datapath.md);
    /// native XDP on physical NICs, falling back to TC when the driver has no native XDP.
    #[default]
    Auto,
    /// XDP in the driver. On a veth, replies reach the peer only if the peer runs an XDP
    /// program of its own (GRO alone was not enough on kernel 6.18; see docs/datapath.md).
    XdpNative,
    /// XDP in generic (skb) mode: works everywhere, slower than both other forms.
    XdpGeneric,
    /// TC ingress (tcx link), replies redirected back out of the same interface.
    Tc,
}

/// The concrete form an attachment took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachForm {
    XdpNative,
    XdpGeneric,
    Tc,
}

impl AttachForm {
    pub fn name(self) -> &'static str {
        match self {
            Self::XdpNative => "xdp-native",
            Self::XdpGeneric => "xdp-generic",
            Self::Tc => "tc",
        }
    }
}

/// The responder attached to one interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    pub interface: String,
    pub ifindex: u32,
    pub form: AttachForm,
    /// `true` when an existing pinned link was adopted (restart), `false` for a new attachment.
    pub adopted: bool,
}

const LINK_PREFIX: &str = "l2_responder";

fn link_pin(root: &Path, form: AttachForm, interface: &str, ifindex: u32) -> PathBuf {
    root.join("links").join(format!(
        "{LINK_PREFIX}-{}-{interface}-{ifindex}",
        form.name()
    ))
}

/// Parses a link pin name back into (form, interface, ifindex).
fn parse_link_pin(name: &str) -> Option<(AttachForm, &str, u32)> {
    let rest = name.strip_prefix(LINK_PREFIX)?.strip_prefix('-')?;
    let (form, rest) = [
        AttachForm::XdpNative,
        AttachForm::XdpGeneric,
        AttachForm::Tc,
    ]
    .into_iter()
    .find_map(|f| Some((f, rest.strip_prefix(f.name())?.strip_prefix('-')?)))?;
    let (interface, ifindex) = rest.rsplit_once('-')?;
    Some((form, interface, ifindex.parse().ok()?))
}

impl Datapath {
    /// Makes sure the responder is attached to `interface` in the form `mode` asks for.
    pub fn attach_responder(
        &mut self,
        interface: &str,
        mode: AttachMode,
    ) -> Result<Attachment, DatapathError> {
        let ifindex = iface::index(interface).map_err(|source| DatapathError::Interface {
            interface: interface.to_owned(),
            source,
        })?;
        let forms: &[AttachForm] = match mode {
            AttachMode::Auto if iface::is_virtual(interface) => &[AttachForm::Tc],
            AttachMode::Auto => &[AttachForm::XdpNative, AttachForm::Tc],
            AttachMode::XdpNative => &[AttachForm::XdpNative],
            AttachMode::XdpGeneric => &[AttachForm::XdpGeneric],
            AttachMode::Tc => &[AttachForm::Tc],
        };
        // An adoptable link in one of the acceptable forms wins: no detach, no gap.
        for &form in forms {
            let pin = link_pin(&self.root, form, interface, ifindex);
            if pin.exists() {
                match self.adopt(form, &pin) {
                    Ok(()) => {
                        self.detach_other_forms(ifindex, form)?;
                        return Ok(Attachment {
                            interface: interface.to_owned(),
                            ifindex,
                            form,
                            adopted: true,
                        });
                    }
                    Err(e) => {
                        tracing::warn!(
                            interface,
                            pin = %pin.display(),
                            "pinned responder link is stale ({e}); attaching afresh"
                        );
                        let _ = std::fs::remove_file(&pin);
                    }
                }
            }
        }
        let mut last_error = None;
        for &form in forms {
            self.detach_other_forms(ifindex, form)?;
            match self.attach_new(form, interface, ifindex) {
                Ok(()) => {
                    return Ok(Attachment {
                        interface: interface.to_owned(),
                        ifindex,
                        form,
                        adopted: false,
                    });
                }
                Err(e) => {
                    if forms.len() > 1 {
                        tracing::info!(
                            interface,
                            form = form.name(),
                            "cannot attach ({e}); trying the next form"
                        );
                    }
                    last_error = Some(e);
                }
            }
        }
        Err(last_error.expect("every mode allows at least one form"))
    }

    /// Detaches the responder from every interface not in `keep` (by removing its pinned link).
    pub fn detach_responders_except(
        &self,
        keep: &[Attachment],
    ) -> Result<Vec<String>, DatapathError> {
        let mut removed = Vec::new();
        for (name, form, interface, ifindex) in self.pinned_links()? {
            let wanted = keep
                .iter()
                .any(|a| a.form == form && a.interface == interface && a.ifindex == ifindex);
            if !wanted {
                self.unpin_link(&name)?;
                removed.push(interface);
            }
        }
        Ok(removed)
    }

    fn detach_other_forms(&self, ifindex: u32, keep: AttachForm) -> Result<(), DatapathError> {
        for (name, form, _, idx) in self.pinned_links()? {
            if idx == ifindex && form != keep {
                self.unpin_link(&name)?;
            }
        }
        Ok(())
    }

    fn pinned_links(&self) -> Result<Vec<(String, AttachForm, String, u32)>, DatapathError> {
        pinned_links(&self.root)
    }

    fn unpin_link(&self, name: &str) -> Result<(), DatapathError> {
        let path = self.root.join("links").join(name);
        std::fs::remove_file(&path).map_err(|source| DatapathError::PinDir { path, source })
    }

    fn adopt(&mut self, form: AttachForm, pin: &Path) -> Result<(), Box<dyn std::error::Error>> {
        let link = FdLink::from(PinnedLink::from_pin(pin)?);
        match form {
            AttachForm::XdpNative | AttachForm::XdpGeneric => {
                let program = self.responder_xdp();
                let id = program.attach_to_link(XdpLink::try_from(link)?)?;
                // Leave ownership with the pin: a link the program still owned would be detached
                // when this process exits.
                drop(program.take_link(id)?);
            }
            AttachForm::Tc => adopt_tc_link(self.responder_tc(), link)?,
        }
        Ok(())
    }

    fn attach_new(
        &mut self,
        form: AttachForm,
        interface: &str,
        ifindex: u32,
    ) -> Result<(), DatapathError> {
        let attach_error = |source| DatapathError::Attach {
            interface: interface.to_owned(),
            form: form.name(),
            source: Box::new(source),
        };
        let fd_link: FdLink = match form {
            AttachForm::XdpNative | AttachForm::XdpGeneric => {
                let mode = if form == AttachForm::XdpNative {
                    XdpMode::Driver
                } else {
                    XdpMode::Skb
                };
                let program = self.responder_xdp();
                let id = program.attach(interface, mode).map_err(attach_error)?;
                let link = program.take_link(id).map_err(attach_error)?;
                FdLink::try_from(link).map_err(|e| pin_error(interface, &self.root, e))?
            }
            // First in line: ARP and NS frames are answered before other programs spend time
            // on them.
            AttachForm::Tc => {
                let root = self.root.clone();
                tc_ingress_link(
                    self.responder_tc(),
                    interface,
                    LinkOrder::first(),
                    form.name(),
                    &root,
                )?
            }
        };
        let pin = link_pin(&self.root, form, interface, ifindex);
        fd_link
            .pin(&pin)
            .map_err(|e| pin_error(interface, &pin, e))?;
        Ok(())
    }
}

/// The responder attachments pinned under `root`, as the running daemon left them.
pub fn pinned_attachments(root: &Path) -> Result<Vec<Attachment>, DatapathError> {
    let mut out: Vec<Attachment> = pinned_links(root)?
        .into_iter()
        .map(|(_, form, interface, ifindex)| Attachment {
            interface,
            ifindex,
            form,
            adopted: true,
        })
        .collect();
    out.sort_by_key(|a| a.ifindex);
    Ok(out)
}

fn pinned_links(root: &Path) -> Result<Vec<(String, AttachForm, String, u32)>, DatapathError> {
    let dir = root.join("links");
    let entries = std::fs::read_dir(&dir).map_err(|source| DatapathError::PinDir {
        path: dir.clone(),
        source,
    })?;
    Ok(entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let (form, interface, ifindex) = parse_link_pin(&name)?;
            Some((name.clone(), form, interface.to_owned(), ifindex))
        })
        .collect())
}

/// Attaches `classifier` at TC ingress of `interface` (a tcx link at `order`) and returns the link
/// as an fd link, owned by nobody yet: the caller pins it. `what` names the program in errors.
pub(super) fn tc_ingress_link(
    classifier: &mut SchedClassifier,
    interface: &str,
    order: LinkOrder,
    what: &'static str,
    root: &Path,
) -> Result<FdLink, DatapathError> {
    let attach_error = |source| DatapathError::Attach {
        interface: interface.to_owned(),
        form: what,
        source: Box::new(source),
    };
    let id = classifier
        .attach_with_options(
            interface,
            TcAttachType::Ingress,
            TcAttachOptions::TcxOrder(order),
        )
        .map_err(attach_error)?;
    let link = classifier.take_link(id).map_err(attach_error)?;
    FdLink::try_from(link).map_err(|e| pin_error(interface, root, e))
}

/// Swaps `classifier` into a link adopted from a pin (`bpf_link_update`), leaving the link owned
/// by the pin: a link the program still owned would be detached when this process exits.
pub(super) fn adopt_tc_link(
    classifier: &mut SchedClassifier,
    link: FdLink,
) -> Result<(), Box<dyn std::error::Error>> {
    let id = classifier.attach_to_link(SchedClassifierLink::try_from(link)?)?;
    drop(classifier.take_link(id)?);
    Ok(())
}

pub(super) fn pin_error(
    interface: &str,
    path: &Path,
    source: impl std::error::Error + Send + Sync + 'static,
) -> DatapathError {
    DatapathError::PinLink {
        interface: interface.to_owned(),
        path: path.to_owned(),
        source: Box::new(source),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_pin_names_round_trip() {
        let root = Path::new("/r");
        for form in [
            AttachForm::XdpNative,
            AttachForm::XdpGeneric,
            AttachForm::Tc,
        ] {
            for (iface, idx) in [("eth0", 2), ("veth-a-b", 17), ("x", 0)] {
                let pin = link_pin(root, form, iface, idx);
                let name = pin.file_name().unwrap().to_str().unwrap();
                assert_eq!(parse_link_pin(name), Some((form, iface, idx)));
            }
        }
        assert_eq!(parse_link_pin("other-tc-eth0-2"), None);
        assert_eq!(parse_link_pin("l2_responder-xdp-eth0-2"), None);
    }
}
