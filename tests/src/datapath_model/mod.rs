//! A reference model of the TC datapath in plain Rust, for the differential fuzzer
//! (`crate::fuzz`): what `sliceway_tc` (and `sliceway_reject`, which it hands
//! rejects to) must do with one Ethernet frame, given the service maps the agent
//! wrote and the conntrack, fragment and session-affinity tables the program keeps.
//!
//! Written from the specification (issue 13, README's "Connection tracking", the
//! ARCHITECTURE invariants, the map layouts of `dataplane-common`, kube-proxy's
//! semantics), not from the kernel code: it works on a byte copy of the frame, keeps
//! its tables in ordinary hash maps, and updates checksums with the RFC 1624
//! arithmetic of `checksum`, so an error in the kernel's helpers or offsets shows up
//! as a difference.
//!
//! The model is a pure function: [`step`] takes the tables and a time and returns
//! the verdict, the exit reason, the frame as it must leave, and the table writes;
//! [`Tables::apply`] applies the writes. The fuzzer evaluates a packet at the times
//! before and after the kernel ran it, so an idle timeout that ends while the
//! kernel runs is never a false difference.
//!
//! Policy, in the order a frame meets it:
//! - neither IPv4 nor IPv6 (ARP, a VLAN tag): passed untouched (`pass_not_ipv4`);
//!   behind IPv6's EtherType, a version other than 6 is malformed, dropped (by the
//!   IPv6 programs; the fuzzer relabels IPv4 packets only, so that is all the model
//!   takes of IPv6, whose paths have program fixtures of their own); the
//!   Ethernet header or the fixed IPv4 header cut short, a version other than 4, an
//!   IHL under 5 words or an IP total length shorter than the header: malformed,
//!   dropped;
//! - other IP protocols than TCP, UDP and ICMP: passed untouched (`pass_not_l4`);
//! - ICMP: only unfragmented destination-unreachable and time-exceeded errors that
//!   quote (with a plain 20-byte header and at least 8 bytes of L4 header inside the
//!   datagram) a packet of a live connection are translated back; all other ICMP
//!   passes untouched;
//! - a later fragment takes the ports its first fragment recorded, or is dropped as
//!   an orphan; it is translated by addresses only;
//! - a first fragment or whole datagram needs its L4 header (20 bytes of TCP, 8 of
//!   UDP) inside both the datagram and the frame, or it is malformed;
//! - then conntrack (a live connection's packets, either way: DNAT or reverse NAT,
//!   before any frontend, as netfilter's conntrack comes before its NAT), the
//!   frontend lookup and the backend pick, REJECT, as `step` spells out;
//! - a new connection to an external address of a Service with
//!   `externalTrafficPolicy: Cluster` (`SVC_F_MASQ_PODS`) is masqueraded to the
//!   node's address and a free port of its range (kube-proxy's external chain
//!   masquerades pods too), dropped when none of its tries is free.
//!
//! SCTP (RFC 9260): an INIT starts an association, ABORT and SHUTDOWN COMPLETE end
//! it; addresses are translated as for TCP and UDP (SCTP's CRC32c covers no
//! address), ports under the CRC, which changes by the CRC of the ports' difference
//! (the CRC is linear); a CRC field of zero (one the kernel has yet to compute) stays
//! zero; a first fragment whose ports change cannot have its CRC updated and is
//! dropped (`drop_rewrite`). An ICMP error quoting SCTP leaves the quoted CRC as it
//! is (it covers bytes the quote does not hold).

pub mod checksum;

use std::collections::HashMap;

use dataplane_common::{
    ct::{self, flag, state},
    flow_hash, stat, AffinityKey, AffinityValue, Backend, CtEntry, CtKey, FragKey, FragPorts,
    NatConfig, ServiceKey, ServiceValue, SlotKey, CT_FORWARD, CT_REVERSE, PROTO_ICMP, PROTO_SCTP,
    PROTO_TCP, PROTO_UDP, SVC_F_AFFINITY, SVC_F_DROP_EMPTY, SVC_F_MASQ_PODS,
};

use checksum::Checksum;

pub const ETH: usize = 14;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const TCP_FIN: u8 = 0x01;
const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
const TCP_ACK: u8 = 0x10;
/// SCTP (RFC 9260): the common header and the first chunk's type, flags and length;
/// an INIT starts an association, ABORT and SHUTDOWN COMPLETE end one.
const SCTP_MIN: usize = 16;
const SCTP_INIT: u8 = 1;
const SCTP_ABORT: u8 = 6;
const SCTP_SHUTDOWN_COMPLETE: u8 = 14;
/// How many source ports a new connection whose reply tuple is taken tries, and
/// where they come from: `1024 + (hash + i * 7919) % 64512` for the i-th try
/// (netfilter's NAT likewise searches the unprivileged range on a clash).
const REMAP_TRIES: u32 = 8;
const REMAP_PORT_MIN: u32 = 1024;
/// An ICMP error quotes at most what fits in 576 bytes (RFC 1812 4.3.2.3).
const REJECT_QUOTE_MAX: usize = 576 - 20 - 8;
/// A masqueraded connection's source port: the i-th of 16 tries is
/// `min + (hash + i * 0x9e3779b1) % (max - min + 1)` of `NAT_CONFIG`'s range, the
/// first no live connection holds; none free drops (`drop_snat_exhausted`).
const SNAT_TRIES: u32 = 16;
const SNAT_STEP: u32 = 0x9e37_79b1;

