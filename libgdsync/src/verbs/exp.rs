//! MOFED's experimental-verbs structures as libgdsync's API embeds them: `gds_send_wr` is
//! `struct ibv_exp_send_wr` (288 bytes) and `gds_qp_init_attr_t` is `struct ibv_exp_qp_init_attr`
//! (152 bytes), with the flag values both providers read. Shared by [`super::proxy`] and
//! [`super::mlx5`]; the layouts are those of include/gdsync/verbs_exp.h (tested below and in
//! compat-tests/gdsync/abi_layout.c).

use std::ffi::{c_int, c_void};

use super::ibv::{QpCap, QpInitAttr, Sge};

/// `struct ibv_exp_send_wr`, x86-64 layout of include/gdsync/verbs_exp.h (unions as raw words).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ExpSendWr {
    pub wr_id: u64,
    pub next: *mut ExpSendWr,
    pub sg_list: *mut Sge,
    pub num_sge: c_int,
    pub exp_opcode: u32,
    pub reserved: c_int,
    pub imm_data: u32,
    pub wr: [u64; 4],
    pub qp_type: u32,
    pub pad0: u32,
    pub task: [u64; 4],
    pub op: [u32; 4],
    pub dc: [u64; 3],
    pub bind_tso: [u64; 6],
    pub exp_send_flags: u64,
    pub comp_mask: u32,
    pub pad1: u32,
    pub ext_op: [u64; 9],
}

/// `struct ibv_exp_qp_init_attr` (the members this provider reads or writes back).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ExpQpInitAttr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut c_void,
    pub recv_cq: *mut c_void,
    pub srq: *mut c_void,
    pub cap: QpCap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
    pub comp_mask: u32,
    pub pd: *mut c_void,
    pub xrcd: *mut c_void,
    pub exp_create_flags: u32,
    pub rest: [u32; 17],
}

impl ExpQpInitAttr {
    /// What upstream's `gds_create_qp` writes back into the caller's attributes: the CQs it
    /// made, the PD, and the capabilities the QP got.
    pub fn write_back(&mut self, send_cq: *mut c_void, recv_cq: *mut c_void, pd: *mut c_void, cap: QpCap) {
        self.send_cq = send_cq;
        self.recv_cq = recv_cq;
        self.pd = pd;
        self.comp_mask |= IBV_EXP_QP_INIT_ATTR_PD | IBV_EXP_QP_INIT_ATTR_PEER_DIRECT;
        self.cap = cap;
    }

    /// The plain verbs attributes of a QP over `send_cq` and `recv_cq`, the rest as asked here.
    pub fn verbs_attr(&self, send_cq: *mut c_void, recv_cq: *mut c_void) -> QpInitAttr {
        QpInitAttr {
            qp_context: self.qp_context,
            send_cq,
            recv_cq,
            srq: self.srq,
            cap: self.cap,
            qp_type: self.qp_type,
            sq_sig_all: self.sq_sig_all,
        }
    }
}

pub(crate) const IBV_EXP_QP_INIT_ATTR_PD: u32 = 1 << 0;
pub(crate) const IBV_EXP_QP_INIT_ATTR_CREATE_FLAGS: u32 = 1 << 2;
pub(crate) const IBV_EXP_QP_INIT_ATTR_PEER_DIRECT: u32 = 1 << 10;

pub(crate) const IBV_EXP_SEND_FENCE: u64 = 1;
pub(crate) const IBV_EXP_SEND_SIGNALED: u64 = 2;
pub(crate) const IBV_EXP_SEND_SOLICITED: u64 = 4;
pub(crate) const IBV_EXP_SEND_INLINE: u64 = 8;
pub(crate) const IBV_EXP_SEND_IP_CSUM: u64 = 1 << 32;
pub(crate) const IBV_SEND_INLINE: u32 = 8;
pub(crate) const IBV_SEND_IP_CSUM: u32 = 16;

/// Neither provider implements any `exp_create_flags` (MOFED's QP-creation extensions): an
/// application asking for one gets `EINVAL` and a line naming them, not a QP without them.
pub(crate) fn check_create_flags(origin: &str, a: &ExpQpInitAttr) -> gpudirect_common::Result<()> {
    if a.comp_mask & IBV_EXP_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.exp_create_flags != 0 {
        gds_err!(origin, "exp_create_flags {:#x} are not supported", a.exp_create_flags);
        return Err(gpudirect_common::Errno::EINVAL);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_create_flags_are_refused() {
        // SAFETY: all-zero is a valid attribute block (NULL pointers, zero counts).
        let mut a: ExpQpInitAttr = unsafe { std::mem::zeroed() };
        assert!(check_create_flags("t", &a).is_ok());
        a.exp_create_flags = 0x40;
        assert!(check_create_flags("t", &a).is_ok(), "ignored unless comp_mask says they are set");
        a.comp_mask = IBV_EXP_QP_INIT_ATTR_CREATE_FLAGS;
        assert_eq!(check_create_flags("t", &a), Err(gpudirect_common::Errno::EINVAL));
        a.exp_create_flags = 0;
        assert!(check_create_flags("t", &a).is_ok());
    }

    #[test]
    fn exp_layouts() {
        assert_eq!(std::mem::size_of::<ExpSendWr>(), 288);
        assert_eq!(std::mem::offset_of!(ExpSendWr, exp_opcode), 28);
        assert_eq!(std::mem::offset_of!(ExpSendWr, imm_data), 36);
        assert_eq!(std::mem::offset_of!(ExpSendWr, wr), 40);
        assert_eq!(std::mem::offset_of!(ExpSendWr, qp_type), 72);
        assert_eq!(std::mem::offset_of!(ExpSendWr, dc), 128);
        assert_eq!(std::mem::offset_of!(ExpSendWr, bind_tso), 152);
        assert_eq!(std::mem::offset_of!(ExpSendWr, exp_send_flags), 200);
        assert_eq!(std::mem::offset_of!(ExpSendWr, comp_mask), 208);
        assert_eq!(std::mem::size_of::<ExpQpInitAttr>(), 152);
        assert_eq!(std::mem::offset_of!(ExpQpInitAttr, cap), 32);
        assert_eq!(std::mem::offset_of!(ExpQpInitAttr, comp_mask), 60);
        assert_eq!(std::mem::offset_of!(ExpQpInitAttr, pd), 64);
        assert_eq!(std::mem::offset_of!(ExpQpInitAttr, exp_create_flags), 80);
    }
}
