//! The XDP fast path on the node's uplinks (`--xdp`): `sliceway_xdp` beside the
//! uplink's TC program, over the same maps. It decides what it can before the kernel
//! makes an skb and passes the rest, untouched, to the TC program, which stays
//! attached; so where XDP cannot attach nothing is lost but speed.
//!
//! The XDP link is the agent's own (not pinned): it goes when the agent exits and a
//! restarted agent attaches anew, while the pinned TC program serves every packet in
//! between. A second XDP program on the same interface and mode is refused by the
//! kernel (EBUSY): another owner's XDP program is never replaced.

use aya::{
    maps::{DevMapHash, MapData, ProgramArray},
    programs::{TestRun, TestRunOptions, Xdp, XdpMode},
};
use dataplane_common::map_name;

use super::{
    load::{loaded_fd, set_slot, XDP6_PROGRAM, XDP_PROGRAM},
    Datapath, KernelError, TestRunOutput,
};

/// Where the XDP program goes (`--xdp`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum XdpChoice {
    /// No XDP: the uplinks' TC program decides every packet.
    #[default]
    Off,
    /// Native XDP, in the driver, where the driver has it; TC alone elsewhere.
    Native,
    /// Generic XDP (in the kernel's receive path, after the skb is made) on every
    /// uplink: for drivers without native XDP and for tests; it saves little or
    /// nothing over TC.
    Generic,
    /// Native where the driver has it, generic otherwise.
    Auto,
}

/// How the XDP program went on an interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpAttached {
    Native,
    Generic,
}

impl XdpAttached {
    pub const ALL: [XdpAttached; 2] = [XdpAttached::Native, XdpAttached::Generic];

    /// Its name in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            XdpAttached::Native => "native",
            XdpAttached::Generic => "generic",
        }
    }
}

/// The output context of an XDP test run (`struct xdp_md`): the offsets of data and
/// its end (from the metadata's start), of the metadata, and three interface fields.
#[repr(C)]
#[derive(Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct XdpMd {
    data: u32,
    data_end: u32,
    data_meta: u32,
    ingress_ifindex: u32,
    rx_queue_index: u32,
    egress_ifindex: u32,
}

impl Datapath {
    fn xdp_program(&mut self) -> Result<&mut Xdp, KernelError> {
        Ok(self
            .ebpf
            .program_mut(XDP_PROGRAM)
            .ok_or(KernelError::MissingProgram(XDP_PROGRAM))?
            .try_into()?)
    }

    /// Loads the XDP program if it is not yet (at the first uplink that gets it, or
    /// the first test run): an agent without `--xdp` never has the kernel verify it.
    /// Its IPv6 program with it ([`Datapath::load_xdp6`]).
    pub fn load_xdp(&mut self) -> Result<(), KernelError> {
        let program = self.xdp_program()?;
        if program.fd().is_err() {
            program.load()?;
            if let Err(e) = self.load_xdp6() {
                tracing::warn!(
                    program = XDP6_PROGRAM,
                    error = %e,
                    "the kernel refused the XDP program's IPv6 program: IPv6 is left to the uplinks' TC program"
                );
            }
        }
        Ok(())
    }

    /// Loads `sliceway_xdp6` and puts it in its slot of `XDP_JUMP6`, where
    /// `sliceway_xdp` hands IPv6 to it. The map is the loaded object's own (not
    /// pinned, as the XDP program is not).
    fn load_xdp6(&mut self) -> Result<(), KernelError> {
        let fd = loaded_fd(&mut self.ebpf, XDP6_PROGRAM, |p| {
            <&mut Xdp>::try_from(p)?.load()
        })?;
        let map = self
            .ebpf
            .map_mut(map_name::XDP_JUMP6)
            .ok_or(KernelError::MissingMap(map_name::XDP_JUMP6))?;
        let mut array = ProgramArray::try_from(map).map_err(|source| KernelError::Map {
            name: map_name::XDP_JUMP6,
            source,
        })?;
        set_slot(
            &mut array,
            map_name::XDP_JUMP6,
            dataplane_common::XDP_JUMP6_EXT,
            &fd,
        )
    }

    /// The XDP program, loaded ([`Datapath::load_xdp`]).
    fn xdp_loaded(&self) -> Result<&Xdp, KernelError> {
        Ok(self
            .ebpf
            .program(XDP_PROGRAM)
            .ok_or(KernelError::MissingProgram(XDP_PROGRAM))?
            .try_into()?)
    }