/// The service maps as the agent wrote them, and the idle timeouts.
#[derive(Clone, Debug, Default)]
pub struct Maps {
    pub services: HashMap<ServiceKey, ServiceValue>,
    pub slots: HashMap<SlotKey, u32>,
    pub backends: HashMap<u32, Backend>,
    /// `CT_TIMEOUTS`: seconds by state, zero for the default.
    pub timeouts: [u64; state::COUNT as usize],
    /// `NAT_CONFIG`: the node's address and masquerade ports; `None`, none known.
    pub nat: Option<NatConfig>,
}

impl Maps {
    /// The idle timeout of `state` in seconds.
    pub fn timeout(&self, s: u8) -> u64 {
        match self.timeouts.get(s as usize) {
            Some(&t) if t != 0 => t,
            Some(_) => ct::DEFAULTS[s as usize],
            None => 0,
        }
    }
}

/// The tables the program writes.
#[derive(Clone, Debug, Default)]
pub struct Tables {
    pub conntrack: HashMap<CtKey, CtEntry>,
    pub fragments: HashMap<FragKey, FragPorts>,
    pub affinity: HashMap<AffinityKey, AffinityValue>,
}

/// One write to a table, in the order the program makes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    Ct(CtKey, Option<CtEntry>),
    Fragment(FragKey, FragPorts),
    Affinity(AffinityKey, AffinityValue),
}

impl Tables {
    pub fn apply(&mut self, writes: &[Write]) {
        for w in writes {
            match w {
                Write::Ct(k, Some(e)) => {
                    self.conntrack.insert(*k, *e);
                }
                Write::Ct(k, None) => {
                    self.conntrack.remove(k);
                }
                Write::Fragment(k, v) => {
                    self.fragments.insert(*k, *v);
                }
                Write::Affinity(k, v) => {
                    self.affinity.insert(*k, *v);
                }
            }
        }
    }
}

/// The TC verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// `TC_ACT_OK`: on its way, as `packet` says.
    Pass,
    /// `TC_ACT_SHOT`.
    Drop,
    /// `TC_ACT_REDIRECT`: a reply the program made, back out of the interface.
    Redirect,
}

/// What must come of one frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub verdict: Verdict,
    /// The `stat` slot counted.
    pub reason: u32,
    /// The frame as it leaves (`None` when dropped: the program may leave anything).
    pub packet: Option<Vec<u8>>,
    /// Offsets of checksum fields in `packet` whose value may be either
    /// representation of one's complement zero (0x0000 or 0xffff): both verify.
    pub loose_checksums: Vec<usize>,
    pub writes: Vec<Write>,
}

/// A packet's connection tuple and what the decisions need, network byte order as
/// the maps hold it.
#[derive(Clone, Copy, Debug)]
struct Flow {
    src: u32,
    dst: u32,
    sport: u16,
    dport: u16,
    proto: u8,
    l4: usize,
    /// TCP flags; for SCTP, RST when the first chunk ends the association.
    tcp_flags: u8,
    /// A TCP SYN without ACK, an SCTP INIT: the first packet of a connection.
    starts: bool,
    udp_no_csum: bool,
    later_fragment: bool,
}

impl Flow {
    fn key(&self) -> CtKey {
        CtKey::v4(self.src, self.dst, self.sport, self.dport, self.proto)
    }
    fn syn_only(&self) -> bool {
        self.starts
    }
    fn hash(&self) -> u32 {
        flow_hash(self.src, self.dst, self.sport, self.dport, self.proto)
    }
}

/// The tables as seen during one step: the committed ones with the step's writes
/// on top.
struct View<'a> {
    tables: &'a Tables,
    writes: Vec<Write>,
}

impl View<'_> {
    fn ct(&self, key: &CtKey) -> Option<CtEntry> {
        for w in self.writes.iter().rev() {
            if let Write::Ct(k, e) = w {
                if k == key {
                    return *e;
                }
            }
        }
        self.tables.conntrack.get(key).copied()
    }
    fn fragment(&self, key: &FragKey) -> Option<FragPorts> {
        for w in self.writes.iter().rev() {
            if let Write::Fragment(k, v) = w {
                if k == key {
                    return Some(*v);
                }
            }
        }
        self.tables.fragments.get(key).copied()
    }
    fn affinity(&self, key: &AffinityKey) -> Option<AffinityValue> {
        for w in self.writes.iter().rev() {
            if let Write::Affinity(k, v) = w {
                if k == key {
                    return Some(*v);
                }
            }
        }
        self.tables.affinity.get(key).copied()
    }
    fn put(&mut self, key: CtKey, entry: CtEntry) {
        self.writes.push(Write::Ct(key, Some(entry)));
    }
    fn remove(&mut self, key: CtKey) {
        if self.ct(&key).is_some() {
            self.writes.push(Write::Ct(key, None));
        }
    }
}

fn be16(p: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([p[at], p[at + 1]])
}

/// A field as the maps hold it: the packet's bytes read in native order.
fn ne16(p: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([p[at], p[at + 1]])
}
fn ne32(p: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([p[at], p[at + 1], p[at + 2], p[at + 3]])
}

