//! XDP forwarding (`--xdp-forward`): a frame the XDP program translated for a
//! backend on another node (DNAT, masquerade, a later packet of such a connection)
//! or back to its client (reverse NAT) is sent from XDP, never entering the
//! kernel's stack. The kernel's FIB names the next hop (`bpf_fib_lookup`, the
//! route and neighbour tables the stack would use, its policy rules included); the
//! frame gets the next hop's and the egress interface's MAC addresses and its TTL
//! (IPv4, with the header checksum updated as `ip_decrease_ttl` does it) or hop limit
//! (IPv6) lowered by one, so its bytes are those the stack would have sent, and goes
//! out with `XDP_TX` (the interface it came in on, where its driver sends `XDP_TX`
//! frames: not a veth, see `XDP_FORWARD_TX`) or `XDP_REDIRECT` through `XDP_FORWARD`
//! (another uplink, or the same veth).
//!
//! Only between interfaces in `XDP_FORWARD` (the agent puts there the uplinks it
//! attached the XDP program to, with `--xdp-forward`): an ingress interface not in it
//! does nothing here. Whatever the XDP program cannot finish it passes to the stack
//! exactly as without forwarding, untouched by this file, and counts why: no
//! neighbour entry yet (`xdp_pass_no_neigh`; the stack resolves it, and later frames
//! go by XDP), any other FIB answer (`xdp_pass_fib`), a frame over the route's MTU
//! (`xdp_pass_mtu`), TTL or hop limit 1 or less (`xdp_pass_ttl`: the stack answers
//! "time exceeded"), fragments, IPv4 options and IPv6 extension headers
//! (`xdp_pass_stack`), and a route out of an interface XDP does not forward to, a
//! pod's above all (`xdp_pass_egress`). ICMP errors, SCTP and the rest the XDP
//! program leaves to TC never get here.
//!
//! Everything inlined into the XDP programs (a called function beside their tail
//! call would cap every frame at 256 bytes on the verifier), the FIB's 64 bytes in a
//! per-CPU map (`FIB_PARAMS`), not on the stack.

use aya_ebpf::{
    bindings::{
        bpf_fib_lookup as FibParams,
        xdp_action::{XDP_DROP, XDP_PASS, XDP_TX},
        BPF_FIB_LKUP_RET_FRAG_NEEDED, BPF_FIB_LKUP_RET_NO_NEIGH, BPF_FIB_LKUP_RET_SUCCESS,
    },
    helpers::bpf_fib_lookup,
    programs::XdpContext,
};
use dataplane_common::{stat, PROTO_TCP, PROTO_UDP, XDP_FORWARD_TX};

use crate::{
    counters::Exit,
    maps,
    packet::{ipv4, ipv6, load, store, ETH_LEN},
};

/// `AF_INET` and `AF_INET6`, the FIB lookup's families.
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;
/// The IPv4 header's TTL, and IPv6's hop limit (RFC 791, RFC 8200 3).
const IPV4_TTL: usize = 8;
const IPV6_HOP_LIMIT: usize = 7;
/// IPv4's version 4 with a header of 5 words: no options.
const IPV4_NO_OPTIONS: u8 = 0x45;
/// The flow label and traffic class of IPv6's first word, as the FIB takes them
/// (`IPV6_FLOWINFO_MASK`).
const IPV6_FLOWINFO_MASK: u32 = 0x0fff_ffff;

/// Whether an exit of the XDP body is a translated frame that forwarding may send:
/// DNAT (new, established, masqueraded, remapped) or reverse NAT.
#[inline(always)]
pub fn translated(reason: u32) -> bool {
    matches!(
        reason,
        stat::DNAT_NEW
            | stat::DNAT_ESTABLISHED
            | stat::DNAT_MASQUERADED
            | stat::DNAT_PORT_REMAPPED
            | stat::REVNAT
    )
}

/// The frame's ingress interface, if XDP forwards from it.
#[inline(always)]
fn ingress(ctx: &XdpContext) -> Option<u32> {
    let ifindex = ctx.ingress_ifindex() as u32;
    maps::XDP_FORWARD.get_ifindex(ifindex)?;
    Some(ifindex)
}

/// The FIB's parameters, off the stack.
#[inline(always)]
fn params() -> Option<&'static mut FibParams> {
    let p = maps::FIB_PARAMS.get_ptr_mut(0)?;
    // SAFETY: a per-CPU map value, used only by this program on this CPU while it
    // runs (XDP programs are not preempted); no reference outlives the run.
    Some(unsafe { &mut *p })
}

