//! Queue descriptors (`nvm_queue_t`) and the ring index arithmetic the header's inline helpers
//! implement, for the library's own use (admin queues, `nvm_cq_dequeue_block`).

#![forbid(unsafe_code)]

use std::ffi::c_void;
use std::thread;
use std::time::{Duration, Instant};

use crate::abi::NvmQueue;
use crate::mmio::Ring;
use crate::regs;

#[allow(clippy::too_many_arguments)] // mirrors nvm_queue_clear plus the controller facts it reads
/// Fills a descriptor as `nvm_queue_clear` does. `db` is the doorbell address, or NULL when it
/// lies outside the register mapping.
pub fn clear(
    q: &mut NvmQueue,
    max_entries: u16,
    page_size: usize,
    mm: (*mut c_void, usize),
    dstrd: u8,
    cq: bool,
    no: u16,
    vaddr: *mut c_void,
    ioaddr: u64,
) {
    let entry_size: u16 = if cq { 16 } else { 64 };
    let per_page = (page_size / usize::from(entry_size)).min(usize::from(u16::MAX)) as u16;
    *q = NvmQueue {
        no,
        max_entries: max_entries.min(per_page),
        entry_size,
        head: 0,
        tail: 0,
        phase: 1,
        last: 0,
        db: doorbell_ptr(mm, dstrd, no, cq),
        vaddr,
        ioaddr,
    };
}

/// The doorbell address of queue `no` inside the mapping `mm` (base, length), or NULL when it
/// lies outside (upstream hands out a pointer past the mapping, spec §A11 #15).
pub fn doorbell_ptr(mm: (*mut c_void, usize), dstrd: u8, no: u16, cq: bool) -> *mut u32 {
    let off = regs::doorbell(dstrd, no, cq);
    if mm.0.is_null() || off + 4 > mm.1 {
        return std::ptr::null_mut();
    }
    mm.0.cast::<u8>().wrapping_add(off).cast()
}

/// `nvm_sq_enqueue`'s index part: the slot to fill, or `None` when the ring is full.
pub fn sq_enqueue(sq: &mut NvmQueue) -> Option<usize> {
    let n = u32::from(sq.max_entries);
    if n == 0 || (sq.tail + 1) % n == sq.head % n {
        return None;
    }
    let slot = sq.tail as usize;
    sq.tail += 1;
    if sq.tail == n {
        sq.tail = 0;
        sq.phase = i16::from(sq.phase == 0);
    }
    Some(slot)
}

/// `NVM_DEFAULT_CID`, evaluated after an enqueue.
pub fn default_cid(sq: &NvmQueue) -> u16 {
    (sq.tail + u32::from(sq.phase == 0) * u32::from(sq.max_entries)) as u16
}

/// `nvm_cq_poll`: the head slot if the controller has posted it.
pub fn cq_poll(cq: &NvmQueue, ring: &Ring) -> Option<usize> {
    let slot = cq.head as usize;
    let phase = ring.status(slot) & 1;
    (phase == (cq.phase as u16 & 1)).then_some(slot)
}

/// `nvm_cq_dequeue`.
pub fn cq_dequeue(cq: &mut NvmQueue, ring: &Ring) -> Option<usize> {
    let slot = cq_poll(cq, ring)?;
    cq.head += 1;
    if cq.head == u32::from(cq.max_entries) {
        cq.head = 0;
        cq.phase = i16::from(cq.phase == 0);
    }
    Some(slot)
}

/// `nvm_cq_dequeue_block`: polls until a completion arrives or `timeout_ms` of wall time pass
/// (upstream counts requested 1 ms sleeps, which under load stretches far beyond the timeout).
pub fn cq_dequeue_block(cq: &mut NvmQueue, ring: &Ring, timeout_ms: u64) -> Option<usize> {
    let deadline = Instant::now() + Duration::from_millis(timeout_ms);
    let mut spins = 0u32;
    loop {
        if let Some(slot) = cq_dequeue(cq, ring) {
            return Some(slot);
        }
        if Instant::now() >= deadline {
            return None;
        }
        spins += 1;
        if spins < 200 {
            thread::yield_now();
        } else {
            thread::sleep(Duration::from_micros(if spins < 2000 { 20 } else { 1000 }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(n: u16) -> NvmQueue {
        NvmQueue { max_entries: n, entry_size: 64, phase: 1, db: std::ptr::dangling_mut(), ..Default::default() }
    }

    #[test]
    fn enqueue_fills_n_minus_one_slots_for_any_size() {
        for n in [2u16, 3, 5, 64, 100] {
            let mut sq = q(n);
            let mut got = 0;
            while sq_enqueue(&mut sq).is_some() {
                got += 1;
            }
            assert_eq!(got, n - 1, "ring of {n}");
        }
    }

    #[test]
    fn first_default_cid_is_one_and_phase_flips_at_wrap() {
        let mut sq = q(4);
        sq_enqueue(&mut sq);
        assert_eq!(default_cid(&sq), 1);
        sq.tail = 3;
        sq.head = 1;
        assert_eq!(sq_enqueue(&mut sq), Some(3));
        assert_eq!((sq.tail, sq.phase), (0, 0));
        assert_eq!(default_cid(&sq), 4);
    }
}