/// Runs one frame through the model at time `now` (CLOCK_MONOTONIC nanoseconds).
pub fn step(maps: &Maps, tables: &Tables, frame: &[u8], now: u64) -> Outcome {
    let mut m = Machine {
        maps,
        view: View {
            tables,
            writes: Vec::new(),
        },
        out: frame.to_vec(),
        loose: Vec::new(),
        now,
    };
    let (verdict, reason) = m.run(frame);
    let packet = match verdict {
        Verdict::Drop => None,
        _ => Some(m.out),
    };
    Outcome {
        verdict,
        reason,
        packet,
        loose_checksums: m.loose,
        writes: m.view.writes,
    }
}

struct Machine<'a> {
    maps: &'a Maps,
    view: View<'a>,
    out: Vec<u8>,
    loose: Vec<usize>,
    now: u64,
}

type Exit = (Verdict, u32);
const PASS: Verdict = Verdict::Pass;
const DROP: Verdict = Verdict::Drop;

impl Machine<'_> {
    fn run(&mut self, p: &[u8]) -> Exit {
        if p.len() < ETH {
            return (DROP, stat::DROP_MALFORMED);
        }
        if be16(p, 12) == ETH_P_IPV6 {
            if p.len() < ETH + 8 {
                return (DROP, stat::DROP_MALFORMED);
            }
            assert!(
                p[ETH] >> 4 != 6,
                "the model takes no IPv6 packet (the fuzzer makes none)"
            );
            return (DROP, stat::DROP_MALFORMED);
        }
        if be16(p, 12) != ETH_P_IP {
            return (PASS, stat::PASS_NOT_IPV4);
        }
        if p.len() < ETH + 20 {
            return (DROP, stat::DROP_MALFORMED);
        }
        let ip = &p[ETH..];
        let ihl = (ip[0] & 0x0f) as usize * 4;
        if ip[0] >> 4 != 4 || ihl < 20 {
            return (DROP, stat::DROP_MALFORMED);
        }
        let proto = ip[9];
        if ![PROTO_TCP, PROTO_UDP, PROTO_SCTP, PROTO_ICMP].contains(&proto) {
            return (PASS, stat::PASS_NOT_L4);
        }
        let total = be16(ip, 2) as usize;
        if total < ihl {
            return (DROP, stat::DROP_MALFORMED);
        }
        let frag = be16(ip, 6);
        let offset = frag & 0x1fff;
        let more = frag & 0x2000 != 0;
        let l4 = ETH + ihl;
        if proto == PROTO_ICMP {
            if offset != 0 || more {
                return (PASS, stat::PASS_NOT_L4);
            }
            return self.icmp(p, l4, ETH + total);
        }
        let frag_key = FragKey {
            src_be: ne32(p, ETH + 12),
            dst_be: ne32(p, ETH + 16),
            id_be: ne16(p, ETH + 4),
            proto,
            _pad: 0,
        };
        let flow = if offset != 0 {
            let Some(ports) = self.view.fragment(&frag_key) else {
                return (DROP, stat::DROP_FRAGMENT_ORPHAN);
            };
            Flow {
                src: frag_key.src_be,
                dst: frag_key.dst_be,
                sport: ports.sport_be,
                dport: ports.dport_be,
                proto,
                l4,
                tcp_flags: 0,
                starts: false,
                udp_no_csum: false,
                later_fragment: true,
            }
        } else {
            let need = match proto {
                PROTO_TCP => 20,
                PROTO_SCTP => SCTP_MIN,
                _ => 8,
            };
            if total < ihl + need || p.len() < l4 + need {
                return (DROP, stat::DROP_MALFORMED);
            }
            let flow = Flow {
                src: frag_key.src_be,
                dst: frag_key.dst_be,
                sport: ne16(p, l4),
                dport: ne16(p, l4 + 2),
                proto,
                l4,
                tcp_flags: match proto {
                    PROTO_TCP => p[l4 + 13],
                    PROTO_SCTP if [SCTP_ABORT, SCTP_SHUTDOWN_COMPLETE].contains(&p[l4 + 12]) => {
                        TCP_RST
                    }
                    _ => 0,
                },
                starts: match proto {
                    PROTO_TCP => p[l4 + 13] & (TCP_SYN | TCP_ACK) == TCP_SYN,
                    PROTO_SCTP => p[l4 + 12] == SCTP_INIT,
                    _ => false,
                },
                udp_no_csum: proto == PROTO_UDP && be16(p, l4 + 6) == 0,
                later_fragment: false,
            };
            if more {
                self.view.writes.push(Write::Fragment(
                    frag_key,
                    FragPorts {
                        sport_be: flow.sport,
                        dport_be: flow.dport,
                    },
                ));
            }
            flow
        };
        // Conntrack before the frontends, as netfilter's NAT sees only new
        // connections: a reply of a live connection is one whatever its destination.
        let mut stale = false;
        if let Some(exit) = self.reply_side(p, &flow, &mut stale) {
            return exit;
        }
        if let Some(exit) = self.client_side(p, &flow) {
            return exit;
        }
        self.other_side(p, &flow, stale)
    }

    fn alive(&self, e: &CtEntry) -> bool {
        ct::alive(e.last_seen_ns, self.now, self.maps.timeout(e.state))
    }

    /// A packet from a client: a live forward entry keeps its backend (a TCP SYN
    /// without ACK starts anew; a UDP flow whose backend id no longer holds its
    /// backend moves on); else a frontend picks one. `None`: neither.
    fn client_side(&mut self, p: &[u8], flow: &Flow) -> Option<Exit> {
        let key = flow.key();
        let tracked = self.view.ct(&key).filter(|e| {
            e.dir == CT_FORWARD
                && self.alive(e)
                && !flow.syn_only()
                && (flow.proto != PROTO_UDP
                    || self.maps.backends.get(&e.backend_id).is_some_and(|b| {
                        b.addr_be == e.pair.src_be[0] && b.port_be == e.pair.sport_be
                    }))
        });
        let (entry, reason) = match tracked {
            Some(mut e) => {
                let (s, seen) = next_state(flow.proto, e.flags, flow.tcp_flags, true);
                e.state = s;
                e.flags = seen;
                e.last_seen_ns = self.now;
                self.view.put(key, e);
                let reason = if flow.later_fragment {
                    stat::NAT_FRAGMENT
                } else {
                    stat::DNAT_ESTABLISHED
                };
                (e, reason)
            }
            None => {
                let svc = *self.maps.services.get(&ServiceKey {
                    addr_be: flow.dst,
                    port_be: flow.dport,
                    proto: flow.proto,
                    scope: 0,
                })?;
                if flow.later_fragment {
                    return Some((DROP, stat::DROP_FRAGMENT_ORPHAN));
                }
                if svc.count == 0 {
                    if svc.flags & SVC_F_DROP_EMPTY != 0 {
                        return Some((DROP, stat::DROP_NO_BACKEND));
                    }
                    return Some(self.reject(p, flow, stat::REJECT_NO_BACKEND));
                }
                let (backend_id, backend) = match self.pick(flow, &svc) {
                    Ok(b) => b,
                    Err(exit) => return Some(exit),
                };
                // An external address of a `Cluster` policy: the pod is
                // masqueraded to the node's address.
                let masquerade = svc.flags & SVC_F_MASQ_PODS != 0;
                match self.track(flow, &key, svc.id, backend_id, &backend, masquerade) {
                    Ok(reason) => {
                        let e = self.view.ct(&key).expect("just written");
                        (e, reason)
                    }
                    Err(exit) => return Some(exit),
                }
            }
        };
        let to = entry.pair;
        self.set_addr(flow, false, to.src_be[0]);
        // A hairpin connection: the pod sees itself reached from the hairpin address.
        if to.dst_be[0] != flow.src {
            self.set_addr(flow, true, to.dst_be[0]);
        }
        if flow.proto == PROTO_SCTP && !flow.later_fragment {
            return Some(self.sctp_ports(p, flow, to.dport_be, to.sport_be, reason));
        }
        if !flow.later_fragment {
            self.set_port(flow, false, flow.dport, to.sport_be);
            if to.dport_be != flow.sport {
                self.set_port(flow, true, flow.sport, to.dport_be);
            }
        }
        Some((PASS, reason))
    }

    /// Session affinity's backend if fresh and still in its slot, else the flow
    /// hash's slot; with affinity the choice is remembered.
    fn pick(&mut self, flow: &Flow, svc: &ServiceValue) -> Result<(u32, Backend), Exit> {
        let sticky = svc.flags & SVC_F_AFFINITY != 0;
        let akey = AffinityKey {
            client: [flow.src, 0, 0, 0],
            service_id: svc.id,
        };
        let remembered = if sticky {
            self.view.affinity(&akey).and_then(|a| {
                let fresh =
                    self.now.saturating_sub(a.last_ns) < svc.affinity_timeout_s as u64 * ct::NS;
                let still = a.slot < svc.count
                    && self.maps.slots.get(&SlotKey {
                        service_id: svc.id,
                        slot: a.slot,
                    }) == Some(&a.backend_id);
                (fresh && still).then_some((a.slot, a.backend_id))
            })
        } else {
            None
        };
        let (slot, id) = match remembered {
            Some(found) => found,
            None => {
                let slot = flow.hash() % svc.count;
                let id = *self
                    .maps
                    .slots
                    .get(&SlotKey {
                        service_id: svc.id,
                        slot,
                    })
                    .ok_or((DROP, stat::DROP_MISSING_BACKEND))?;
                (slot, id)
            }
        };
        let backend = *self
            .maps
            .backends
            .get(&id)
            .ok_or((DROP, stat::DROP_MISSING_BACKEND))?;
        if sticky {
            self.view.writes.push(Write::Affinity(
                akey,
                AffinityValue {
                    backend_id: id,
                    slot,
                    last_ns: self.now,
                },
            ));
        }
        Ok((id, backend))
    }

    /// The first of `tries` ports `first + (hash + i * step) % span` that makes `reply`
    /// (with that port as its destination port) a tuple no other connection holds; only
    /// the client's own tuple (`key`) is taken over, never a candidate's. The kernel's
    /// masquerade and remap probe in this order.
    #[allow(clippy::too_many_arguments)]
    fn free_port(
        &mut self,
        reply: &CtKey,
        key: &CtKey,
        hash: u32,
        first: u32,
        span: u32,
        tries: u32,
        step: u32,
    ) -> Option<CtKey> {
        (0..tries).find_map(|i| {
            let port = (first + hash.wrapping_add(i.wrapping_mul(step)) % span) as u16;
            let candidate = CtKey {
                dport_be: port.to_be(),
                ..*reply
            };
            (!self.reply_taken(&candidate, key, false)).then_some(candidate)
        })
    }

    /// Whether `reply` is the reverse key of a live connection other than `key`'s.
    /// With `take_closing` (a new connection's TCP SYN, on its own tuple), a holder in
    /// TIME_WAIT or CLOSE gives the tuple up: its forward entry goes and the tuple is
    /// free (netfilter's `nf_nat_used_tuple_harder` evicts such a holder).
    fn reply_taken(&mut self, reply: &CtKey, key: &CtKey, take_closing: bool) -> bool {
        let Some(rev) = self.view.ct(reply) else {
            return false;
        };
        if rev.dir != CT_REVERSE || rev.pair == *key {
            return false;
        }
        let Some(f) = self
            .view
            .ct(&rev.pair)
            .filter(|f| f.dir == CT_FORWARD && f.pair == *reply && self.alive(f))
        else {
            return false;
        };
        let closing = f.state == state::TCP_TIME_WAIT || f.state == state::TCP_CLOSE;
        if closing && take_closing {
            self.view.remove(rev.pair);
            return false;
        }
        true
    }

    /// A new connection: two entries that name each other; the reply tuple gets a
    /// source port of its own when a live connection holds it, or, with
    /// `masquerade`, the node's address and a port of its range (a backend at the
    /// node's own address keeps the client's tuple, and a live holder of it drops).
    /// `Ok(reason)`: `dnat_new`, `dnat_port_remapped` or `dnat_masqueraded`.
    fn track(
        &mut self,
        flow: &Flow,
        key: &CtKey,
        service_id: u32,
        backend_id: u32,
        backend: &Backend,
        masquerade: bool,
    ) -> Result<u32, Exit> {
        let previous = self
            .view
            .ct(key)
            .filter(|e| e.dir == CT_FORWARD)
            .map(|e| e.pair);
        // A pod that reaches its own Service and gets itself as the backend: the
        // connection comes from the hairpin address.
        let client = if backend.addr_be == flow.src {
            dataplane_common::HAIRPIN_ADDR_BE
        } else {
            flow.src
        };
        let mut reply = CtKey::v4(
            backend.addr_be,
            client,
            backend.port_be,
            flow.sport,
            flow.proto,
        );
        let mut reason = stat::DNAT_NEW;
        if masquerade {
            let nat = self
                .maps
                .nat
                .filter(|n| n.node_addr_be != 0)
                .ok_or((DROP, stat::DROP_NO_NODE_ADDR))?;
            if backend.addr_be == nat.node_addr_be {
                if self.reply_taken(&reply, key, false) {
                    return Err((DROP, stat::DROP_CT_CLASH));
                }
            } else {
                reply.dst_be[0] = nat.node_addr_be;
                let (min, max) = (nat.port_min as u32, nat.port_max as u32);
                let span = if max >= min { max - min + 1 } else { 1 };
                reply = self
                    .free_port(&reply, key, flow.hash(), min, span, SNAT_TRIES, SNAT_STEP)
                    .ok_or((DROP, stat::DROP_SNAT_EXHAUSTED))?;
                reason = stat::DNAT_MASQUERADED;
            }
        } else {
            let take_closing = flow.proto == PROTO_TCP && flow.syn_only();
            if self.reply_taken(&reply, key, take_closing) {
                let span = 65_536 - REMAP_PORT_MIN;
                reply = self
                    .free_port(
                        &reply,
                        key,
                        flow.hash(),
                        REMAP_PORT_MIN,
                        span,
                        REMAP_TRIES,
                        7919,
                    )
                    .ok_or((DROP, stat::DROP_CT_CLASH))?;
                reason = stat::DNAT_PORT_REMAPPED;
            }
        }
        let (s, seen) = next_state(flow.proto, 0, flow.tcp_flags, true);
        let forward = CtEntry {
            pair: reply,
            last_seen_ns: self.now,
            service_id,
            backend_id,
            dir: CT_FORWARD,
            state: s,
            flags: seen,
            _pad: [0; 5],
        };
        let reverse = CtEntry {
            pair: *key,
            dir: CT_REVERSE,
            ..forward
        };
        self.view.put(reply, reverse);
        self.view.put(*key, forward);
        if let Some(old) = previous {
            let names_us = self
                .view
                .ct(&old)
                .is_some_and(|r| r.dir == CT_REVERSE && r.pair == *key);
            if old != reply && names_us {
                self.view.remove(old);
            }
        }
        Ok(reason)
    }

    /// A reply of a live connection is reverse-NATed; a stale reverse entry at the
    /// packet's key goes (`stale` set), and the packet goes on as any other.
    fn reply_side(&mut self, p: &[u8], flow: &Flow, stale: &mut bool) -> Option<Exit> {
        let key = flow.key();
        if let Some(rev) = self.view.ct(&key).filter(|e| e.dir == CT_REVERSE) {
            let fwd_key = rev.pair;
            match self
                .view
                .ct(&fwd_key)
                .filter(|f| f.dir == CT_FORWARD && f.pair == key && self.alive(f))
            {
                Some(mut f) => {
                    let (s, seen) = next_state(flow.proto, f.flags, flow.tcp_flags, false);
                    f.state = s;
                    f.flags = seen;
                    f.last_seen_ns = self.now;
                    self.view.put(fwd_key, f);
                    self.set_addr(flow, true, fwd_key.dst_be[0]);
                    if fwd_key.src_be[0] != flow.dst {
                        self.set_addr(flow, false, fwd_key.src_be[0]);
                    }
                    if flow.later_fragment {
                        return Some((PASS, stat::NAT_FRAGMENT));
                    }
                    if flow.proto == PROTO_SCTP {
                        return Some(self.sctp_ports(
                            p,
                            flow,
                            fwd_key.dport_be,
                            fwd_key.sport_be,
                            stat::REVNAT,
                        ));
                    }
                    self.set_port(flow, true, flow.sport, fwd_key.dport_be);
                    if fwd_key.sport_be != flow.dport {
                        self.set_port(flow, false, flow.dport, fwd_key.sport_be);
                    }
                    return Some((PASS, stat::REVNAT));
                }
                None => {
                    self.view.remove(key);
                    *stale = true;
                }
            }
        }
        None
    }

    /// A packet that is neither a client's of a live connection, nor a reply of
    /// one, nor to a frontend: a stale reverse entry's passes; a direct SYN clears a
    /// closing Service connection on its tuple; a ClusterIP's undeclared port is
    /// rejected; the rest passes untouched.
    fn other_side(&mut self, p: &[u8], flow: &Flow, stale: bool) -> Exit {
        if stale {
            return (PASS, stat::PASS_STALE_CONNTRACK);
        }
        let key = flow.key();
        let clusterip = self
            .maps
            .services
            .contains_key(&dataplane_common::clusterip_marker(flow.dst));
        if flow.later_fragment {
            // The first fragment made no connection: a ClusterIP's rest is dropped,
            // never passed to the VIP untranslated.
            if clusterip {
                return (DROP, stat::DROP_FRAGMENT_ORPHAN);
            }
            return (PASS, stat::PASS_FRAGMENT);
        }
        if flow.syn_only() {
            // A direct connection on the reply tuple of a Service connection that is
            // closing or closed: that connection's entries go.
            let reply = key.reversed();
            if let Some(rev) = self.view.ct(&reply).filter(|e| e.dir == CT_REVERSE) {
                let fwd = self.view.ct(&rev.pair);
                let open = fwd.is_some_and(|f| {
                    f.pair == reply
                        && [
                            state::TCP_SYN_SENT,
                            state::TCP_ESTABLISHED,
                            state::SCTP_UNREPLIED,
                            state::SCTP_ESTABLISHED,
                        ]
                        .contains(&f.state)
                });
                if !open {
                    self.view.remove(reply);
                    if fwd.is_some_and(|f| f.pair == reply) {
                        self.view.remove(rev.pair);
                    }
                }
            }
        }
        if clusterip {
            return self.reject(p, flow, stat::REJECT_NO_PORT);
        }
        (PASS, stat::PASS_NO_SERVICE)
    }

    /// REJECT: ICMP port unreachable from the address the client asked for, quoting
    /// as much of the datagram as arrived and fits in 576 bytes, in whole words, sent
    /// back. A
    /// datagram with IP options is dropped instead (`drop_reject`).
    fn reject(&mut self, p: &[u8], flow: &Flow, reason: u32) -> Exit {
        if flow.l4 != ETH + 20 {
            return (DROP, stat::DROP_REJECT);
        }
        // Only the bytes that arrived are quoted: a header that claims more than the
        // frame holds is not padded with zeros to its claim (issue 46).
        let total = (be16(p, ETH + 2) as usize).min(p.len() - ETH);
        let quote_len = total.min(REJECT_QUOTE_MAX) & !3;
        if quote_len < 28 {
            return (DROP, stat::DROP_REJECT);
        }
        let quote = p[ETH..ETH + quote_len].to_vec();
        let mut out = Vec::with_capacity(ETH + 28 + quote_len);
        out.extend_from_slice(&p[6..12]);
        out.extend_from_slice(&p[0..6]);
        out.extend_from_slice(&p[12..14]);
        let mut ip = [0u8; 20];
        ip[0] = 0x45;
        ip[1] = 0xc0;
        ip[2..4].copy_from_slice(&((28 + quote_len) as u16).to_be_bytes());
        ip[8] = 64;
        ip[9] = PROTO_ICMP;
        ip[12..16].copy_from_slice(&p[ETH + 16..ETH + 20]);
        ip[16..20].copy_from_slice(&p[ETH + 12..ETH + 16]);
        let c = Checksum::of(&ip).get();
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        out.extend_from_slice(&ip);
        let mut icmp = vec![3u8, 3, 0, 0, 0, 0, 0, 0];
        icmp.extend_from_slice(&quote);
        let c = Checksum::of(&icmp).get();
        icmp[2..4].copy_from_slice(&c.to_be_bytes());
        out.extend_from_slice(&icmp);
        self.loose.push(ETH + 10);
        self.loose.push(ETH + 22);
        self.out = out;
        (Verdict::Redirect, reason)
    }

    /// An ICMP error about a live connection's packet to its backend: the quoted
    /// packet gets its frontend (and the client's own port) back, with the quoted IP
    /// and L4 checksums and the ICMP checksum updated; an error sent by the backend
    /// itself comes from the frontend. Anything else passes untouched.
    fn icmp(&mut self, p: &[u8], l4: usize, ip_end: usize) -> Exit {
        let not_ours = (PASS, stat::PASS_NOT_L4);
        if p.len() < l4 + 8 {
            return (DROP, stat::DROP_MALFORMED);
        }
        if p[l4] != 3 && p[l4] != 11 {
            return not_ours;
        }
        // The quoted IP header and 8 bytes of its L4 header inside the datagram
        // (RFC 792); of those, the frame must hold the header and the ports.
        let inner = l4 + 8;
        if inner + 28 > ip_end || p.len() < inner + 24 {
            return not_ours;
        }
        let proto = p[inner + 9];
        if p[inner] != 0x45 || ![PROTO_TCP, PROTO_UDP, PROTO_SCTP].contains(&proto) {
            return not_ours;
        }
        let q_src = ne32(p, inner + 12);
        let q_dst = ne32(p, inner + 16);
        let q_sport = ne16(p, inner + 20);
        let q_dport = ne16(p, inner + 22);
        let reply = CtKey::v4(q_dst, q_src, q_dport, q_sport, proto);
        let Some(rev) = self.view.ct(&reply).filter(|e| e.dir == CT_REVERSE) else {
            return not_ours;
        };
        let orig = rev.pair;
        let live = self
            .view
            .ct(&orig)
            .is_some_and(|f| f.dir == CT_FORWARD && f.pair == reply && self.alive(&f));
        if !live {
            return not_ours;
        }
        let (vip, vport, cport) = (orig.dst_be[0], orig.dport_be, orig.sport_be);
        // A masqueraded or hairpin connection's client had another address.
        let client = orig.src_be[0];
        // Every change inside the ICMP message also moves the ICMP checksum.
        let icmp_csum = l4 + 2;
        let q_l4_csum = inner + 20 + if proto == PROTO_TCP { 16 } else { 6 };
        if proto != PROTO_SCTP && q_l4_csum + 2 <= ip_end && q_l4_csum + 2 <= p.len() {
            let c = be16(p, q_l4_csum);
            if !(proto == PROTO_UDP && c == 0) {
                let mut sum = Checksum::from_field(c);
                sum.replace(&p[inner + 16..inner + 20], &vip.to_ne_bytes());
                sum.replace(&p[inner + 12..inner + 16], &client.to_ne_bytes());
                sum.replace(&p[inner + 20..inner + 22], &cport.to_ne_bytes());
                sum.replace(&p[inner + 22..inner + 24], &vport.to_ne_bytes());
                let mut n = sum.get();
                if proto == PROTO_UDP && n == 0 {
                    n = 0xffff;
                }
                if proto == PROTO_TCP {
                    self.loose.push(q_l4_csum);
                }
                self.write_in_icmp(icmp_csum, q_l4_csum, &n.to_be_bytes());
            }
        }
        let mut ipsum = Checksum::from_field(be16(p, inner + 10));
        ipsum.replace(&p[inner + 16..inner + 20], &vip.to_ne_bytes());
        ipsum.replace(&p[inner + 12..inner + 16], &client.to_ne_bytes());
        self.write_in_icmp(icmp_csum, inner + 10, &ipsum.get().to_be_bytes());
        self.loose.push(inner + 10);
        self.write_in_icmp(icmp_csum, inner + 16, &vip.to_ne_bytes());
        self.write_in_icmp(icmp_csum, inner + 12, &client.to_ne_bytes());
        self.write_in_icmp(icmp_csum, inner + 20, &cport.to_ne_bytes());
        self.write_in_icmp(icmp_csum, inner + 22, &vport.to_ne_bytes());
        self.loose.push(icmp_csum);
        if ne32(p, ETH + 12) == q_dst {
            self.write_ip(ETH + 12, &vip.to_ne_bytes());
        }
        if client != q_src && ne32(p, ETH + 16) == q_src {
            self.write_ip(ETH + 16, &client.to_ne_bytes());
        }
        (PASS, stat::NAT_ICMP_ERROR)
    }

    /// Writes `bytes` at `at` inside the ICMP message and moves its checksum.
    fn write_in_icmp(&mut self, csum_at: usize, at: usize, bytes: &[u8]) {
        let mut sum = Checksum::from_field(be16(&self.out, csum_at));
        sum.replace(&self.out[at..at + bytes.len()], bytes);
        let c = sum.get();
        self.out[csum_at..csum_at + 2].copy_from_slice(&c.to_be_bytes());
        self.out[at..at + bytes.len()].copy_from_slice(bytes);
    }

    /// Writes `bytes` at `at` inside the IPv4 header and moves its checksum.
    fn write_ip(&mut self, at: usize, bytes: &[u8]) {
        let mut sum = Checksum::from_field(be16(&self.out, ETH + 10));
        sum.replace(&self.out[at..at + bytes.len()], bytes);
        let c = sum.get();
        self.out[ETH + 10..ETH + 12].copy_from_slice(&c.to_be_bytes());
        self.out[at..at + bytes.len()].copy_from_slice(bytes);
        self.loose.push(ETH + 10);
    }

    /// An SCTP packet's ports set to `sport:dport` (its addresses are done): the
    /// CRC32c moves by the CRC of the difference, over the SCTP packet's length as
    /// the IP header gives it; a zero CRC (to be computed by the kernel) stays zero; a
    /// first fragment's CRC covers bytes it does not hold: dropped.
    fn sctp_ports(&mut self, p: &[u8], flow: &Flow, sport: u16, dport: u16, reason: u32) -> Exit {
        if sport == flow.sport && dport == flow.dport {
            return (PASS, reason);
        }
        let crc_at = flow.l4 + 8;
        let field: [u8; 4] = self.out[crc_at..crc_at + 4].try_into().expect("4 bytes");
        if field != [0; 4] {
            if be16(p, ETH + 6) & 0x2000 != 0 {
                return (DROP, stat::DROP_REWRITE);
            }
            let ihl = (p[ETH] & 0x0f) as usize * 4;
            let len = be16(p, ETH + 2) as usize - ihl;
            let mut diff = vec![0u8; len];
            let (os, ns) = (flow.sport.to_ne_bytes(), sport.to_ne_bytes());
            let (od, nd) = (flow.dport.to_ne_bytes(), dport.to_ne_bytes());
            diff[..4].copy_from_slice(&[
                os[0] ^ ns[0],
                os[1] ^ ns[1],
                od[0] ^ nd[0],
                od[1] ^ nd[1],
            ]);
            let crc = u32::from_le_bytes(field) ^ checksum::crc32c_linear(&diff);
            self.out[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
        }
        self.out[flow.l4..flow.l4 + 2].copy_from_slice(&sport.to_ne_bytes());
        self.out[flow.l4 + 2..flow.l4 + 4].copy_from_slice(&dport.to_ne_bytes());
        (PASS, reason)
    }

    /// The L4 checksum's offset, if the packet carries one to update (SCTP's CRC
    /// covers no address: `sctp_ports` sees to it).
    fn l4_csum(&self, flow: &Flow) -> Option<usize> {
        if flow.later_fragment || flow.udp_no_csum || flow.proto == PROTO_SCTP {
            return None;
        }
        Some(flow.l4 + if flow.proto == PROTO_TCP { 16 } else { 6 })
    }

    /// Moves the L4 checksum for a change of `old` to `new` in what it covers; a
    /// UDP checksum never becomes zero (that would mean "none").
    fn move_l4_csum(&mut self, flow: &Flow, old: &[u8], new: &[u8]) {
        let Some(at) = self.l4_csum(flow) else {
            return;
        };
        let mut sum = Checksum::from_field(be16(&self.out, at));
        sum.replace(old, new);
        let mut c = sum.get();
        if flow.proto == PROTO_UDP && c == 0 {
            c = 0xffff;
        }
        if flow.proto == PROTO_TCP {
            self.loose.push(at);
        }
        self.out[at..at + 2].copy_from_slice(&c.to_be_bytes());
    }

    /// Sets the source (`src`) or destination address: IP header checksum and the
    /// L4 pseudo-header sum.
    fn set_addr(&mut self, flow: &Flow, src: bool, addr: u32) {
        let at = ETH + if src { 12 } else { 16 };
        let old: [u8; 4] = self.out[at..at + 4].try_into().expect("4 bytes");
        self.move_l4_csum(flow, &old, &addr.to_ne_bytes());
        self.write_ip(at, &addr.to_ne_bytes());
    }

    /// Sets the source (`src`) or destination port of a packet with an L4 header.
    fn set_port(&mut self, flow: &Flow, src: bool, old: u16, port: u16) {
        let at = flow.l4 + if src { 0 } else { 2 };
        self.move_l4_csum(flow, &old.to_ne_bytes(), &port.to_ne_bytes());
        self.out[at..at + 2].copy_from_slice(&port.to_ne_bytes());
    }
}

