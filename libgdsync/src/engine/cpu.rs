//! CPU execution of descriptors and peer-op lists (`gds_post_descriptors`, spec §5.4 and §6.19):
//! volatile loads and stores on CPU-visible addresses, store fences where barriers are asked for.
//! This is the only module that touches application memory through raw addresses.

use gpudirect_common::{Errno, Result};

use crate::abi::*;
use crate::engine::memops::{Desc, PeerOp};
use crate::engine::ranges::Ranges;

/// A store fence: orders earlier stores before later ones for other agents (HCA, GPU).
fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: sfence has no operands and no preconditions.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
    #[cfg(not(target_arch = "x86_64"))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// Whether a 32-bit word satisfies a wait condition (the GPU's semantics, cuda.h).
pub fn condition_holds(cond: u32, v: u32, value: u32) -> Option<bool> {
    Some(match cond {
        GDS_WAIT_COND_GEQ => (v.wrapping_sub(value) as i32) >= 0,
        GDS_WAIT_COND_EQ => v == value,
        GDS_WAIT_COND_AND => v & value != 0,
        GDS_WAIT_COND_NOR => !(v | value) != 0,
        _ => return None,
    })
}

/// Spins until the word at `addr` satisfies `cond` against `value`.
///
/// # Safety
/// `addr` must be a 4-byte aligned address of a u32 readable by the CPU for the whole wait.
unsafe fn spin(addr: usize, cond: u32, value: u32) {
    loop {
        // SAFETY: guaranteed by the caller.
        let v = unsafe { std::ptr::read_volatile(addr as *const u32) };
        if condition_holds(cond, v, value) == Some(true) {
            return;
        }
        std::hint::spin_loop();
    }
}

fn check_align(addr: usize, a: usize) -> Result<()> {
    crate::engine::memops::check_aligned("gds_post_descriptors", "address", addr as u64, a as u64)
}

fn check_cpu_mem_type(flags: i32) -> Result<()> {
    match flags & GDS_MEMORY_MASK {
        GDS_MEMORY_GPU | GDS_MEMORY_HOST | GDS_MEMORY_IO => Ok(()),
        t => {
            gds_err!("gds_post_descriptors", "invalid memory type {t:#x}");
            Err(Errno::EINVAL)
        }
    }
}

/// Executes a provider's op list on the CPU.
///
/// # Safety
/// Every registered range the ops name must be live CPU-accessible memory.
pub unsafe fn peer_ops(ops: &[PeerOp], ranges: &Ranges) -> Result<()> {
    const F: &str = "gds_post_ops_on_cpu";
    for (i, op) in ops.iter().enumerate() {
        match op {
            PeerOp::Fence { flags } => {
                if flags & IBV_EXP_PEER_FENCE_OP_WRITE == 0 {
                    gds_warn_once!(F, "read fences are not supported on the CPU, ignored");
                } else if flags & IBV_EXP_PEER_FENCE_FROM_HCA == 0 {
                    gds_err!(F, "op {i}: fence must be FROM_HCA (flags {flags:#x})");
                    return Err(Errno::EINVAL);
                } else if flags & (IBV_EXP_PEER_FENCE_MEM_PEER | IBV_EXP_PEER_FENCE_MEM_SYS) != 0 {
                    store_fence();
                } else {
                    gds_err!(F, "op {i}: fence without memory scope (flags {flags:#x})");
                    return Err(Errno::EINVAL);
                }
            }
            PeerOp::StoreDword { data, target, offset } => {
                let a = ranges.get(*target)?.cpu_addr(*offset, 4)?;
                check_align(a, 4)?;
                // SAFETY: inside a registered live range (caller's contract), aligned, bounds-checked.
                unsafe { std::ptr::write_volatile(a as *mut u32, *data) };
            }
            PeerOp::StoreQword { data, target, offset } => {
                let a = ranges.get(*target)?.cpu_addr(*offset, 8)?;
                check_align(a, 8)?;
                // SAFETY: as above.
                unsafe { std::ptr::write_volatile(a as *mut u64, *data) };
            }
            PeerOp::CopyBlock { data, target, offset } => {
                if data.len() % 8 != 0 || data.len() >= 128 {
                    gds_err!(F, "op {i}: COPY_BLOCK of {} bytes (need a multiple of 8 below 128)", data.len());
                    return Err(Errno::EINVAL);
                }
                let a = ranges.get(*target)?.cpu_addr(*offset, data.len())?;
                check_align(a, 8)?;
                for (k, chunk) in data.chunks_exact(8).enumerate() {
                    let w = u64::from_ne_bytes(chunk.try_into().unwrap_or_default());
                    // SAFETY: as above; k*8+8 <= data.len() was bounds-checked.
                    unsafe { std::ptr::write_volatile((a + 8 * k) as *mut u64, w) };
                }
            }
            PeerOp::Poll { op, data, target, offset } => {
                let a = ranges.get(*target)?.cpu_addr(*offset, 4)?;
                check_align(a, 4)?;
                let cond = match *op {
                    IBV_EXP_PEER_OP_POLL_AND_DWORD => GDS_WAIT_COND_AND,
                    IBV_EXP_PEER_OP_POLL_NOR_DWORD => GDS_WAIT_COND_NOR,
                    _ => GDS_WAIT_COND_GEQ,
                };
                // SAFETY: as above.
                unsafe { spin(a, cond, *data) };
            }
            PeerOp::Other(t) => {
                gds_err!(F, "op {i}: unsupported peer op type {t}");
                return Err(Errno::EINVAL);
            }
        }
    }
    Ok(())
}