    /// Attaches the XDP program to uplink `iface` as `choice` says. `Ok(None)`: off.
    /// An error says why each mode tried was refused; the interface keeps its TC
    /// program either way.
    pub fn attach_xdp(
        &mut self,
        iface: &str,
        choice: XdpChoice,
    ) -> Result<Option<XdpAttached>, KernelError> {
        let modes: &[(XdpMode, XdpAttached)] = match choice {
            XdpChoice::Off => return Ok(None),
            XdpChoice::Native => &[(XdpMode::Driver, XdpAttached::Native)],
            XdpChoice::Generic => &[(XdpMode::Skb, XdpAttached::Generic)],
            XdpChoice::Auto => &[
                (XdpMode::Driver, XdpAttached::Native),
                (XdpMode::Skb, XdpAttached::Generic),
            ],
        };
        self.detach_xdp(iface);
        if self
            .program_on(iface)
            .is_some_and(|p| p == super::L3_PROGRAM || p == super::L3_EXT_PROGRAM)
        {
            tracing::info!(interface = %iface, "no Ethernet header: no XDP here, its TC program decides every packet");
            return Ok(None);
        }
        self.load_xdp()?;
        let mut refused = Vec::new();
        for &(mode, how) in modes {
            match self.xdp_program()?.attach(iface, mode) {
                Ok(id) => {
                    self.xdp_links.insert(iface.to_string(), (id, how));
                    if self.xdp_forward {
                        self.forward_from(iface);
                    }
                    return Ok(Some(how));
                }
                Err(e) => refused.push(format!("{}: {}", how.as_str(), crate::error_chain(&e))),
            }
        }
        Err(KernelError::Xdp {
            iface: iface.to_string(),
            reason: refused.join("; "),
        })
    }

    /// Detaches this agent's XDP program from `iface`, if it is there. Returns
    /// whether it was.
    pub fn detach_xdp(&mut self, iface: &str) -> bool {
        self.stop_forwarding(iface);
        let Some((id, _)) = self.xdp_links.remove(iface) else {
            return false;
        };
        if let Ok(program) = self.xdp_program() {
            // With the interface gone the kernel has detached it already; the error
            // of doing it again is of no interest.
            let _ = program.detach(id);
        }
        true
    }

    /// Makes the XDP program forward between the uplinks it is attached to from now
    /// on (`--xdp-forward`): each gets its entry in `XDP_FORWARD` as it is attached.
    /// Off (the default), the program passes every frame it translated to the stack.
    pub fn set_xdp_forward(&mut self, on: bool) {
        self.xdp_forward = on;
    }

    /// The XDP program's device map of the interfaces it forwards between.
    fn forward_map(&mut self) -> Result<DevMapHash<&mut MapData>, KernelError> {
        let map = self
            .ebpf
            .map_mut(map_name::XDP_FORWARD)
            .ok_or(KernelError::MissingMap(map_name::XDP_FORWARD))?;
        DevMapHash::try_from(map).map_err(|source| KernelError::Map {
            name: map_name::XDP_FORWARD,
            source,
        })
    }

    /// Puts uplink `iface` (the XDP program just attached to it) in `XDP_FORWARD`:
    /// its frames are forwarded from XDP, and frames from the other uplinks may be
    /// sent out of it. A failure is logged; the uplink then passes what XDP
    /// translated to the stack, as without forwarding.
    fn forward_from(&mut self, iface: &str) {
        // A veth hands `XDP_TX` frames on only to a peer with an XDP program of its
        // own: there frames go back out by `XDP_REDIRECT`, which a peer with NAPI
        // (GRO on) takes too. Any other driver, or one that does not say: `XDP_TX`.
        let tx = super::link::driver(iface).map_or(true, |d| d != "veth");
        let result = super::link::ifindex(iface)
            .map_err(|source| KernelError::Interface {
                iface: iface.to_string(),
                source,
            })
            .and_then(|index| self.forward_index(index, tx).map(|()| index));
        match result {
            Ok(index) => {
                self.forwarding.insert(iface.to_string(), index);
                tracing::info!(
                    interface = %iface,
                    ifindex = index,
                    back_out = if tx { "XDP_TX" } else { "XDP_REDIRECT" },
                    "XDP forwards from and to this uplink"
                );
            }
            Err(e) => tracing::warn!(
                interface = %iface,
                error = %e,
                "XDP forwarding could not take this uplink: what XDP translates here goes to the kernel's stack"
            ),
        }
    }

