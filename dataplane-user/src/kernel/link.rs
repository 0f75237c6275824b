//! Links: attaching the TC program at ingress of an interface, taking over pinned
//! links of an earlier run, and dropping links of interfaces that went away.

use std::{collections::BTreeMap, path::PathBuf};

use aya::{
    programs::{
        links::{FdLink, PinnedLink},
        tc::{self, SchedClassifierLink, SchedClassifierLinkId, TcAttachOptions},
        LinkOrder, SchedClassifier, TcAttachType,
    },
    util::KernelVersion,
};

use super::{load::TC_PROGRAM, pin::unpin, Datapath, KernelError};

/// This agent's attachment to one interface.
#[derive(Debug)]
pub(super) struct InterfaceLink {
    /// The interface's index when it was attached: a different index under the same
    /// name is another interface.
    ifindex: u32,
    /// A link owned by the program (unpinned); a pinned link is held by its pin file.
    owned: Option<SchedClassifierLinkId>,
    pin: Option<PathBuf>,
}

/// How `attach` attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attached {
    /// A new link, pinned: it outlives the agent.
    NewPinned,
    /// A pinned link of an earlier run now runs this agent's program (atomic swap, no
    /// packet sees no program).
    Replaced,
    /// Attached for the life of this process only (no pinning, or no tcx).
    Unpinned,
}

impl Datapath {
    /// Attaches the TC program at ingress of `iface`: tcx on kernels that have it
    /// (6.6+), clsact otherwise. With pinning and tcx the link is pinned and outlives
    /// the agent; a link pinned by an earlier run is taken over atomically. A pinned
    /// link left from an interface that was deleted and re-created under the same name
    /// is defunct (the kernel refuses to update it): it is replaced by a new link.
    pub fn attach(&mut self, iface: &str) -> Result<Attached, KernelError> {
        let attach_err = |source| KernelError::Attach {
            iface: iface.to_string(),
            source,
        };
        let ifindex = ifindex(iface).map_err(|source| KernelError::Interface {
            iface: iface.to_string(),
            source,
        })?;
        let tcx = KernelVersion::current().is_ok_and(|v| v >= KernelVersion::new(6, 6, 0));
        let link_pin = self.pins.as_ref().filter(|_| tcx).map(|p| p.link(iface));
        let program: &mut SchedClassifier = self
            .ebpf
            .program_mut(TC_PROGRAM)
            .ok_or(KernelError::MissingProgram(TC_PROGRAM))?
            .try_into()?;
        let Some(link_pin) = link_pin else {
            // Needed for the netlink attach before 6.6 (EEXIST when already there).
            let _ = tc::qdisc_add_clsact(iface);
            let id = program
                .attach(iface, TcAttachType::Ingress)
                .map_err(attach_err)?;
            self.links.insert(
                iface.to_string(),
                InterfaceLink {
                    ifindex,
                    owned: Some(id),
                    pin: None,
                },
            );
            return Ok(Attached::Unpinned);
        };
        let pin_err = |reason: String| KernelError::Pin {
            path: link_pin.clone(),
            reason,
        };
        let mut how = Attached::NewPinned;
        if let Ok(old) = PinnedLink::from_pin(&link_pin) {
            let link = SchedClassifierLink::try_from(FdLink::from(old))
                .map_err(|e| pin_err(format!("taking over the pinned link: {e}")))?;
            match program.attach_to_link(link) {
                Ok(id) => {
                    // The pin holds the link; the program need not.
                    drop(program.take_link(id));
                    how = Attached::Replaced;
                }
                Err(e) => {
                    tracing::info!(
                        interface = %iface,
                        "the pinned link belongs to an interface that no longer exists ({e}); \
                         attaching anew"
                    );
                    unpin(&link_pin).map_err(|e| pin_err(e.to_string()))?;
                }
            }
        }
        if how == Attached::NewPinned {
            let id = program
                .attach_with_options(
                    iface,
                    TcAttachType::Ingress,
                    TcAttachOptions::TcxOrder(LinkOrder::default()),
                )
                .map_err(attach_err)?;
            let link = program.take_link(id).map_err(attach_err)?;
            let fd_link = FdLink::try_from(link).map_err(|e| pin_err(e.to_string()))?;
            fd_link.pin(&link_pin).map_err(|e| pin_err(e.to_string()))?;
        }
        self.links.insert(
            iface.to_string(),
            InterfaceLink {
                ifindex,
                owned: None,
                pin: Some(link_pin),
            },
        );
        Ok(how)
    }

    /// Drops this agent's link on `iface` (for an interface that is gone or was
    /// re-created): a pinned link is unpinned, an owned one closed. Nothing happens to
    /// other interfaces. Returns whether there was a link.
    pub fn detach(&mut self, iface: &str) -> Result<bool, KernelError> {
        let Some(link) = self.links.remove(iface) else {
            return Ok(false);
        };
        if let Some(id) = link.owned {
            let program: &mut SchedClassifier = self
                .ebpf
                .program_mut(TC_PROGRAM)
                .ok_or(KernelError::MissingProgram(TC_PROGRAM))?
                .try_into()?;
            // Dropping the link detaches it; with the interface gone the kernel has
            // detached it already and the error of doing it again is of no interest.
            drop(program.take_link(id));
        }
        if let Some(pin) = link.pin {
            unpin(&pin).map_err(|e| KernelError::Pin {
                path: pin.clone(),
                reason: e.to_string(),
            })?;
        }
        Ok(true)
    }

    /// Interfaces this agent attached to, with their index at attach time.
    pub fn attached(&self) -> BTreeMap<String, u32> {
        self.links
            .iter()
            .map(|(name, link)| (name.clone(), link.ifindex))
            .collect()
    }

    /// Removes pinned links of interfaces this agent has not attached to: left by an
    /// earlier run for interfaces deleted since, or no longer selected. Their
    /// programs detach. Returns the interfaces whose links were removed.
    pub fn unpin_other_links(&self) -> Result<Vec<String>, KernelError> {
        let Some(pins) = &self.pins else {
            return Ok(Vec::new());
        };
        let mut removed = Vec::new();
        for iface in pins.linked_interfaces() {
            if self.links.contains_key(&iface) {
                continue;
            }
            let path = pins.link(&iface);
            unpin(&path).map_err(|e| KernelError::Pin {
                path: path.clone(),
                reason: e.to_string(),
            })?;
            removed.push(iface);
        }
        Ok(removed)
    }
}

/// The index of interface `name` in the calling thread's network namespace.
fn ifindex(name: &str) -> std::io::Result<u32> {
    let c = std::ffi::CString::new(name)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: NUL-terminated string; the call reads nothing else.
    match unsafe { libc::if_nametoindex(c.as_ptr()) } {
        0 => Err(std::io::Error::last_os_error()),
        index => Ok(index),
    }
}
