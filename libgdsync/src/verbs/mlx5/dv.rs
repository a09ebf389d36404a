//! The mlx5 direct provider's data path, on the memory `mlx5dv_init_obj` describes (spec §7.4):
//! what MOFED's peer-direct libmlx5 did for libgdsync, done by this library on rdma-core.
//!
//! * Send queue ([`Sq`]): the CPU writes WQEs (ctrl + optional raddr/atomic + data or inline
//!   segments, PRM layouts) into `sq.buf` at the library's own producer counter, without ringing;
//!   [`Sq::commit`] returns the ops that ring for everything posted since the last commit:
//!   `STORE_DWORD(htobe32(pc & 0xffff) → dbrec[1])`, `FENCE`, `STORE_QWORD(first 8 bytes of the
//!   last ctrl segment → bf.reg + current half)` (the GPU issues them; §7.1/§7.3), alternating
//!   BlueFlame halves as rdma-core does. [`Sq::blueflame_chunks`] gives the 64-byte BlueFlame
//!   copies of the last WQE for a CPU-rung post. [`Sq::check_dbrec`] reads `dbrec[1]` back and
//!   tells whether it still holds one of our rings, or went back to 0 because rdma-core reset
//!   the QP (`ibv_modify_qp` to RESET zeroes the record and the provider's indices);
//!   [`Sq::reset`] then restarts at WQE 0.
//! * Completion queue ([`Cq`]): [`Cq::peek`] gives the poll of CQE `n` (owner-bit parity of its
//!   lap: `POLL_AND(0x01000000)` on odd laps, `POLL_GEQ(0)` (or `POLL_NOR`) on even ones, on the
//!   word at byte 60 of the 64-byte CQE view); [`Cq::poll`] is the CPU side: owner/opcode
//!   validity, parsing, the consumer index in the doorbell record, and the `op_own = 0xF0`
//!   rewrite that keeps a later-lap GEQ wait from firing on a stale entry; [`Cq::follow`]
//!   reads libmlx5's consumer index from the CQ doorbell record and notices that a QP reset's
//!   `mlx5_cq_clean` moved it past ours (the span it removed: [`Cq::removed`]).
//!
//! No mlx5 NIC is reachable from our test machines: everything here is tested against synthetic
//! rings built from the documented layouts (unit tests below), never against hardware.

#![forbid(unsafe_code)]

use gpudirect_common::{Errno, Result};

use crate::abi::*;

pub const MLX5_OPCODE_RDMA_WRITE: u8 = 0x08;
pub const MLX5_OPCODE_RDMA_WRITE_IMM: u8 = 0x09;
pub const MLX5_OPCODE_SEND: u8 = 0x0a;
pub const MLX5_OPCODE_SEND_IMM: u8 = 0x0b;
pub const MLX5_OPCODE_RDMA_READ: u8 = 0x10;
pub const MLX5_OPCODE_ATOMIC_CS: u8 = 0x11;
pub const MLX5_OPCODE_ATOMIC_FA: u8 = 0x12;
pub const MLX5_WQE_CTRL_CQ_UPDATE: u8 = 0x08;
pub const MLX5_WQE_CTRL_SOLICITED: u8 = 0x02;
pub const MLX5_WQE_CTRL_FENCE: u8 = 0x80;
pub const MLX5_INLINE_SEG: u32 = 0x8000_0000;
pub const MLX5_CQE_INVALID: u8 = 0xf;
#[cfg(test)]
pub const MLX5_CQE_REQ_ERR: u8 = 13;
#[cfg(test)]
pub const MLX5_CQE_RESP_ERR: u8 = 14;

const WQEBB: usize = 64;

/// Memory the provider reads and writes: real mappings in the provider, a byte vector in tests.
pub trait Mem {
    fn write(&self, addr: usize, bytes: &[u8]);
    fn read(&self, addr: usize, out: &mut [u8]);
}

/// What a work request asks for, already translated from `gds_send_wr`.
#[derive(Clone, Debug, Default)]
pub struct Wqe<'a> {
    pub opcode: u8,
    pub signaled: bool,
    pub solicited: bool,
    pub fence: bool,
    /// Immediate data, already big-endian as verbs passes it.
    pub imm_be: u32,
    /// (remote address, rkey) for RDMA and atomics.
    pub raddr: Option<(u64, u32)>,
    /// (swap_or_add, compare) for atomics.
    pub atomic: Option<(u64, u64)>,
    /// (addr, length, lkey) gather entries.
    pub sges: &'a [(u64, u32, u32)],
    /// Inline payload instead of gather entries.
    pub inline: Option<&'a [u8]>,
}