/// Sends IPv4 frame `ctx`, translated already, from XDP. `None`: XDP does not
/// forward from this interface (the caller passes the frame as always); else the
/// action and the `stat` slot that says why, the frame untouched if the action is
/// `XDP_PASS`.
#[inline(always)]
pub fn forward4(ctx: &XdpContext) -> Option<Exit> {
    let ifindex = ingress(ctx)?;
    let ip = ETH_LEN;
    // One load, checked, at a time: a tuple of them lets the compiler read a
    // register no path set, which the verifier refuses.
    let Some(vihl) = load::<u8>(ctx, ip + ipv4::VERSION_IHL) else {
        return Some(pass(stat::XDP_PASS_STACK));
    };
    if vihl != IPV4_NO_OPTIONS {
        return Some(pass(stat::XDP_PASS_STACK));
    }
    let Some(frag) = load::<[u8; 2]>(ctx, ip + ipv4::FLAGS_FRAG) else {
        return Some(pass(stat::XDP_PASS_STACK));
    };
    if u16::from_be_bytes(frag) & (ipv4::FLAG_MF | ipv4::FRAG_OFFSET_MASK) != 0 {
        return Some(pass(stat::XDP_PASS_STACK));
    }
    let Some(ttl) = load::<u8>(ctx, ip + IPV4_TTL) else {
        return Some(pass(stat::XDP_PASS_STACK));
    };
    if ttl <= 1 {
        return Some(pass(stat::XDP_PASS_TTL));
    }
    let Some(head) = load::<[u8; 4]>(ctx, ip) else {
        return Some(pass(stat::XDP_PASS_STACK));
    };
    let Some(proto) = load::<u8>(ctx, ip + ipv4::PROTO) else {
        return Some(pass(stat::XDP_PASS_STACK));
    };
    let Some(src) = load::<u32>(ctx, ip + ipv4::SRC) else {
        return Some(pass(stat::XDP_PASS_STACK));
    };
    let Some(dst) = load::<u32>(ctx, ip + ipv4::DST) else {
        return Some(pass(stat::XDP_PASS_STACK));
    };
    let Some(ports) = load::<[u16; 2]>(ctx, ip + ipv4::MIN_LEN) else {
        return Some(pass(stat::XDP_PASS_STACK));
    };
    let Some(p) = params() else {
        return Some(pass(stat::XDP_PASS_FIB));
    };
    p.family = AF_INET;
    p.l4_protocol = proto;
    // Read as they lie in the packet: network byte order, as the FIB wants them.
    p.sport = ports[0];
    p.dport = ports[1];
    // Version and header length, TOS, total length.
    p.__bindgen_anon_1.tot_len = u16::from_be_bytes([head[2], head[3]]);
    p.ifindex = ifindex;
    p.__bindgen_anon_2.rt_metric = 0;
    p.__bindgen_anon_2.tos = head[1];
    p.__bindgen_anon_3.ipv6_src = [0; 4];
    p.__bindgen_anon_3.ipv4_src = src;
    p.__bindgen_anon_4.ipv6_dst = [0; 4];
    p.__bindgen_anon_4.ipv4_dst = dst;
    let action = match lookup(ctx, p, ifindex) {
        Ok(action) => action,
        Err(reason) => return Some(pass(reason)),
    };
    // The TTL and the header checksum as `ip_decrease_ttl` sets them
    // (https://github.com/torvalds/linux/blob/v6.18/include/net/ip.h): the checksum
    // as it lies in memory plus `htons(0x0100)`, the carry folded back; on this
    // little-endian target that is 0x0001 added to the little-endian read.
    let Some(check) = load::<[u8; 2]>(ctx, ip + ipv4::CSUM) else {
        return Some((XDP_DROP as i32, stat::DROP_REWRITE));
    };
    let check = u16::from_le_bytes(check) as u32 + 0x0001;
    let check = (check + (check >= 0xffff) as u32) as u16;
    if store(ctx, ip + IPV4_TTL, ttl - 1).is_none()
        || store(ctx, ip + ipv4::CSUM, check.to_le_bytes()).is_none()
        || macs(ctx, p).is_none()
    {
        return Some((XDP_DROP as i32, stat::DROP_REWRITE));
    }
    Some(action)
}

