//! The rtnetlink socket the agent asks the kernel through where aya offers nothing:
//! one request and its whole answer ([`exchange`]), the attribute reader, and the
//! requests of `cleanup --all` (whether any TC filter, anyone's, is left under an
//! interface's clsact qdisc, and deleting that qdisc). `pod_links` sends its link and
//! route dumps through the same [`exchange`]. Requests in the calling thread's network
//! namespace.

use std::{
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

// include/uapi/linux/rtnetlink.h, netlink.h, pkt_sched.h.
const RTM_NEWQDISC: u16 = 36;
const RTM_DELQDISC: u16 = 37;
const RTM_GETQDISC: u16 = 38;
const RTM_NEWTFILTER: u16 = 44;
const RTM_GETTFILTER: u16 = 46;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
pub(super) const NLM_F_DUMP: u16 = 0x300;
const TCA_KIND: u16 = 1;
/// `TC_H_CLSACT`: the clsact qdisc's parent, and (its major) its handle.
const TC_H_CLSACT: u32 = 0xffff_fff1;
const CLSACT_HANDLE: u32 = 0xffff_0000;
/// `TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_INGRESS)` and `..._EGRESS`: where filters sit.
pub(super) const CLSACT_INGRESS: u32 = 0xffff_fff2;
pub(super) const CLSACT_EGRESS: u32 = 0xffff_fff3;
const NLMSG_HDR: usize = 16;
const TCMSG: usize = 20;

/// A request of `kind`: an `nlmsghdr` (`NLM_F_REQUEST` and `flags`, sequence 1, the
/// kernel as the destination) and then `body`.
pub(super) fn request(kind: u16, flags: u16, body: &[u8]) -> Vec<u8> {
    let len = NLMSG_HDR + body.len();
    let mut msg = Vec::with_capacity(len);
    msg.extend_from_slice(&(len as u32).to_ne_bytes());
    msg.extend_from_slice(&kind.to_ne_bytes());
    msg.extend_from_slice(&(NLM_F_REQUEST | flags).to_ne_bytes());
    msg.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    msg.extend_from_slice(&0u32.to_ne_bytes()); // port: the kernel's
    msg.extend_from_slice(body);
    msg
}

/// A TC request: a `tcmsg` (family, padding, ifindex, handle, parent, info) as the body.
fn tc_request(kind: u16, flags: u16, ifindex: u32, handle: u32, parent: u32) -> Vec<u8> {
    let mut tcmsg = Vec::with_capacity(TCMSG);
    tcmsg.extend_from_slice(&[libc::AF_UNSPEC as u8, 0, 0, 0]);
    tcmsg.extend_from_slice(&(ifindex as i32).to_ne_bytes());
    tcmsg.extend_from_slice(&handle.to_ne_bytes());
    tcmsg.extend_from_slice(&parent.to_ne_bytes());
    tcmsg.extend_from_slice(&0u32.to_ne_bytes());
    request(kind, flags, &tcmsg)
}

/// Sends `msg` on a new rtnetlink socket and returns every message of the answer
/// (type, payload after the header) up to `NLMSG_DONE` or the acknowledgement; an
/// error answer is the error.
pub(super) fn exchange(msg: &[u8]) -> io::Result<Vec<(u16, Vec<u8>)>> {
    // SAFETY: a plain socket(2) call; the descriptor is owned at once.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is new and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `msg` is a live buffer of its length; with no address the kernel is
    // the destination of a netlink socket.
    if unsafe { libc::send(fd.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // SAFETY: `buf` is a live, writable buffer of its length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(e);
        }
        let mut rest = &buf[..n as usize];
        while rest.len() >= NLMSG_HDR {
            let len = u32::from_ne_bytes(rest[0..4].try_into().expect("4 bytes")) as usize;
            let kind = u16::from_ne_bytes(rest[4..6].try_into().expect("2 bytes"));
            if len < NLMSG_HDR || len > rest.len() {
                return Err(io::Error::other("a truncated netlink message"));
            }
            let payload = &rest[NLMSG_HDR..len];
            match kind {
                NLMSG_DONE => return Ok(out),
                NLMSG_ERROR => {
                    let errno = payload
                        .get(0..4)
                        .map(|b| i32::from_ne_bytes(b.try_into().expect("4 bytes")))
                        .unwrap_or(0);
                    return match errno {
                        0 => Ok(out),
                        e => Err(io::Error::from_raw_os_error(-e)),
                    };
                }
                _ => out.push((kind, payload.to_vec())),
            }
            rest = &rest[len.next_multiple_of(4).min(rest.len())..];
        }
    }
}

/// How many TC filters (anyone's) are at `parent` ([`CLSACT_INGRESS`] or
/// [`CLSACT_EGRESS`]) of interface `ifindex`.
pub(super) fn filters_at(ifindex: u32, parent: u32) -> io::Result<usize> {
    let answer = exchange(&tc_request(RTM_GETTFILTER, NLM_F_DUMP, ifindex, 0, parent))?;
    Ok(answer.iter().filter(|(k, _)| *k == RTM_NEWTFILTER).count())
}

/// Whether interface `ifindex` has a clsact qdisc.
pub(super) fn has_clsact(ifindex: u32) -> io::Result<bool> {
    let answer = exchange(&tc_request(RTM_GETQDISC, NLM_F_DUMP, 0, 0, 0))?;
    Ok(answer.iter().any(|(kind, payload)| {
        *kind == RTM_NEWQDISC
            && payload.len() >= TCMSG
            && i32::from_ne_bytes(payload[4..8].try_into().expect("4 bytes")) == ifindex as i32
            && u32::from_ne_bytes(payload[12..16].try_into().expect("4 bytes")) == TC_H_CLSACT
            && attrs(&payload[TCMSG..])
                .find(|(t, _)| *t == TCA_KIND)
                .is_some_and(|(_, v)| v == b"clsact\0")
    }))
}

/// Deletes the clsact qdisc of interface `ifindex` (with whatever filters it holds).
pub(super) fn delete_clsact(ifindex: u32) -> io::Result<()> {
    exchange(&tc_request(
        RTM_DELQDISC,
        NLM_F_ACK,
        ifindex,
        CLSACT_HANDLE,
        TC_H_CLSACT,
    ))
    .map(drop)
}

/// The attributes (type without its flag bits, payload) of `attrs`, a run of
/// `rtattr`s, up to the first malformed one.
pub(super) fn attrs(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([buf[0], buf[1]]) as usize;
        let kind = u16::from_ne_bytes([buf[2], buf[3]]) & 0x3fff;
        if len < 4 || len > buf.len() {
            return None;
        }
        let value = &buf[4..len];
        buf = &buf[len.next_multiple_of(4).min(buf.len())..];
        Some((kind, value))
    })
}