/// A send queue from `mlx5dv_qp`: `buf`/`wqe_cnt`, `dbrec`, `bf.reg`/`bf.size`, and the QP number.
#[derive(Clone, Debug)]
pub struct Sq {
    pub buf: usize,
    pub wqe_cnt: u32,
    pub bf_size: u32,
    pub qpn: u32,
    pub max_inline: u32,
    /// Producer counter in WQEBBs (mod 2^32; the WQE index field is its low 16 bits).
    pub cur_post: u32,
    /// Oldest WQEBB not known complete (advanced from send CQEs' `wqe_counter`).
    pub tail: u32,
    /// Producer counter at the previous commit.
    pub committed: u32,
    /// Ring offset of the last WQE's ctrl segment and its size in WQEBBs.
    pub last: Option<(usize, u32)>,
    /// The BlueFlame half the next ring uses (0 or bf_size).
    pub bf_offset: u32,
    /// (first WQEBB, size) of every WQE not known complete, oldest first.
    pub inflight: std::collections::VecDeque<(u32, u32)>,
    /// The doorbell record (`dbrec[1]`, at +4, is the send counter our rings store).
    pub dbrec: usize,
    /// Lower bound of the producer counter of the last ring that reached the doorbell record:
    /// the last one [`Sq::check_dbrec`] found there (the completed `tail` is another bound).
    pub rung: u32,
}

/// What the send doorbell record says ([`Sq::check_dbrec`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dbrec {
    /// One of our rings (or still 0 where that is one of the values it can legitimately hold).
    Ours,
    /// 0 where none of the rings that may have run stores 0: rdma-core reset the QP.
    Reset,
    /// A value none of those rings stores (libmlx5's own `ibv_post_send` on the QP, or a ring the
    /// application left pending across a reset that ran after it).
    Foreign(u32),
}

