//! Work requests of the CPU-proxy provider: a `gds_send_wr` (MOFED's exp layout) checked as
//! upstream's `ibv_exp_post_send` checks it and copied, inline payload included, into an
//! rdma-core `ibv_send_wr` the proxy thread posts later.

use std::ffi::c_int;

use crate::verbs::exp::*;
use crate::verbs::ibv::{QpCap, SendWr, Sge};

/// Longest list of work requests one call may pass (a guard against cyclic lists).
pub(super) const MAX_WRS_PER_CALL: usize = 1 << 16;

/// exp opcode → (ibv_wr_opcode, ibv_wc_opcode of its completion).
fn map_opcode(op: u32) -> Option<(u32, u32)> {
    Some(match op {
        0 | 1 => (op, 1), // RDMA_WRITE(_WITH_IMM) → IBV_WC_RDMA_WRITE
        2 | 3 => (op, 0), // SEND(_WITH_IMM) → IBV_WC_SEND
        4 => (4, 2),      // RDMA_READ
        5 => (5, 3),      // ATOMIC_CMP_AND_SWP → IBV_WC_COMP_SWAP
        6 => (6, 4),      // ATOMIC_FETCH_AND_ADD
        // MOFED numbers these from IBV_EXP_START_ENUM (0x40); rdma-core's IBV_WR_* values differ.
        0x48 => (9, 0),  // SEND_WITH_INV → IBV_WR_SEND_WITH_INV, completes as IBV_WC_SEND
        0x4a => (7, 6),  // LOCAL_INV → IBV_WR_LOCAL_INV, IBV_WC_LOCAL_INV
        0x4f => (10, 7), // TSO
        _ => return None,
    })
}

/// One `gds_send_wr` translated into an `ibv_send_wr` whose pointers refer to owned copies.
pub(super) struct PreparedWr {
    pub(super) wr: SendWr,
    pub(super) sges: Vec<Sge>,
    pub(super) inline: Vec<u8>,
    pub(super) wc_opcode: u32,
    pub(super) signaled: bool,
}

