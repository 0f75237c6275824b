//! The harness's own floor for figure 1: a program that only returns its verdict,
//! loaded with the `bpf(2)` system call (two instructions, no ELF), timed through
//! BPF_PROG_TEST_RUN with the same packet and repeat as the real programs. What it
//! takes is the test run's own cost per run (the loop, the timer, the context), which
//! every figure-1 number includes; a program's own cost is its figure less this.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use anyhow::{bail, Result};

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_TEST_RUN: libc::c_long = 10;
const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;
const BPF_PROG_TYPE_XDP: u32 = 6;
/// The verdicts the empty programs return: TC_ACT_OK and XDP_PASS, as the real
/// programs do on the packets timed.
const TC_ACT_OK: i32 = 0;
const XDP_PASS: i32 = 2;

/// `bpf_attr` as the two commands read it: zeroed, the fields set at their offsets
/// (linux/bpf.h), large enough for both.
#[repr(C, align(8))]
struct Attr([u8; 128]);

impl Attr {
    fn new() -> Self {
        Attr([0; 128])
    }
    fn u32_at(&mut self, off: usize, v: u32) -> &mut Self {
        self.0[off..off + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn u64_at(&mut self, off: usize, v: u64) -> &mut Self {
        self.0[off..off + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn read_u32(&self, off: usize) -> u32 {
        u32::from_ne_bytes(self.0[off..off + 4].try_into().unwrap_or_default())
    }
    fn call(&mut self, cmd: libc::c_long) -> std::io::Result<libc::c_long> {
        // SAFETY: `self` is a zero-padded `bpf_attr` of the size passed; the pointers
        // set in it point to buffers the caller keeps alive across the call.
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                cmd,
                self.0.as_mut_ptr(),
                self.0.len() as libc::c_uint,
            )
        };
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(r)
        }
    }
}

/// A loaded program that returns `verdict` and does nothing else.
pub struct Empty {
    fd: OwnedFd,
    verdict: i32,
}

impl Empty {
    fn load(prog_type: u32, verdict: i32) -> Result<Self> {
        // `r0 = verdict; exit`: BPF_ALU64 | BPF_MOV | BPF_K, then BPF_JMP | BPF_EXIT.
        let mut insns = [0u8; 16];
        insns[0] = 0xb7;
        insns[4..8].copy_from_slice(&verdict.to_ne_bytes());
        insns[8] = 0x95;
        let license = c"GPL";
        let mut attr = Attr::new();
        attr.u32_at(0, prog_type)
            .u32_at(4, 2)
            .u64_at(8, insns.as_ptr() as u64)
            .u64_at(16, license.as_ptr() as u64);
        let fd = match attr.call(BPF_PROG_LOAD) {
            Ok(fd) => fd as RawFd,
            Err(e) => bail!("loading an empty program of type {prog_type}: {e}"),
        };
        // SAFETY: the kernel just returned this descriptor to us alone.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self { fd, verdict })
    }

    /// An empty TC program (returns TC_ACT_OK).
    pub fn tc() -> Result<Self> {
        Self::load(BPF_PROG_TYPE_SCHED_CLS, TC_ACT_OK)
    }

    /// An empty XDP program (returns XDP_PASS).
    pub fn xdp() -> Result<Self> {
        Self::load(BPF_PROG_TYPE_XDP, XDP_PASS)
    }

    /// Runs `packet` `repeat` times; the kernel's mean time per run, in nanoseconds.
    pub fn time(&self, packet: &[u8], repeat: u32) -> Result<f64> {
        use std::os::fd::AsRawFd;
        let mut out = vec![0u8; packet.len() + 256];
        let mut attr = Attr::new();
        attr.u32_at(0, self.fd.as_raw_fd() as u32)
            .u32_at(8, packet.len() as u32)
            .u32_at(12, out.len() as u32)
            .u64_at(16, packet.as_ptr() as u64)
            .u64_at(24, out.as_mut_ptr() as u64)
            .u32_at(32, repeat);
        if let Err(e) = attr.call(BPF_PROG_TEST_RUN) {
            bail!("BPF_PROG_TEST_RUN of an empty program: {e}");
        }
        let verdict = attr.read_u32(4) as i32;
        if verdict != self.verdict {
            bail!("the empty program returned {verdict}, not {}", self.verdict);
        }
        Ok(f64::from(attr.read_u32(36)))
    }
}