/// `a` is after `b` in mod-2^32 counter order.
fn after(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

fn be32(v: u32) -> [u8; 4] {
    v.to_be_bytes()
}

impl Sq {
    pub fn new(
        buf: usize,
        wqe_cnt: u32,
        dbrec: usize,
        bf_reg: usize,
        bf_size: u32,
        qpn: u32,
        max_inline: u32,
    ) -> Result<Sq> {
        if buf == 0 || dbrec == 0 || bf_reg == 0 || !wqe_cnt.is_power_of_two() {
            gds_err!(
                "gds_mlx5",
                "invalid mlx5dv send queue (buf {buf:#x}, {wqe_cnt} WQEBBs, dbrec {dbrec:#x}, bf {bf_reg:#x})"
            );
            return Err(Errno::EINVAL);
        }
        // The doorbell record and BlueFlame register are only checked here: the provider rings
        // them through its own copies.
        Ok(Sq {
            buf,
            wqe_cnt,
            bf_size,
            qpn,
            max_inline,
            cur_post: 0,
            tail: 0,
            committed: 0,
            last: None,
            bf_offset: 0,
            inflight: Default::default(),
            dbrec,
            rung: 0,
        })
    }

    fn ring_bytes(&self) -> usize {
        self.wqe_cnt as usize * WQEBB
    }

    /// Writes `bytes` at ring offset `pos`, wrapping at the end of the ring.
    fn put(&self, m: &dyn Mem, pos: usize, bytes: &[u8]) {
        let size = self.ring_bytes();
        let mut p = pos % size;
        let mut rest = bytes;
        while !rest.is_empty() {
            let n = rest.len().min(size - p);
            m.write(self.buf + p, &rest[..n]);
            rest = &rest[n..];
            p = (p + n) % size;
        }
    }

    /// Builds one WQE at the producer counter (no doorbell). Returns its size in WQEBBs.
    pub fn post(&mut self, m: &dyn Mem, w: &Wqe<'_>) -> Result<u32> {
        const F: &str = "gds_mlx5_post_send";
        let mut ds = 1usize; // ctrl
        if w.raddr.is_some() {
            ds += 1;
        }
        if w.atomic.is_some() {
            ds += 1;
        }
        let inline_len = w.inline.map(|d| d.len());
        if let Some(n) = inline_len {
            if n > self.max_inline as usize {
                gds_err!(F, "{n} bytes of inline data, the QP takes {}", self.max_inline);
                return Err(Errno::EINVAL);
            }
            if n > 0 {
                ds += (4 + n).div_ceil(16);
            }
        } else {
            ds += w.sges.iter().filter(|s| s.1 > 0).count();
        }
        if ds > 0x3f {
            gds_err!(F, "WQE of {ds} 16-byte units is too large");
            return Err(Errno::EINVAL);
        }
        let nbb = (ds * 16).div_ceil(WQEBB) as u32;
        if self.cur_post.wrapping_sub(self.tail).wrapping_add(nbb) > self.wqe_cnt {
            gds_dbg!(F, "send queue full");
            return Err(Errno::ENOMEM);
        }
        let start = (self.cur_post & (self.wqe_cnt - 1)) as usize * WQEBB;
        let mut pos = start + 16;
        if let Some((addr, rkey)) = w.raddr {
            let mut seg = [0u8; 16];
            seg[..8].copy_from_slice(&addr.to_be_bytes());
            seg[8..12].copy_from_slice(&be32(rkey));
            self.put(m, pos, &seg);
            pos += 16;
        }
        if let Some((swap_add, compare)) = w.atomic {
            let mut seg = [0u8; 16];
            seg[..8].copy_from_slice(&swap_add.to_be_bytes());
            seg[8..].copy_from_slice(&compare.to_be_bytes());
            self.put(m, pos, &seg);
            pos += 16;
        }
        match w.inline {
            Some(d) if !d.is_empty() => {
                let total = (4 + d.len()).div_ceil(16) * 16;
                let mut seg = vec![0u8; total];
                seg[..4].copy_from_slice(&be32(d.len() as u32 | MLX5_INLINE_SEG));
                seg[4..4 + d.len()].copy_from_slice(d);
                self.put(m, pos, &seg);
            }
            Some(_) => {}
            None => {
                for &(addr, len, lkey) in w.sges.iter().filter(|s| s.1 > 0) {
                    let mut seg = [0u8; 16];
                    seg[..4].copy_from_slice(&be32(len));
                    seg[4..8].copy_from_slice(&be32(lkey));
                    seg[8..].copy_from_slice(&addr.to_be_bytes());
                    self.put(m, pos, &seg);
                    pos += 16;
                }
            }
        }
        // The ctrl segment last, as the HW may prefetch: it names the WQE's index and size.
        let mut ctrl = [0u8; 16];
        ctrl[..4].copy_from_slice(&be32(((self.cur_post & 0xffff) << 8) | w.opcode as u32));
        ctrl[4..8].copy_from_slice(&be32((self.qpn << 8) | ds as u32));
        ctrl[11] = if w.signaled { MLX5_WQE_CTRL_CQ_UPDATE } else { 0 }
            | if w.solicited { MLX5_WQE_CTRL_SOLICITED } else { 0 }
            | if w.fence { MLX5_WQE_CTRL_FENCE } else { 0 };
        ctrl[12..].copy_from_slice(&w.imm_be.to_ne_bytes());
        self.put(m, start, &ctrl);
        self.last = Some((start, nbb));
        self.inflight.push_back((self.cur_post, nbb));
        self.cur_post = self.cur_post.wrapping_add(nbb);
        Ok(nbb)
    }

    /// The three ops ringing everything posted since the previous commit (spec §7.1), or none.
    /// `dbr`/`bf` are the range ids of the doorbell record and the BlueFlame register.
    pub fn commit(
        &mut self,
        m: &dyn Mem,
        dbr: u64,
        bf: u64,
        dbrec_on_gpu: bool,
    ) -> Option<(Vec<crate::engine::memops::PeerOp>, u64)> {
        use crate::engine::memops::PeerOp;
        if self.cur_post == self.committed {
            return None;
        }
        let (ctrl_pos, _) = self.last?;
        let mut q = [0u8; 8];
        m.read(self.buf + ctrl_pos, &mut q);
        let rollback = self.committed as u64 | ((self.cur_post as u64) << 32);
        let mem = if dbrec_on_gpu { IBV_EXP_PEER_FENCE_MEM_PEER } else { IBV_EXP_PEER_FENCE_MEM_SYS };
        let ops = vec![
            PeerOp::StoreDword { data: u32::from_ne_bytes(be32(self.cur_post & 0xffff)), target: dbr, offset: 4 },
            PeerOp::Fence { flags: IBV_EXP_PEER_FENCE_OP_WRITE | IBV_EXP_PEER_FENCE_FROM_HCA | mem },
            PeerOp::StoreQword { data: u64::from_ne_bytes(q), target: bf, offset: self.bf_offset as usize },
        ];
        self.bf_offset ^= self.bf_size;
        self.committed = self.cur_post;
        Some((ops, rollback))
    }

    /// Forgets WQEs committed but never rung (upstream's ABORT_LATE rollback). An id whose
    /// counters do not lie between the oldest WQE in flight and the producer counter (one from
    /// before a reset) is ignored: returns false.
    pub fn rollback(&mut self, id: u64) -> bool {
        let (to, at) = (id as u32, (id >> 32) as u32);
        if after(self.tail, to) || after(to, at) || after(at, self.cur_post) {
            return false;
        }
        while self.inflight.back().is_some_and(|&(s, _)| (s.wrapping_sub(to) as i32) >= 0) {
            self.inflight.pop_back();
        }
        self.cur_post = to;
        self.committed = id as u32;
        if after(self.rung, to) {
            self.rung = to;
        }
        self.last = None;
        true
    }

    /// Reads the send doorbell record (`dbrec[1]`) and says whether it still holds what our
    /// rings can have left there. The last ring that reached it carries a counter between the
    /// last one seen there (or the completed tail, a completed WQE having been rung) and the
    /// last commit; the record holds that counter's low 16 bits. A 0 that none of those
    /// counters explains is rdma-core's reset (`mlx5_modify_qp` to RESET zeroes both words).
    /// A 0 that one of them explains (nothing seen rung yet, or a ring at a multiple of 2^16
    /// may have run) is taken as ours: a reset then is invisible (see `verbs::mlx5`).
    pub fn check_dbrec(&mut self, m: &dyn Mem) -> Dbrec {
        let mut b = [0u8; 4];
        m.read(self.dbrec + 4, &mut b);
        let d = u32::from_be_bytes(b);
        let mut lo = if after(self.tail, self.rung) { self.tail } else { self.rung };
        if after(lo, self.committed) {
            lo = self.committed;
        }
        let span = self.committed.wrapping_sub(lo);
        if d <= 0xffff {
            let off = (d as u16).wrapping_sub(lo as u16) as u32;
            if off <= span {
                self.rung = lo.wrapping_add(off);
                return Dbrec::Ours;
            }
        }
        if d == 0 { Dbrec::Reset } else { Dbrec::Foreign(d) }
    }

    /// Back to a fresh QP's send queue, as rdma-core's reset leaves the hardware: WQE index 0,
    /// nothing in flight (those WQEs will never complete). The BlueFlame half is kept (rdma-core
    /// keeps its own too; the device does not care which half comes next).
    pub fn reset(&mut self) {
        self.cur_post = 0;
        self.tail = 0;
        self.committed = 0;
        self.rung = 0;
        self.last = None;
        self.inflight.clear();
    }

    #[cfg(test)]
    /// The last WQE as the 64-byte chunks a BlueFlame write copies (wrapping in the ring).
    pub fn blueflame_chunks(&self, m: &dyn Mem) -> Vec<[u8; 64]> {
        let Some((pos, nbb)) = self.last else { return Vec::new() };
        let size = self.ring_bytes();
        (0..nbb as usize)
            .map(|i| {
                let mut c = [0u8; 64];
                m.read(self.buf + (pos + i * WQEBB) % size, &mut c);
                c
            })
            .collect()
    }

    /// Retires WQEs up to the one a send CQE names (`wqe_counter`).
    pub fn complete(&mut self, wqe_counter: u16) {
        // The counter is the WQE index (low 16 bits of its first WQEBB); that WQE and every one
        // before it are done (in-order completion of a send queue).
        while let Some((start, nbb)) = self.inflight.pop_front() {
            self.tail = start.wrapping_add(nbb);
            if start as u16 == wqe_counter {
                break;
            }
        }
    }
}

/// A completion queue from `mlx5dv_cq`.
#[derive(Clone, Debug)]
pub struct Cq {
    pub buf: usize,
    pub cqe_cnt: u32,
    pub cqe_size: u32,
    /// The CQ doorbell record: `dbrec[0]` is libmlx5's consumer index (big-endian, 24 bits).
    pub dbrec: usize,
    /// Our consumer index: the next CQE we deliver or walk past.
    pub cons_index: u32,
    /// libmlx5's consumer index as last followed ([`Cq::follow`]): equal to `cons_index`
    /// except after libmlx5 removed CQEs (`mlx5_cq_clean` on a QP reset), when the entries
    /// between the two are no longer in libmlx5's queue and are walked without delivery.
    pub lib_ci: u32,
    /// First index of the latest span libmlx5 removed (`removed_from..lib_ci`; empty at first).
    pub removed_from: u32,
    /// Peer caps include POLL_NOR (else GEQ waits and the 0xF0 rewrite).
    pub nor: bool,
}

/// What the CQ doorbell record says of libmlx5's consumer index ([`Cq::follow`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Follow {
    /// Where we last saw it.
    Same,
    /// This many entries further (at most one ring): libmlx5 removed CQEs behind our back.
    Moved(u32),
    /// A value no clean explains (behind us, or more than a ring ahead): ignored.
    Foreign(u32),
}