/// Checks and copies one work request (spec: upstream's ibv_exp_post_send checks).
///
/// # Safety
/// `w` points to a readable `gds_send_wr` whose `sg_list` has `num_sge` entries and whose
/// inline buffers are readable.
pub(super) unsafe fn translate_wr(
    w: *const ExpSendWr,
    cap: &QpCap,
    sig_all: bool,
) -> std::result::Result<PreparedWr, String> {
    // SAFETY: readable per the contract.
    let e = unsafe { &*w };
    if e.comp_mask != 0 {
        return Err(format!("comp_mask {:#x} is not supported", e.comp_mask));
    }
    let (opcode, wc_opcode) = map_opcode(e.exp_opcode)
        .ok_or_else(|| format!("opcode {:#x} is not supported by the proxy provider", e.exp_opcode))?;
    let known = IBV_EXP_SEND_FENCE
        | IBV_EXP_SEND_SIGNALED
        | IBV_EXP_SEND_SOLICITED
        | IBV_EXP_SEND_INLINE
        | IBV_EXP_SEND_IP_CSUM;
    if e.exp_send_flags & !known != 0 {
        return Err(format!("send flags {:#x} are not supported", e.exp_send_flags));
    }
    let mut send_flags = (e.exp_send_flags & 0xf) as u32;
    if e.exp_send_flags & IBV_EXP_SEND_IP_CSUM != 0 {
        send_flags |= IBV_SEND_IP_CSUM;
    }
    let n = e.num_sge;
    if n < 0 || (n > 0 && e.sg_list.is_null()) {
        return Err(format!("bad scatter/gather list ({n} entries at {:p})", e.sg_list));
    }
    if send_flags & IBV_SEND_INLINE == 0 && n as u32 > cap.max_send_sge {
        return Err(format!("{n} scatter/gather entries, the QP takes {}", cap.max_send_sge));
    }
    let sges: Vec<Sge> = if n == 0 {
        Vec::new()
    } else {
        // SAFETY: `n` entries at sg_list per the contract (non-NULL when n > 0).
        unsafe { std::slice::from_raw_parts(e.sg_list, n as usize) }.to_vec()
    };
    let mut inline = Vec::new();
    let mut out_sges = sges.clone();
    if send_flags & IBV_SEND_INLINE != 0 {
        let total: u64 = sges.iter().map(|s| s.length as u64).sum();
        if total > cap.max_inline_data as u64 {
            return Err(format!("{total} bytes of inline data, the QP takes {}", cap.max_inline_data));
        }
        // Upstream copies inline data into the WQE at prepare time; we copy it now too, so the
        // application may reuse its buffer as soon as the call returns.
        inline.reserve(total as usize);
        for s in &sges {
            if s.length > 0 {
                // SAFETY: an inline SGE names `length` readable bytes at `addr` (verbs contract).
                inline.extend_from_slice(unsafe {
                    std::slice::from_raw_parts(s.addr as usize as *const u8, s.length as usize)
                });
            }
        }
        out_sges =
            if inline.is_empty() { Vec::new() } else { vec![Sge { addr: 0, length: inline.len() as u32, lkey: 0 }] };
    }
    let mut wr = SendWr {
        wr_id: e.wr_id,
        opcode,
        send_flags,
        imm_data: e.imm_data,
        wr: e.wr,
        qp_type: e.qp_type,
        num_sge: out_sges.len() as c_int,
        ..SendWr::default()
    };
    if opcode == 10 {
        wr.ext[0] = e.bind_tso[0];
        wr.ext[1] = e.bind_tso[1];
    }
    let signaled = sig_all || send_flags & (IBV_EXP_SEND_SIGNALED as u32) != 0;
    Ok(PreparedWr { wr, sges: out_sges, inline, wc_opcode, signaled })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exp(opcode: u32, flags: u64, sg: &mut [Sge]) -> ExpSendWr {
        // SAFETY: all-zero is a valid ExpSendWr.
        let mut w: ExpSendWr = unsafe { std::mem::zeroed() };
        w.wr_id = 77;
        w.exp_opcode = opcode;
        w.exp_send_flags = flags;
        w.sg_list = sg.as_mut_ptr();
        w.num_sge = sg.len() as c_int;
        w.imm_data = 0x1234;
        w.wr = [0x1000, 0x55, 0, 0];
        w
    }

    #[test]
    fn translation_checks_and_copies() {
        let cap = QpCap { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 2, max_recv_sge: 1, max_inline_data: 8 };
        let data = *b"abcdefgh";
        let mut sg = [
            Sge { addr: data.as_ptr() as u64, length: 5, lkey: 9 },
            Sge { addr: data.as_ptr() as u64 + 5, length: 3, lkey: 9 },
        ];
        // SAFETY: valid wrs over live buffers.
        unsafe {
            let w = exp(3, IBV_EXP_SEND_SIGNALED, &mut sg);
            let p = translate_wr(&w, &cap, false).unwrap();
            assert_eq!(
                (p.wr.opcode, p.wr.send_flags, p.wr.imm_data, p.wr.wr[0], p.wr.num_sge),
                (3, 2, 0x1234, 0x1000, 2)
            );
            assert!(p.signaled && p.inline.is_empty() && p.wc_opcode == 0);
            let w = exp(0, IBV_EXP_SEND_INLINE, &mut sg);
            let p = translate_wr(&w, &cap, true).unwrap();
            assert_eq!(p.inline, b"abcdefgh".to_vec(), "inline payload copied at prepare time");
            assert_eq!((p.sges.len(), p.sges[0].length, p.wc_opcode), (1, 8, 1));
            assert!(p.signaled, "sq_sig_all makes every request signaled");
            let mut sg9 = [Sge { addr: data.as_ptr() as u64, length: 9, lkey: 0 }];
            let w = exp(0, IBV_EXP_SEND_INLINE, &mut sg9);
            assert!(translate_wr(&w, &cap, false).is_err(), "inline above max_inline_data");
            let mut sg3 = [sg[0]; 3];
            assert!(translate_wr(&exp(2, 0, &mut sg3), &cap, false).is_err(), "too many SGEs");
            assert!(translate_wr(&exp(0x60, 0, &mut sg), &cap, false).is_err(), "SEND_ENABLE unsupported");
            assert!(translate_wr(&exp(2, 1 << 34, &mut sg), &cap, false).is_err(), "unknown flag");
            let mut w = exp(2, 0, &mut sg);
            w.comp_mask = 1;
            assert!(translate_wr(&w, &cap, false).is_err());
            let w = exp(0x4f, IBV_EXP_SEND_IP_CSUM, &mut sg);
            let p = translate_wr(&w, &cap, false).unwrap();
            assert_eq!((p.wr.opcode, p.wr.send_flags, p.wc_opcode), (10, IBV_SEND_IP_CSUM, 7));
        }
    }

    #[test]
    fn mofed_exp_opcodes_translate_to_rdma_core_ones() {
        // MOFED's IBV_EXP_WR_SEND_WITH_INV / LOCAL_INV / BIND_MW are 0x48 / 0x4a / 0x4e.
        assert_eq!(map_opcode(0x48), Some((9, 0)), "SEND_WITH_INV → IBV_WR_SEND_WITH_INV, IBV_WC_SEND");
        assert_eq!(map_opcode(0x4a), Some((7, 6)), "LOCAL_INV → IBV_WR_LOCAL_INV, IBV_WC_LOCAL_INV");
        assert_eq!(map_opcode(0x4e), None, "BIND_MW has no ibv_post_send form");
        for raw in [7, 8, 9, 10] {
            assert_eq!(map_opcode(raw), None, "rdma-core value {raw} is not an exp opcode");
        }
    }
}