/// `gds_post_descriptors`: executes each descriptor in order, stopping at the first error.
///
/// # Safety
/// Every pointer in the descriptors (and every range their op lists name) must be memory the CPU
/// can access as the descriptor says (read for waits and copy sources, write for writes).
pub unsafe fn execute(descs: &[Desc], ranges: &Ranges) -> Result<()> {
    const F: &str = "gds_post_descriptors";
    for (i, d) in descs.iter().enumerate() {
        let r = match d {
            // SAFETY: the caller's contract covers the ranges.
            Desc::Send(ops) | Desc::Wait(ops) => unsafe { peer_ops(ops, ranges) },
            &Desc::WaitValue32 { ptr, value, cond, flags } => (|| {
                if flags & !(GDS_WAIT_POST_FLUSH_REMOTE | GDS_MEMORY_MASK) != 0 {
                    gds_err!(F, "invalid wait flags {flags:#x}");
                    return Err(Errno::EINVAL);
                }
                if flags & GDS_WAIT_POST_FLUSH_REMOTE != 0 {
                    gds_warn_once!(F, "GDS_WAIT_POST_FLUSH_REMOTE is not supported on the CPU, ignored");
                }
                check_cpu_mem_type(flags)?;
                if condition_holds(cond, 0, value).is_none() {
                    gds_err!(F, "invalid wait condition {cond}");
                    return Err(Errno::EINVAL);
                }
                check_align(ptr, 4)?;
                if ptr == 0 {
                    return Err(Errno::EINVAL);
                }
                // SAFETY: caller's contract: ptr is a readable u32; aligned and non-NULL checked.
                unsafe { spin(ptr, cond, value) };
                Ok(())
            })(),
            &Desc::WriteValue32 { ptr, value, flags } => (|| {
                if flags & !(GDS_WRITE_PRE_BARRIER_SYS | GDS_MEMORY_MASK) != 0 {
                    gds_err!(F, "invalid write flags {flags:#x}");
                    return Err(Errno::EINVAL);
                }
                check_cpu_mem_type(flags)?;
                check_align(ptr, 4)?;
                if ptr == 0 {
                    return Err(Errno::EINVAL);
                }
                if flags & GDS_WRITE_PRE_BARRIER_SYS != 0 {
                    store_fence();
                }
                // SAFETY: caller's contract: ptr is a writable u32; aligned and non-NULL checked.
                unsafe { std::ptr::write_volatile(ptr as *mut u32, value) };
                Ok(())
            })(),
            &Desc::WriteMemory { dest, src, count, flags } => (|| {
                if flags & !(GDS_WRITE_MEMORY_POST_BARRIER_SYS | GDS_WRITE_MEMORY_PRE_BARRIER_SYS | GDS_MEMORY_MASK)
                    != 0
                {
                    gds_err!(F, "invalid write-memory flags {flags:#x}");
                    return Err(Errno::EINVAL);
                }
                check_cpu_mem_type(flags)?;
                if count == 0 {
                    return Ok(());
                }
                if dest == 0 || src == 0 {
                    return Err(Errno::EINVAL);
                }
                if flags & GDS_WRITE_MEMORY_PRE_BARRIER_SYS != 0 {
                    store_fence();
                }
                if flags & GDS_MEMORY_MASK == GDS_MEMORY_IO {
                    // I/O memory: byte-wise volatile stores, never a vectorised memcpy.
                    for k in 0..count {
                        // SAFETY: caller's contract: src readable and dest writable for count bytes.
                        unsafe {
                            std::ptr::write_volatile((dest + k) as *mut u8, std::ptr::read((src + k) as *const u8))
                        };
                    }
                } else {
                    // SAFETY: caller's contract: src readable and dest writable for `count` bytes;
                    // `copy` tolerates overlap.
                    unsafe { std::ptr::copy(src as *const u8, dest as *mut u8, count) };
                }
                if flags & GDS_WRITE_MEMORY_POST_BARRIER_SYS != 0 {
                    store_fence();
                }
                Ok(())
            })(),
        };
        if let Err(e) = r {
            gds_err!(F, "descriptor {i} failed: {e}");
            return Err(e);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::ranges::Range;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn conditions_follow_cuda_semantics() {
        assert_eq!(condition_holds(GDS_WAIT_COND_GEQ, 5, 5), Some(true));
        assert_eq!(condition_holds(GDS_WAIT_COND_GEQ, 4, 5), Some(false));
        assert_eq!(condition_holds(GDS_WAIT_COND_GEQ, 1, 0xffff_fff0), Some(true), "cyclic compare");
        assert_eq!(condition_holds(GDS_WAIT_COND_EQ, 7, 7), Some(true));
        assert_eq!(condition_holds(GDS_WAIT_COND_AND, 6, 1), Some(false));
        assert_eq!(condition_holds(GDS_WAIT_COND_AND, 7, 1), Some(true));
        assert_eq!(condition_holds(GDS_WAIT_COND_NOR, 0xffff_fffe, 0), Some(true));
        assert_eq!(condition_holds(GDS_WAIT_COND_NOR, 0xffff_fffe, 1), Some(false));
        assert_eq!(condition_holds(4, 0, 0), None);
    }

    #[test]
    fn cpu_wait_returns_once_another_thread_writes() {
        let word = Arc::new(AtomicU32::new(0));
        let out = Box::new(0u32);
        let w = Arc::clone(&word);
        let t = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            w.store(3, Ordering::Release);
        });
        let d = [
            Desc::WaitValue32 { ptr: word.as_ptr() as usize, value: 3, cond: GDS_WAIT_COND_EQ, flags: GDS_MEMORY_HOST },
            Desc::WriteValue32 {
                ptr: &*out as *const u32 as usize,
                value: 9,
                flags: GDS_MEMORY_HOST | GDS_WRITE_PRE_BARRIER_SYS,
            },
        ];
        // SAFETY: both pointers are live for the call.
        unsafe { execute(&d, &Ranges::default()) }.unwrap();
        t.join().unwrap();
        // SAFETY: `out` is live; volatile read because the write went through a raw address.
        assert_eq!(unsafe { std::ptr::read_volatile(&*out) }, 9);
    }

    #[test]
    fn cpu_rejects_what_upstream_let_through() {
        let x = Box::new(0u32);
        let p = &*x as *const u32 as usize;
        let r = Ranges::default();
        // Invalid condition: upstream returned 0 here.
        let d = [Desc::WaitValue32 { ptr: p, value: 0, cond: 9, flags: GDS_MEMORY_HOST }];
        // SAFETY: p is live.
        assert_eq!(unsafe { execute(&d, &r) }, Err(Errno::EINVAL));
        let d = [Desc::WriteValue32 { ptr: p, value: 0, flags: 0 }];
        // SAFETY: p is live.
        assert_eq!(unsafe { execute(&d, &r) }, Err(Errno::EINVAL));
        let d = [Desc::WriteValue32 { ptr: p + 1, value: 0, flags: GDS_MEMORY_HOST }];
        // SAFETY: rejected before any access.
        assert_eq!(unsafe { execute(&d, &r) }, Err(Errno::EINVAL));
    }

    #[test]
    fn write_memory_and_peer_ops_on_the_cpu() {
        let mut dst = vec![0u8; 64];
        let src: Vec<u8> = (1..=64).collect();
        let d = [Desc::WriteMemory {
            dest: dst.as_mut_ptr() as usize,
            src: src.as_ptr() as usize,
            count: 64,
            flags: GDS_MEMORY_IO | GDS_WRITE_MEMORY_POST_BARRIER_SYS,
        }];
        // SAFETY: both buffers are live and 64 bytes long.
        unsafe { execute(&d, &Ranges::default()) }.unwrap();
        assert_eq!(dst, src);

        let mut mem = vec![0u64; 8];
        let r = Ranges::default();
        let id = r.register(Range { cpu: mem.as_mut_ptr() as usize, dev: 0, len: 64 });
        let ops = vec![
            PeerOp::StoreDword { data: 0xaabbccdd, target: id, offset: 4 },
            PeerOp::Fence {
                flags: IBV_EXP_PEER_FENCE_OP_WRITE | IBV_EXP_PEER_FENCE_FROM_HCA | IBV_EXP_PEER_FENCE_MEM_SYS,
            },
            PeerOp::StoreQword { data: 0x1122334455667788, target: id, offset: 8 },
            PeerOp::CopyBlock { data: vec![0xee; 16], target: id, offset: 16 },
            PeerOp::Poll { op: IBV_EXP_PEER_OP_POLL_GEQ_DWORD, data: 0xaabbccdd, target: id, offset: 4 },
        ];
        // SAFETY: the range is `mem`, live for the call.
        unsafe { execute(&[Desc::Send(ops)], &r) }.unwrap();
        assert_eq!(mem[0] >> 32, 0xaabbccdd);
        assert_eq!(mem[1], 0x1122334455667788);
        assert_eq!(mem[2], 0xeeeeeeeeeeeeeeee);
        let bad = vec![PeerOp::Fence {
            flags: IBV_EXP_PEER_FENCE_OP_WRITE | IBV_EXP_PEER_FENCE_FROM_CPU | IBV_EXP_PEER_FENCE_MEM_SYS,
        }];
        // SAFETY: rejected before any access.
        assert_eq!(unsafe { execute(&[Desc::Wait(bad)], &r) }, Err(Errno::EINVAL));
        let bad = vec![PeerOp::StoreQword { data: 0, target: id, offset: 60 }];
        // SAFETY: rejected by the bounds check before any access.
        assert_eq!(unsafe { execute(&[Desc::Send(bad)], &r) }, Err(Errno::EINVAL));
    }
}