#[cfg(test)]
/// A parsed CQE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cqe {
    pub opcode: u8,
    pub wqe_counter: u16,
    pub byte_cnt: u32,
    pub qpn: u32,
    pub imm_be: u32,
    pub syndrome: u8,
}

#[cfg(test)]
/// ibv_wc_status of an error CQE's syndrome (the PRM's syndrome table as libmlx5 maps it).
pub fn wc_status(syndrome: u8) -> u32 {
    match syndrome {
        0x01 => 1,  // local length
        0x02 => 2,  // local QP operation
        0x04 => 4,  // local protection
        0x05 => 5,  // work request flushed
        0x06 => 6,  // memory window bind
        0x10 => 7,  // bad response
        0x11 => 8,  // local access
        0x12 => 9,  // remote invalid request
        0x13 => 10, // remote access
        0x14 => 11, // remote operation
        0x15 => 12, // transport retry counter exceeded
        0x16 => 13, // RNR retry counter exceeded
        0x22 => 15, // remote aborted
        _ => 21,    // general error
    }
}

impl Cq {
    pub fn new(buf: usize, cqe_cnt: u32, cqe_size: u32, dbrec: usize, nor: bool) -> Result<Cq> {
        if buf == 0 || dbrec == 0 || !cqe_cnt.is_power_of_two() || !(cqe_size == 64 || cqe_size == 128) {
            gds_err!("gds_mlx5", "invalid mlx5dv CQ (buf {buf:#x}, {cqe_cnt} CQEs of {cqe_size} bytes)");
            return Err(Errno::EINVAL);
        }
        Ok(Cq { buf, cqe_cnt, cqe_size, dbrec, cons_index: 0, lib_ci: 0, removed_from: 0, nor })
    }

