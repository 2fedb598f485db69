//! Attaching the responder to interfaces, with links pinned (`links`) so they outlive the daemon.
//!
//! On start the daemon adopts the links its predecessor pinned and atomically swaps its own
//! freshly loaded program into them (`bpf_link_update`): the interface is never without a
//! responder, which is what keeps answers flowing across restarts and upgrades.

use std::path::Path;

use aya::programs::{
    LinkOrder, TcAttachType,
    links::{FdLink, PinnedLink},
    xdp::{XdpLink, XdpMode},
};
use ipam_netlink::iface;

use super::{
    Datapath, DatapathError,
    links::{self, AdoptError, LinkPin, LinkedProgram},
};

/// How the responder is to be attached to an interface (the configuration's
/// `[interfaces.<name>] attach`, which the daemon maps onto this).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
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
    /// This process attached or adopted it before, and it is still in place: nothing was done.
    pub kept: bool,
}

impl Attachment {
    /// Why this attachment may not answer although it attached, if it may not. A native XDP
    /// reply on a veth (XDP_TX) reaches the peer only when the peer runs an XDP program of its
    /// own (or has GRO on): the kernel reports success either way, so the daemon and `ipamctl
    /// status` say it instead of reporting a silent success.
    pub fn caveat(&self) -> Option<String> {
        let veth = iface::driver(&self.interface).as_deref() == Some("veth");
        (self.form == AttachForm::XdpNative && veth).then(|| {
            format!(
                "interface {} is a veth with the responder in native XDP: its replies reach \
                 the peer only if the peer runs an XDP program (or has GRO enabled); use \
                 attach = \"tc\" (faster on veth) or \"auto\" for this interface",
                self.interface
            )
        })
    }
}

fn responder_pin(form: AttachForm, interface: &str, ifindex: u32) -> LinkPin {
    LinkPin::new(LinkedProgram::Responder(form), interface, ifindex)
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
        // Attached (or adopted) by this process and still pinned: nothing to do. Adopting again
        // would swap the program on the link, which waits for an RCU grace period each time.
        if let Some(done) = self.responders.get(interface)
            && done.ifindex == ifindex
            && responder_pin(done.form, interface, ifindex)
                .path(&self.root)
                .exists()
        {
            return Ok(Attachment {
                kept: true,
                ..done.clone()
            });
        }
        let attachment = self.attach_responder_anew(interface, ifindex, mode)?;
        self.responders
            .insert(interface.to_owned(), attachment.clone());
        Ok(attachment)
    }

    fn attach_responder_anew(
        &mut self,
        interface: &str,
        ifindex: u32,
        mode: AttachMode,
    ) -> Result<Attachment, DatapathError> {
        let forms: &[AttachForm] = match mode {
            AttachMode::Auto if iface::is_virtual(interface) => &[AttachForm::Tc],
            AttachMode::Auto => &[AttachForm::XdpNative, AttachForm::Tc],
            AttachMode::XdpNative => &[AttachForm::XdpNative],
            AttachMode::XdpGeneric => &[AttachForm::XdpGeneric],
            AttachMode::Tc => &[AttachForm::Tc],
        };
        // An adoptable link in one of the acceptable forms wins: no detach, no gap.
        for &form in forms {
            let pin = responder_pin(form, interface, ifindex).path(&self.root);
            if pin.exists() {
                match self.adopt(form, &pin) {
                    Ok(()) => {
                        self.detach_other_forms(ifindex, form)?;
                        return Ok(Attachment {
                            interface: interface.to_owned(),
                            ifindex,
                            form,
                            adopted: true,
                            kept: false,
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
                        kept: false,
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
        &mut self,
        keep: &[Attachment],
    ) -> Result<Vec<String>, DatapathError> {
        self.responders
            .retain(|interface, _| keep.iter().any(|a| &a.interface == interface));
        let mut removed = Vec::new();
        for attachment in pinned_attachments(&self.root)? {
            let wanted = keep.iter().any(|a| {
                a.form == attachment.form
                    && a.interface == attachment.interface
                    && a.ifindex == attachment.ifindex
            });
            if !wanted {
                links::unpin(
                    &self.root,
                    &responder_pin(attachment.form, &attachment.interface, attachment.ifindex),
                )?;
                removed.push(attachment.interface);
            }
        }
        Ok(removed)
    }

    fn detach_other_forms(&self, ifindex: u32, keep: AttachForm) -> Result<(), DatapathError> {
        for a in pinned_attachments(&self.root)? {
            if a.ifindex == ifindex && a.form != keep {
                links::unpin(&self.root, &responder_pin(a.form, &a.interface, a.ifindex))?;
            }
        }
        Ok(())
    }

    fn adopt(&mut self, form: AttachForm, pin: &Path) -> Result<(), AdoptError> {
        let link = FdLink::from(PinnedLink::from_pin(pin)?);
        match form {
            AttachForm::XdpNative | AttachForm::XdpGeneric => {
                let program = self.responder_xdp();
                let id = program.attach_to_link(XdpLink::try_from(link)?)?;
                // Leave ownership with the pin: a link the program still owned would be detached
                // when this process exits.
                drop(program.take_link(id)?);
            }
            AttachForm::Tc => links::adopt_tc_link(self.responder_tc(), link)?,
        }
        Ok(())
    }

    fn attach_new(
        &mut self,
        form: AttachForm,
        interface: &str,
        ifindex: u32,
    ) -> Result<(), DatapathError> {
        let pin = responder_pin(form, interface, ifindex);
        let root = self.root.clone();
        match form {
            AttachForm::XdpNative | AttachForm::XdpGeneric => {
                let attach_error = |source| DatapathError::Attach {
                    interface: interface.to_owned(),
                    program: pin.program.pin_prefix(),
                    source: Box::new(source),
                };
                let mode = if form == AttachForm::XdpNative {
                    XdpMode::Driver
                } else {
                    XdpMode::Skb
                };
                let program = self.responder_xdp();
                let id = program.attach(interface, mode).map_err(attach_error)?;
                let link = program.take_link(id).map_err(attach_error)?;
                let fd_link =
                    FdLink::try_from(link).map_err(|e| links::pin_error(&pin, &root, e))?;
                links::pin_link(fd_link, &pin, &root)
            }
            // First in line: ARP and NS frames are answered before other programs spend time
            // on them.
            AttachForm::Tc => links::attach_tc(
                self.responder_tc(),
                &pin,
                TcAttachType::Ingress,
                LinkOrder::first(),
                &root,
            ),
        }
    }
}

/// The responder attachments pinned under `root`, as the running daemon left them.
pub fn pinned_attachments(root: &Path) -> Result<Vec<Attachment>, DatapathError> {
    let mut out: Vec<Attachment> = links::pinned_links(root)?
        .into_iter()
        .filter_map(|pin| match pin.program {
            LinkedProgram::Responder(form) => Some(Attachment {
                kept: false,
                interface: pin.interface,
                ifindex: pin.ifindex,
                form,
                adopted: true,
            }),
            LinkedProgram::Pod(_) => None,
        })
        .collect();
    out.sort_by_key(|a| a.ifindex);
    Ok(out)
}