/// The state of a connection after a packet with TCP flags `flags` (zero for other
/// protocols) went from the client (`from_client`) or back, and the flags seen so
/// far: netfilter's TCP tracker in outline (SYN_SENT until the backend answers,
/// ESTABLISHED, FIN_WAIT after one FIN, TIME_WAIT after a FIN each way, CLOSE after
/// any RST); UDP replied once the backend answered.
pub fn next_state(proto: u8, seen: u8, flags: u8, from_client: bool) -> (u8, u8) {
    let mut seen = seen;
    if !from_client {
        seen |= flag::REPLIED;
    }
    match proto {
        PROTO_TCP => {
            if flags & TCP_RST != 0 {
                seen |= flag::RST;
            }
            if flags & TCP_FIN != 0 {
                seen |= if from_client {
                    flag::FIN_ORIG
                } else {
                    flag::FIN_REPLY
                };
            }
            let fins = seen & (flag::FIN_ORIG | flag::FIN_REPLY);
            let s = if seen & flag::RST != 0 {
                state::TCP_CLOSE
            } else if fins == flag::FIN_ORIG | flag::FIN_REPLY {
                state::TCP_TIME_WAIT
            } else if fins != 0 {
                state::TCP_FIN_WAIT
            } else if seen & flag::REPLIED != 0 {
                state::TCP_ESTABLISHED
            } else {
                state::TCP_SYN_SENT
            };
            (s, seen)
        }
        PROTO_SCTP => {
            if flags & TCP_RST != 0 {
                seen |= flag::RST;
            }
            let s = if seen & flag::RST != 0 {
                state::SCTP_CLOSED
            } else if seen & flag::REPLIED != 0 {
                state::SCTP_ESTABLISHED
            } else {
                state::SCTP_UNREPLIED
            };
            (s, seen)
        }
        PROTO_UDP if seen & flag::REPLIED != 0 => (state::UDP_REPLIED, seen),
        PROTO_UDP => (state::UDP_UNREPLIED, seen),
        _ => (state::OTHER, seen),
    }
}