/// [`forward4`] for an IPv6 frame (`sliceway_xdp6`): TCP and UDP straight after
/// the fixed header; anything with extension headers goes to the stack.
#[inline(always)]
pub fn forward6(ctx: &XdpContext) -> Option<Exit> {
    let ifindex = ingress(ctx)?;
    let ip = ETH_LEN;
    // One load, checked, at a time (see `forward4`).
    let Some(next) = load::<u8>(ctx, ip + ipv6::NEXT) else {
        return Some(pass(stat::XDP_PASS_STACK));
    };
    if next != PROTO_TCP && next != PROTO_UDP {
        return Some(pass(stat::XDP_PASS_STACK));
    }
    let Some(hops) = load::<u8>(ctx, ip + IPV6_HOP_LIMIT) else {
        return Some(pass(stat::XDP_PASS_STACK));
    };
    if hops <= 1 {
        return Some(pass(stat::XDP_PASS_TTL));
    }
    let Some(first) = load::<[u8; 4]>(ctx, ip) else {
        return Some(pass(stat::XDP_PASS_STACK));
    };
    let Some(payload) = load::<[u8; 2]>(ctx, ip + ipv6::PAYLOAD_LEN) else {
        return Some(pass(stat::XDP_PASS_STACK));
    };
    let Some(ports) = load::<[u16; 2]>(ctx, ip + ipv6::LEN) else {
        return Some(pass(stat::XDP_PASS_STACK));
    };
    let Some(p) = params() else {
        return Some(pass(stat::XDP_PASS_FIB));
    };
    // The addresses straight into the map value, word by word: no copy on the stack.
    for i in 0..4 {
        let Some(src) = load::<u32>(ctx, ip + ipv6::SRC + 4 * i) else {
            return Some(pass(stat::XDP_PASS_STACK));
        };
        let Some(dst) = load::<u32>(ctx, ip + ipv6::DST + 4 * i) else {
            return Some(pass(stat::XDP_PASS_STACK));
        };
        // SAFETY: plain writes of a union's integer fields.
        unsafe {
            p.__bindgen_anon_3.ipv6_src[i] = src;
            p.__bindgen_anon_4.ipv6_dst[i] = dst;
        }
    }
    p.family = AF_INET6;
    p.l4_protocol = next;
    p.sport = ports[0];
    p.dport = ports[1];
    p.__bindgen_anon_1.tot_len = u16::from_be_bytes(payload).saturating_add(ipv6::LEN as u16);
    p.ifindex = ifindex;
    // Network byte order, as it lies in the packet.
    p.__bindgen_anon_2.flowinfo = u32::from_ne_bytes(first) & IPV6_FLOWINFO_MASK.to_be();
    let action = match lookup(ctx, p, ifindex) {
        Ok(action) => action,
        Err(reason) => return Some(pass(reason)),
    };
    if store(ctx, ip + IPV6_HOP_LIMIT, hops - 1).is_none() || macs(ctx, p).is_none() {
        return Some((XDP_DROP as i32, stat::DROP_REWRITE));
    }
    Some(action)
}

/// An untouched frame for the stack, counted `reason`.
#[inline(always)]
fn pass(reason: u32) -> Exit {
    (XDP_PASS as i32, reason)
}

/// The FIB lookup and the way out: `XDP_TX` or `XDP_REDIRECT` (the redirect set
/// up already), the frame still to be rewritten; `Err`: why not, the frame
/// untouched.
#[inline(always)]
fn lookup(ctx: &XdpContext, p: &mut FibParams, ifindex: u32) -> Result<Exit, u32> {
    // SAFETY: `p` is a map value of exactly `bpf_fib_lookup`'s size; the helper
    // reads and writes it only.
    let rc = unsafe {
        bpf_fib_lookup(
            ctx.ctx as *mut _,
            p as *mut FibParams,
            core::mem::size_of::<FibParams>() as i32,
            0,
        )
    };
    if rc != BPF_FIB_LKUP_RET_SUCCESS as i64 {
        return Err(if rc == BPF_FIB_LKUP_RET_NO_NEIGH as i64 {
            stat::XDP_PASS_NO_NEIGH
        } else if rc == BPF_FIB_LKUP_RET_FRAG_NEEDED as i64 {
            stat::XDP_PASS_MTU
        } else {
            // Blackhole, unreachable, prohibit, not forwarded (a local address),
            // forwarding disabled, a tunnel route, no source address, or a helper
            // error (negative).
            stat::XDP_PASS_FIB
        });
    }
    let egress = p.ifindex;
    let back = egress == ifindex;
    if back
        && maps::XDP_FORWARD
            .get_ifindex(ifindex | XDP_FORWARD_TX)
            .is_some()
    {
        return Ok((XDP_TX as i32, stat::XDP_TX));
    }
    // Set up before the frame is changed: an interface gone from the map (the
    // agent took it out since) leaves the frame untouched, for the stack. Back
    // out of the same interface where `XDP_TX` does not work there (a veth).
    match maps::XDP_FORWARD.redirect(egress, 0) {
        Ok(action) if back => Ok((action as i32, stat::XDP_TX)),
        Ok(action) => Ok((action as i32, stat::XDP_REDIRECT)),
        Err(_) => Err(stat::XDP_PASS_EGRESS),
    }
}

/// Writes the FIB's next hop MAC as the destination and the egress interface's as
/// the source.
#[inline(always)]
fn macs(ctx: &XdpContext, p: &FibParams) -> Option<()> {
    store(ctx, 0, p.dmac)?;
    store(ctx, 6, p.smac)
}
