//! `gdsync/mlx5.h` helpers (spec §6.20–§6.22): the device addresses and values a CUDA kernel needs
//! to execute a prepared send or wait itself instead of through stream memory operations.

#![forbid(unsafe_code)]

use gpudirect_common::{Errno, Result};

use crate::abi::*;
use crate::engine::memops::PeerOp;
use crate::engine::ranges::Ranges;

fn empty_send() -> Mlx5SendInfo {
    Mlx5SendInfo { bits: 0, dbrec_ptr: std::ptr::null_mut(), dbrec_value: 0, db_ptr: std::ptr::null_mut(), db_value: 0 }
}

fn empty_wait() -> Mlx5WaitInfo {
    Mlx5WaitInfo { cond: 0, cqe_ptr: std::ptr::null_mut(), cqe_value: 0, flag_ptr: std::ptr::null_mut(), flag_value: 0 }
}

/// The doorbell-record store, optional fence and doorbell store of one send.
pub fn send_info(ops: &[PeerOp], ranges: &Ranges) -> Result<Mlx5SendInfo> {
    const F: &str = "gds_mlx5_get_send_info";
    let mut info = empty_send();
    for (i, op) in ops.iter().enumerate() {
        match op {
            PeerOp::Fence { flags } => {
                if flags & IBV_EXP_PEER_FENCE_OP_WRITE == 0 {
                    continue;
                }
                if flags & IBV_EXP_PEER_FENCE_FROM_HCA == 0 {
                    gds_err!(F, "op {i}: fence must be FROM_HCA");
                    return Err(Errno::EINVAL);
                }
                if flags & IBV_EXP_PEER_FENCE_MEM_PEER != 0 {
                    info.bits |= 1; // membar
                } else if flags & IBV_EXP_PEER_FENCE_MEM_SYS != 0 {
                    info.bits |= 2; // membar_full
                } else {
                    gds_err!(F, "op {i}: fence without memory scope");
                    return Err(Errno::EINVAL);
                }
            }
            PeerOp::StoreDword { data, target, offset } if i == 0 => {
                info.dbrec_ptr = ranges.get(*target)?.dev_addr(*offset, 4)? as *mut u32;
                info.dbrec_value = *data;
            }
            PeerOp::StoreQword { data, target, offset } if i == 2 => {
                info.db_ptr = ranges.get(*target)?.dev_addr(*offset, 8)? as *mut u64;
                info.db_value = *data;
            }
            PeerOp::CopyBlock { data, target, offset } => {
                if !(8..=64).contains(&data.len()) {
                    gds_err!(F, "op {i}: COPY_BLOCK of {} bytes (need 8..64)", data.len());
                    return Err(Errno::EINVAL);
                }
                info.db_ptr = ranges.get(*target)?.dev_addr(*offset, 8)? as *mut u64;
                info.db_value = u64::from_ne_bytes(data[..8].try_into().map_err(|_| Errno::EINVAL)?);
            }
            other => {
                gds_err!(F, "op {i}: unexpected {other:?} in a send request");
                return Err(Errno::EINVAL);
            }
        }
    }
    Ok(info)
}

/// The CQE poll and the busy-flag release of one wait.
pub fn wait_info(ops: &[PeerOp], ranges: &Ranges) -> Result<Mlx5WaitInfo> {
    const F: &str = "gds_mlx5_get_wait_info";
    let mut info = empty_wait();
    for (i, op) in ops.iter().enumerate() {
        match op {
            PeerOp::Fence { flags }
                if flags & IBV_EXP_PEER_FENCE_OP_WRITE == 0 && flags & IBV_EXP_PEER_FENCE_FROM_HCA != 0 => {}
            PeerOp::StoreDword { data, target, offset } if i == 1 => {
                info.flag_ptr = ranges.get(*target)?.dev_addr(*offset, 4)? as *mut u32;
                info.flag_value = *data;
            }
            PeerOp::Poll { op, data, target, offset } => {
                info.cqe_ptr = ranges.get(*target)?.dev_addr(*offset, 4)? as *mut u32;
                info.cqe_value = *data;
                info.cond = match *op {
                    IBV_EXP_PEER_OP_POLL_NOR_DWORD => GDS_WAIT_COND_NOR,
                    IBV_EXP_PEER_OP_POLL_AND_DWORD => GDS_WAIT_COND_AND,
                    _ => GDS_WAIT_COND_GEQ,
                };
            }
            other => {
                gds_err!(F, "op {i}: unexpected {other:?} in a wait request");
                return Err(Errno::EINVAL);
            }
        }
    }
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::ranges::Range;

    #[test]
    fn send_info_of_the_mlx5_three_op_list() {
        let r = Ranges::default();
        let dbr = r.register(Range { cpu: 0x5000, dev: 0xd000, len: 64 });
        let bf = r.register(Range { cpu: 0x6000, dev: 0xb000, len: 4096 });
        let mut ops = vec![
            PeerOp::StoreDword { data: 0x0300_0000, target: dbr, offset: 4 },
            PeerOp::Fence {
                flags: IBV_EXP_PEER_FENCE_OP_WRITE | IBV_EXP_PEER_FENCE_FROM_HCA | IBV_EXP_PEER_FENCE_MEM_SYS,
            },
            PeerOp::StoreQword { data: 0xabcd, target: bf, offset: 256 },
        ];
        let i = send_info(&ops, &r).unwrap();
        assert_eq!(i.bits, 2);
        assert_eq!(i.dbrec_ptr as u64, 0xd004);
        assert_eq!(i.dbrec_value, 0x0300_0000);
        assert_eq!(i.db_ptr as u64, 0xb100);
        assert_eq!(i.db_value, 0xabcd);
        assert_eq!(send_info(&[], &r).unwrap(), empty_send(), "no ops: all zero");
        ops.swap(0, 2);
        assert_eq!(send_info(&ops, &r), Err(Errno::EINVAL), "ops out of their places");
        let poll = [PeerOp::Poll { op: IBV_EXP_PEER_OP_POLL_GEQ_DWORD, data: 0, target: dbr, offset: 0 }];
        assert_eq!(send_info(&poll, &r), Err(Errno::EINVAL));
    }

    #[test]
    fn wait_info_of_the_mlx5_two_op_list() {
        let r = Ranges::default();
        let cq = r.register(Range { cpu: 0x8000, dev: 0xc000, len: 4096 });
        let fl = r.register(Range { cpu: 0x9000, dev: 0xf000, len: 64 });
        let ops = vec![
            PeerOp::Poll { op: IBV_EXP_PEER_OP_POLL_NOR_DWORD, data: 0xfeff_ffff, target: cq, offset: 124 },
            PeerOp::StoreDword { data: 0, target: fl, offset: 16 },
        ];
        let i = wait_info(&ops, &r).unwrap();
        assert_eq!((i.cond, i.cqe_ptr as u64, i.cqe_value), (GDS_WAIT_COND_NOR, 0xc07c, 0xfeff_ffff));
        assert_eq!((i.flag_ptr as u64, i.flag_value), (0xf010, 0));
        let bad = [PeerOp::StoreQword { data: 0, target: fl, offset: 0 }];
        assert_eq!(wait_info(&bad, &r), Err(Errno::EINVAL));
        let bad = [PeerOp::Fence {
            flags: IBV_EXP_PEER_FENCE_OP_WRITE | IBV_EXP_PEER_FENCE_FROM_HCA | IBV_EXP_PEER_FENCE_MEM_SYS,
        }];
        assert_eq!(wait_info(&bad, &r), Err(Errno::EINVAL));
    }
}