    /// Puts interface `index` in `XDP_FORWARD` (the kernel resolves it in the
    /// calling thread's network namespace), with `tx` also its `XDP_FORWARD_TX`
    /// key: frames forwarded back out of it go by `XDP_TX`, not `XDP_REDIRECT`.
    /// [`Datapath::attach_xdp`] does it for each uplink with `--xdp-forward`; the
    /// program tests call it themselves.
    pub fn forward_index(&mut self, index: u32, tx: bool) -> Result<(), KernelError> {
        let error = |e: aya::maps::xdp::XdpMapError| KernelError::XdpForward {
            index,
            reason: crate::error_chain(&e),
        };
        let mut map = self.forward_map()?;
        map.insert(index, index, None, 0).map_err(error)?;
        let tx_key = index | dataplane_common::XDP_FORWARD_TX;
        if tx {
            map.insert(tx_key, index, None, 0).map_err(error)?;
        } else {
            // Not there, or gone: either way not `XDP_TX`.
            let _ = map.remove(tx_key);
        }
        Ok(())
    }

    /// Takes uplink `iface` out of `XDP_FORWARD`, if it is there.
    fn stop_forwarding(&mut self, iface: &str) {
        let Some(index) = self.forwarding.remove(iface) else {
            return;
        };
        if let Ok(mut map) = self.forward_map() {
            // With the interface gone the kernel has removed its entries already.
            let _ = map.remove(index | dataplane_common::XDP_FORWARD_TX);
            let _ = map.remove(index);
        }
    }

    /// Uplinks the XDP program forwards between, by name, with their interface
    /// index.
    pub fn xdp_forwarding(&self) -> Vec<(String, u32)> {
        self.forwarding
            .iter()
            .map(|(name, index)| (name.clone(), *index))
            .collect()
    }

    /// Uplinks with the XDP program, and how.
    pub fn xdp_attached(&self) -> Vec<(String, XdpAttached)> {
        self.xdp_links
            .iter()
            .map(|(name, (_, how))| (name.clone(), *how))
            .collect()
    }

    /// Runs one packet (from the Ethernet header) through the XDP program with
    /// BPF_PROG_TEST_RUN. The verdict is XDP's (`XDP_DROP`, `XDP_PASS`); the packet
    /// as the program left it, without the metadata it put in front.
    pub fn test_run_xdp(&mut self, packet: &[u8]) -> Result<TestRunOutput, KernelError> {
        self.test_run_xdp_on(packet, 0)
    }

    /// [`Datapath::test_run_xdp`] as if the frame came in on interface `ifindex`
    /// of the calling thread's network namespace (0: none, the namespace's
    /// loopback), for its routes and neighbours in XDP forwarding's FIB lookup.
    pub fn test_run_xdp_on(
        &mut self,
        packet: &[u8],
        ifindex: u32,
    ) -> Result<TestRunOutput, KernelError> {
        self.load_xdp()?;
        let ctx_in = XdpMd {
            data_end: packet.len() as u32,
            ingress_ifindex: ifindex,
            ..XdpMd::default()
        };
        let mut ctx_out = XdpMd::default();
        let mut out = vec![0u8; packet.len() + 256];
        let result = self.xdp_loaded()?.test_run(TestRunOptions {
            data_in: Some(packet),
            data_out: Some(&mut out),
            ctx_in: Some(bytemuck::bytes_of(&ctx_in)),
            ctx_out: Some(bytemuck::bytes_of_mut(&mut ctx_out)),
            ..TestRunOptions::new()
        })?;
        out.truncate(result.data_size_out as usize);
        let meta = (ctx_out.data as usize).min(out.len());
        Ok(TestRunOutput {
            verdict: result.return_value as i32,
            packet: out.split_off(meta),
            duration: result.duration,
        })
    }
}

impl Datapath {
    /// Runs one packet `repeat` times through the XDP program (loaded first with
    /// [`Datapath::load_xdp`]) and returns the kernel-measured time per run. The runs share one frame, so the metadata the
    /// program puts in front grows until the kernel refuses more (32 bytes); the mark
    /// is then not written, which costs nothing more.
    pub fn time_run_xdp(
        &self,
        packet: &[u8],
        repeat: u32,
    ) -> Result<std::time::Duration, KernelError> {
        let ctx_in = XdpMd {
            data_end: packet.len() as u32,
            ..XdpMd::default()
        };
        let mut out = vec![0u8; packet.len() + 256];
        let result = self.xdp_loaded()?.test_run(TestRunOptions {
            data_in: Some(packet),
            data_out: Some(&mut out),
            ctx_in: Some(bytemuck::bytes_of(&ctx_in)),
            repeat,
            ..TestRunOptions::new()
        })?;
        Ok(result.duration)
    }
}

/// XDP verdicts as the program returns them.
pub const XDP_DROP: i32 = 1;
pub const XDP_PASS: i32 = 2;
pub const XDP_TX: i32 = 3;
pub const XDP_REDIRECT: i32 = 4;