    /// libmlx5's consumer index as it publishes it (`dbrec[0]`: big-endian, low 24 bits).
    pub fn provider_ci(&self, m: &dyn Mem) -> u32 {
        let mut b = [0u8; 4];
        m.read(self.dbrec, &mut b);
        u32::from_be_bytes(b) & 0xff_ffff
    }

    /// Follows libmlx5's consumer index. It moves only when libmlx5 consumes: through our own
    /// poll hook (one CQE at a time, `lib_ci` moved with it), or in `mlx5_cq_clean`, which a QP
    /// reset runs on the QP's CQs: the QP's unpolled CQEs are removed, the others moved up
    /// towards the producer end, and the consumer index moved past the freed entries. Such a
    /// move (at most one ring: only entries the hardware wrote can be freed) extends the
    /// removed span; our `cons_index` stays, to walk the span without delivery.
    pub fn follow(&mut self, m: &dyn Mem) -> Follow {
        let hw = self.provider_ci(m);
        let ahead = hw.wrapping_sub(self.lib_ci) & 0xff_ffff;
        if ahead == 0 {
            return Follow::Same;
        }
        if ahead > self.cqe_cnt {
            return Follow::Foreign(hw);
        }
        if self.lib_ci == self.cons_index {
            self.removed_from = self.cons_index;
        }
        self.lib_ci = self.lib_ci.wrapping_add(ahead);
        Follow::Moved(ahead)
    }

    /// Index `n` lies in the span libmlx5 removed last: no CQE will be delivered there.
    pub fn removed(&self, n: u32) -> bool {
        n.wrapping_sub(self.removed_from) < self.lib_ci.wrapping_sub(self.removed_from)
    }

    /// The 64-byte view of CQE `n` still holds an entry of `n`'s lap (owner bit of that lap
    /// and a valid opcode), not one the hardware wrote a ring later.
    pub fn of_lap(&self, m: &dyn Mem, n: u32) -> bool {
        let mut b = [0u8; 1];
        m.read(self.buf + self.cqe64(n) + 63, &mut b);
        b[0] >> 4 != MLX5_CQE_INVALID && (b[0] & 1 != 0) == (n & self.cqe_cnt != 0)
    }

    /// Ring offset of the 64-byte CQE view of CQE `n`.
    pub fn cqe64(&self, n: u32) -> usize {
        (n & (self.cqe_cnt - 1)) as usize * self.cqe_size as usize + if self.cqe_size == 128 { 64 } else { 0 }
    }

    /// The poll of CQE `n` (absolute index): (op type, data, offset of the word in the ring).
    /// `E2BIG` when `n` is more than one ring ahead of the consumer index (spec §7.2).
    pub fn peek(&self, n: u32) -> Result<(u32, u32, usize)> {
        if (n.wrapping_sub(self.cons_index) as i32) > self.cqe_cnt as i32 - 1 {
            return Err(Errno(libc::E2BIG));
        }
        let off = self.cqe64(n) + 60;
        Ok(if n & self.cqe_cnt != 0 {
            (IBV_EXP_PEER_OP_POLL_AND_DWORD, 0x0100_0000, off)
        } else if self.nor {
            (IBV_EXP_PEER_OP_POLL_NOR_DWORD, !0x0100_0000u32, off)
        } else {
            (IBV_EXP_PEER_OP_POLL_GEQ_DWORD, 0, off)
        })
    }

    /// CPU poll of the CQE at the consumer index: None when the HW has not written it yet.
    /// (The model of what libmlx5 does on the real path; the provider lets libmlx5 poll.)
    #[cfg(test)]
    /// Consumes it: the GEQ-mode rewrite, the consumer index and the doorbell record.
    pub fn poll(&mut self, m: &dyn Mem) -> Option<Cqe> {
        let at = self.buf + self.cqe64(self.cons_index);
        let mut c = [0u8; 64];
        m.read(at, &mut c);
        let op_own = c[63];
        let opcode = op_own >> 4;
        let owner = op_own & 1 != 0;
        if opcode == MLX5_CQE_INVALID || owner != (self.cons_index & self.cqe_cnt != 0) {
            return None;
        }
        let word = |o: usize| u32::from_be_bytes([c[o], c[o + 1], c[o + 2], c[o + 3]]);
        let cqe = Cqe {
            opcode,
            wqe_counter: u16::from_be_bytes([c[60], c[61]]),
            byte_cnt: word(44),
            qpn: word(56) & 0xff_ffff,
            imm_be: u32::from_ne_bytes([c[36], c[37], c[38], c[39]]),
            syndrome: if opcode == MLX5_CQE_REQ_ERR || opcode == MLX5_CQE_RESP_ERR { c[55] } else { 0 },
        };
        if !self.nor {
            m.write(at + 63, &[MLX5_CQE_INVALID << 4]);
        }
        self.cons_index = self.cons_index.wrapping_add(1);
        m.write(self.dbrec, &be32(self.cons_index & 0xff_ffff));
        self.lib_ci = self.cons_index;
        Some(cqe)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::memops::PeerOp;
    use std::cell::RefCell;

    /// A flat byte space starting at address 0x1000.
    struct Fake(RefCell<Vec<u8>>);
    const BASE: usize = 0x1000;
    impl Mem for Fake {
        fn write(&self, addr: usize, b: &[u8]) {
            self.0.borrow_mut()[addr - BASE..addr - BASE + b.len()].copy_from_slice(b);
        }
        fn read(&self, addr: usize, out: &mut [u8]) {
            out.copy_from_slice(&self.0.borrow()[addr - BASE..addr - BASE + out.len()]);
        }
    }
    fn fake(n: usize) -> Fake {
        Fake(RefCell::new(vec![0; n]))
    }
    fn bytes(m: &Fake, addr: usize, n: usize) -> Vec<u8> {
        let mut v = vec![0; n];
        m.read(addr, &mut v);
        v
    }

    const SQ: usize = BASE; // 4 WQEBBs = 256 bytes
    const DBR: usize = BASE + 0x400;
    const BF: usize = BASE + 0x800;

    fn sq() -> Sq {
        Sq::new(SQ, 4, DBR, BF, 256, 0x1234, 64).unwrap()
    }

    #[test]
    fn send_wqe_layout_and_commit_ops() {
        let m = fake(0x1000);
        let mut q = sq();
        let sges = [(0xdead_beef_0000u64, 100u32, 0x77u32)];
        let w = Wqe { opcode: MLX5_OPCODE_SEND, signaled: true, sges: &sges, ..Default::default() };
        assert_eq!(q.post(&m, &w).unwrap(), 1);
        let wqe = bytes(&m, SQ, 32);
        assert_eq!(&wqe[0..4], &[0, 0, 0, 0x0a], "index 0, opcode SEND");
        assert_eq!(&wqe[4..8], &[0, 0x12, 0x34, 2], "qpn << 8 | ds 2");
        assert_eq!(wqe[11], MLX5_WQE_CTRL_CQ_UPDATE);
        assert_eq!(&wqe[16..20], &100u32.to_be_bytes());
        assert_eq!(&wqe[20..24], &0x77u32.to_be_bytes());
        assert_eq!(&wqe[24..32], &0xdead_beef_0000u64.to_be_bytes());
        let (ops, rb) = q.commit(&m, 11, 22, false).unwrap();
        assert_eq!(rb, 1 << 32);
        let ctrl = u64::from_ne_bytes(wqe[..8].try_into().unwrap());
        assert_eq!(
            ops,
            vec![
                PeerOp::StoreDword { data: u32::from_ne_bytes(1u32.to_be_bytes()), target: 11, offset: 4 },
                PeerOp::Fence { flags: 0x1a },
                PeerOp::StoreQword { data: ctrl, target: 22, offset: 0 },
            ]
        );
        assert!(q.commit(&m, 11, 22, false).is_none(), "nothing posted since");
        q.post(&m, &w).unwrap();
        let (ops, _) = q.commit(&m, 11, 22, true).unwrap();
        assert_eq!(ops[1], PeerOp::Fence { flags: 0x2a }, "dbrec in GPU memory: MEM_PEER");
        assert!(matches!(ops[2], PeerOp::StoreQword { offset: 256, .. }), "BlueFlame halves alternate");
    }

    #[test]
    fn wqe_counter_wraps_at_16_bits_and_the_ring_wraps() {
        let m = fake(0x1000);
        let mut q = sq();
        q.cur_post = 0xfffe;
        q.committed = 0xfffe;
        q.tail = 0xfffe;
        let sges = [(1u64, 1u32, 1u32)];
        let w = Wqe { opcode: MLX5_OPCODE_RDMA_WRITE, raddr: Some((0x5000, 9)), sges: &sges, ..Default::default() };
        for expect_idx in [0xfffeu32, 0xffff, 0x0000, 0x0001] {
            let slot = (q.cur_post & 3) as usize;
            q.post(&m, &w).unwrap();
            let c = bytes(&m, SQ + slot * 64, 8);
            assert_eq!(u32::from_be_bytes(c[..4].try_into().unwrap()), (expect_idx << 8) | 0x08);
            assert_eq!(c[7], 3, "ctrl + raddr + data");
            q.complete(expect_idx as u16);
        }
        assert_eq!(q.cur_post, 0x1_0002);
        let (ops, _) = q.commit(&m, 1, 2, false).unwrap();
        assert_eq!(ops[0], PeerOp::StoreDword { data: u32::from_ne_bytes(2u32.to_be_bytes()), target: 1, offset: 4 });
        assert_eq!(q.tail, q.cur_post, "every WQE completed");
    }

    #[test]
    fn queue_full_is_enomem_until_completions() {
        let m = fake(0x1000);
        let mut q = sq();
        let w = Wqe { opcode: MLX5_OPCODE_SEND, ..Default::default() };
        for _ in 0..4 {
            q.post(&m, &w).unwrap();
        }
        assert_eq!(q.post(&m, &w), Err(Errno::ENOMEM));
        q.complete(1);
        q.post(&m, &w).unwrap();
        q.post(&m, &w).unwrap();
        assert_eq!(q.post(&m, &w), Err(Errno::ENOMEM));
    }

    #[test]
    fn inline_data_is_padded_and_wraps_in_the_ring() {
        let m = fake(0x1000);
        let mut q = sq();
        q.cur_post = 3; // last WQEBB: a 2-WQEBB WQE crosses the end of the ring
        q.tail = 3;
        q.committed = 3;
        let data: Vec<u8> = (0..60).collect();
        let w = Wqe { opcode: MLX5_OPCODE_SEND_IMM, imm_be: 0x0403_0201, inline: Some(&data), ..Default::default() };
        assert_eq!(q.post(&m, &w).unwrap(), 2, "16 + 64 bytes = 2 WQEBBs");
        let first = bytes(&m, SQ + 192, 64);
        assert_eq!(first[7], 1 + 4, "ds: ctrl + 4 inline units");
        assert_eq!(&first[12..16], &[1, 2, 3, 4], "imm as given (network order)");
        assert_eq!(&first[16..20], &(60u32 | MLX5_INLINE_SEG).to_be_bytes());
        assert_eq!(&first[20..64], &data[..44]);
        let wrapped = bytes(&m, SQ, 20);
        assert_eq!(&wrapped[..16], &data[44..60], "continues at the ring start");
        assert_eq!(&wrapped[16..20], &[0; 4], "padding to 16 bytes");
        let long = vec![0u8; 65];
        let w = Wqe { opcode: MLX5_OPCODE_SEND, inline: Some(&long), ..Default::default() };
        assert_eq!(q.post(&m, &w), Err(Errno::EINVAL), "above max_inline");
        // BlueFlame copies of the last WQE: two 64-byte chunks, the second from the ring start.
        let chunks = q.blueflame_chunks(&m);
        assert_eq!(chunks.len(), 2);
        assert_eq!(chunks[0].to_vec(), first);
        assert_eq!(chunks[1].to_vec(), bytes(&m, SQ, 64));
    }

    #[test]
    fn atomics_have_raddr_atomic_and_data_segments() {
        let m = fake(0x1000);
        let mut q = sq();
        let sges = [(0x9000u64, 8u32, 5u32)];
        let w = Wqe {
            opcode: MLX5_OPCODE_ATOMIC_CS,
            raddr: Some((0x7000, 3)),
            atomic: Some((0xaa, 0xbb)),
            sges: &sges,
            ..Default::default()
        };
        q.post(&m, &w).unwrap();
        let b = bytes(&m, SQ, 64);
        assert_eq!(b[7], 4);
        assert_eq!(&b[16..24], &0x7000u64.to_be_bytes());
        assert_eq!(&b[32..40], &0xaau64.to_be_bytes());
        assert_eq!(&b[40..48], &0xbbu64.to_be_bytes());
        assert_eq!(&b[48..52], &8u32.to_be_bytes());
    }

    const CQ: usize = BASE;
    const CQ_DBR: usize = BASE + 0x800;

    fn hw_write_cqe(m: &Fake, cq: &Cq, n: u32, opcode: u8, wqe_counter: u16) {
        let at = cq.buf + cq.cqe64(n);
        let mut c = [0u8; 64];
        c[44..48].copy_from_slice(&77u32.to_be_bytes());
        c[56..60].copy_from_slice(&0x1234u32.to_be_bytes());
        c[60..62].copy_from_slice(&wqe_counter.to_be_bytes());
        if opcode == MLX5_CQE_REQ_ERR {
            c[55] = 0x13;
        }
        c[63] = (opcode << 4) | u8::from(n & cq.cqe_cnt != 0);
        m.write(at, &c);
    }

    fn init_ring(m: &Fake, cq: &Cq) {
        for i in 0..cq.cqe_cnt {
            m.write(cq.buf + cq.cqe64(i) + 63, &[0xf0]);
        }
    }

    /// The GPU's view of a poll op: does the word satisfy it now?
    fn fires(m: &Fake, cq: &Cq, n: u32) -> bool {
        let (op, data, off) = cq.peek(n).unwrap();
        let w = u32::from_le_bytes(bytes(m, cq.buf + off, 4).try_into().unwrap());
        let cond = match op {
            IBV_EXP_PEER_OP_POLL_AND_DWORD => GDS_WAIT_COND_AND,
            IBV_EXP_PEER_OP_POLL_NOR_DWORD => GDS_WAIT_COND_NOR,
            _ => GDS_WAIT_COND_GEQ,
        };
        crate::engine::cpu::condition_holds(cond, w, data).unwrap()
    }

    #[test]
    fn cq_wraps_and_owner_bit_flips_every_lap() {
        for (size, nor) in [(64u32, false), (128, false), (64, true)] {
            let m = fake(0x1000);
            let mut cq = Cq::new(CQ, 4, size, CQ_DBR, nor).unwrap();
            init_ring(&m, &cq);
            if nor {
                // libmlx5-fixes: owner bit set in the initial entries when NOR waits are used.
                for i in 0..4 {
                    m.write(cq.buf + cq.cqe64(i) + 63, &[0xf1]);
                }
            }
            for n in 0..13u32 {
                let (op, _, off) = cq.peek(n).unwrap();
                assert_eq!(off, (n as usize % 4) * size as usize + if size == 128 { 124 } else { 60 });
                let lap_odd = (n / 4) % 2 == 1;
                assert_eq!(op == IBV_EXP_PEER_OP_POLL_AND_DWORD, lap_odd, "CQE {n}");
                assert!(!fires(&m, &cq, n), "CQE {n} ({size}, nor {nor}) fires before the HW wrote it");
                assert_eq!(cq.poll(&m), None);
                hw_write_cqe(&m, &cq, n, 0, n as u16);
                assert!(fires(&m, &cq, n), "CQE {n} written but the wait does not fire");
                let c = cq.poll(&m).unwrap();
                assert_eq!((c.opcode, c.wqe_counter, c.byte_cnt, c.qpn), (0, n as u16, 77, 0x1234));
                assert_eq!(
                    bytes(&m, CQ_DBR, 4),
                    (n + 1).to_be_bytes().to_vec(),
                    "consumer index in the doorbell record"
                );
                if !nor {
                    assert_eq!(bytes(&m, cq.buf + cq.cqe64(n) + 63, 1), vec![0xf0], "GEQ mode rewrites consumed CQEs");
                }
            }
            assert_eq!(cq.peek(cq.cons_index + 4), Err(Errno(libc::E2BIG)), "more than a ring ahead");
            assert!(cq.peek(cq.cons_index + 3).is_ok());
        }
    }

    #[test]
    fn error_cqes_and_syndromes() {
        let m = fake(0x1000);
        let mut cq = Cq::new(CQ, 4, 64, CQ_DBR, false).unwrap();
        init_ring(&m, &cq);
        hw_write_cqe(&m, &cq, 0, MLX5_CQE_REQ_ERR, 0);
        assert!(!fires(&m, &cq, 0), "an error CQE does not satisfy the GEQ wait (upstream behaviour)");
        let c = cq.poll(&m).unwrap();
        assert_eq!((c.opcode, wc_status(c.syndrome)), (MLX5_CQE_REQ_ERR, 10));
        cq.cons_index = 4; // second lap: AND on the owner bit, which error CQEs satisfy too
        hw_write_cqe(&m, &cq, 4, MLX5_CQE_REQ_ERR, 0);
        assert!(fires(&m, &cq, 4));
        assert_eq!(wc_status(0x05), 5);
        assert_eq!(wc_status(0x99), 21);
    }

    #[test]
    fn cq_follows_libmlx5s_consumer_index_in_24_bits() {
        let m = fake(0x1000);
        let mut cq = Cq::new(CQ, 4, 64, CQ_DBR, false).unwrap();
        let set = |v: u32| m.write(CQ_DBR, &v.to_be_bytes());
        cq.cons_index = 0x1ff_fffe;
        cq.lib_ci = 0x1ff_fffe;
        set(0xff_fffe | 0x5a00_0000); // the top byte is not part of the index
        assert_eq!(cq.follow(&m), Follow::Same);
        assert!(!cq.removed(0x1ff_fffe), "nothing removed yet");
        set(0x00_0001); // a clean freed 3 entries across the 24-bit wrap
        assert_eq!(cq.follow(&m), Follow::Moved(3));
        assert_eq!((cq.cons_index, cq.lib_ci, cq.removed_from), (0x1ff_fffe, 0x200_0001, 0x1ff_fffe));
        assert!(cq.removed(0x1ff_fffe) && cq.removed(0x200_0000) && !cq.removed(0x200_0001));
        assert!(!cq.removed(0x1ff_fffd), "before the span: an ordinary stale index");
        set(0x00_0002); // a second clean before the span was walked extends it
        assert_eq!(cq.follow(&m), Follow::Moved(1));
        assert_eq!((cq.removed_from, cq.lib_ci), (0x1ff_fffe, 0x200_0002));
        for v in [0x00_0001, 0x00_0007] {
            set(v); // behind us, or more than a ring ahead: no clean does that
            assert_eq!(cq.follow(&m), Follow::Foreign(v));
            assert_eq!(cq.lib_ci, 0x200_0002, "ignored");
        }
        set(0x00_0002);
        cq.cons_index = cq.lib_ci; // walked
        set(0x00_0004);
        assert_eq!(cq.follow(&m), Follow::Moved(2));
        assert_eq!(cq.removed_from, 0x200_0002, "a later clean starts a new span");
        assert!(!cq.removed(0x1ff_fffe));
    }

    #[test]
    fn bad_layouts_are_refused() {
        assert!(Sq::new(0x1000, 3, 1, 1, 0, 0, 0).is_err());
        assert!(Sq::new(0, 4, 1, 1, 0, 0, 0).is_err());
        assert!(Cq::new(0x1000, 4, 32, 1, false).is_err());
        assert!(Cq::new(0x1000, 6, 64, 1, false).is_err());
    }
}
