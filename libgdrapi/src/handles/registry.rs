//! The C side's view of instances and handles.
//!
//! Upstream hands out raw pointers and dereferences whatever comes back, so a stale or foreign
//! `gdr_t`/`gdr_mh_t` is undefined behaviour there. Here every value C holds is the address of a
//! slot in one of two reserved regions ([`super::slab`]): a value that is not a live slot is EINVAL,
//! never a dereference of freed memory. Freed slots are quarantined before reuse, for instances as
//! for handles, so a stale value does not alias a new one for a long while.
//!
//! The slots keep upstream's layout where upstream's own test programs read it (spec §1.8): the
//! `gdr_t` slot starts with `struct gdr` (fd at offset 0, 48 bytes) and the handle slot with the
//! handle record (kernel handle at offset 24, 104 bytes).
//!
//! Two paths:
//! - the control path (open, close, pin, unpin, map, unmap, queries) runs under one mutex,
//!   [`lock`]: these calls make system calls anyway, and one lock makes their interleavings
//!   simple to reason about;
//! - the copy path ([`mapping_of`]) takes no lock: it validates the handle's address, announces
//!   itself ([`super::grace`]), and reads the mapping mirrored in the handle's slot. The control
//!   path ([`super::control`]) retracts that mirror, then unmaps at once if no copy can still be
//!   using the mapping, or parks it ([`super::parking`]).
//!
//! The registry writes the fast path's mirror, so it owns its format ([`FastWindow`],
//! [`window_limit`], [`SLACK`]); `fastcopy` only reads it.

use std::cell::UnsafeCell;
use std::ffi::c_int;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use gpudirect_common::{Errno, Result};

use super::grace::{self, Announced, Exit};
use super::slab::{Allocator, Region, Slot, SlotIndex};
use super::thread_words;
use crate::abi::MappingType;
use crate::conditions;
use crate::core::{Instance, Pin};
use crate::cpu_mapping::CpuMapping;

/// The first 48 bytes of upstream's `struct gdr`.
#[repr(C)]
#[derive(Debug, Default)]
pub struct GdrHeader {
    pub fd: c_int,
    pub list_head: usize,
    pub page_size: usize,
    pub page_mask: usize,
    pub page_shift: u8,
    pub gdrdrv_version: u32,
    pub backend: u32,
}

/// Upstream's handle record (`gdr_memh_t`, 104 bytes); `gdr_mh_t.h` points at one of these.
#[repr(C)]
#[derive(Debug, Default)]
pub struct HandleRecord {
    pub next: usize,
    pub prev: usize,
    pub mapping_type: u32,
    /// Backend words from offset 24: gdrdrv stores the 32-bit kernel handle in the first.
    pub words: [u64; 10],
}

/// A `gdr_t` points here.
#[repr(C, align(64))]
struct InstanceSlot {
    header: UnsafeCell<GdrHeader>,
    /// Non-zero while the instance is open.
    open: AtomicU64,
}

/// A `gdr_mh_t.h` points here: the record C may read, then the mirror the copy paths read.
#[repr(C, align(64))]
struct HandleSlot {
    record: UnsafeCell<HandleRecord>,
    /// [`PINNED`], [`MAPPED`] and the mapping type in the low [`LEN_SHIFT`] bits, the mapping's
    /// length above them: what the general copy path reads, one load.
    state: AtomicU64,
    map_addr: AtomicUsize,
    /// The fast path's window limit ([`window_limit`] of the mapping's length)
    /// while copies may take the fast path (`crate::fastcopy`: a live write-combined mapping,
    /// nothing process-wide against it), else 0. Set after `map_addr`, cleared before anything
    /// else changes, so the fast path needs two loads and no compare of its own: a zero limit
    /// makes its window check fail.
    fast_lim: AtomicUsize,
}

// SAFETY: all-zero bytes are valid for both (plain integers and atomics); the UnsafeCells are
// written only under the control mutex; alignment 64 divides 4096.
unsafe impl Slot for InstanceSlot {}
// SAFETY: as above.
unsafe impl Slot for HandleSlot {}
// SAFETY: the UnsafeCell contents are written only under the control mutex and read by C (upstream
// tests) after the call that wrote them returned.
unsafe impl Sync for InstanceSlot {}
// SAFETY: as above.
unsafe impl Sync for HandleSlot {}

const PINNED: u64 = 1;
const MAPPED: u64 = 2;
const TYPE_SHIFT: u32 = 2;
const LEN_SHIFT: u32 = 8;

/// A state word: `bits` and a mapping length (a user-space length, far below 2^56).
fn state_word(bits: u64, len: usize) -> u64 {
    bits | (len as u64) << LEN_SHIFT
}

fn bits_of(state: u64) -> u64 {
    state & ((1 << LEN_SHIFT) - 1)
}

fn len_of(state: u64) -> usize {
    (state >> LEN_SHIFT) as usize
}

/// The state bits of a handle mapped write-combined.
const WC_MAPPED: u64 = PINNED | MAPPED | (MappingType::WriteCombined as u64) << TYPE_SHIFT;

/// Room for 64 Ki open instances and 1 Mi pinned handles; only what is used is ever touched.
static INSTANCES: Region<InstanceSlot> = Region::new(1 << 16);
static HANDLES: Region<HandleSlot> = Region::new(1 << 20);

const _: () = assert!(size_of::<InstanceSlot>() == 64 && size_of::<HandleSlot>() == 128);

/// A live handle: its pin, its instance's slot index, and its own slot.
type HandleEntry = (Arc<Pin>, usize, SlotIndex<HandleSlot>);

/// Everything behind the control mutex.
pub(crate) struct Tables {
    instance_slots: Allocator,
    handle_slots: Allocator,
    /// By instance slot index.
    instances: Vec<Option<Instance>>,
    /// By handle slot index.
    handles: Vec<Option<HandleEntry>>,
    /// Whether the handles' `fast_lim` mirrors were last set for a process that allows the fast
    /// copy path ([`conditions::allowed`]).
    fast_allowed: bool,
}

static CONTROL: Mutex<Tables> = Mutex::new(Tables {
    instance_slots: Allocator::new(),
    handle_slots: Allocator::new(),
    instances: Vec::new(),
    handles: Vec::new(),
    fast_allowed: true,
});

/// The control path's lock. Releasing it brings every handle's fast-path mirror in line with the
/// process-wide conditions ([`Tables::sync_fast_paths`]), whatever the control call changed.
pub(crate) struct Control(MutexGuard<'static, Tables>);

impl std::ops::Deref for Control {
    type Target = Tables;
    fn deref(&self) -> &Tables {
        &self.0
    }
}

impl std::ops::DerefMut for Control {
    fn deref_mut(&mut self) -> &mut Tables {
        &mut self.0
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        self.0.sync_fast_paths();
    }
}

/// Takes the control path's lock.
pub(crate) fn lock() -> Control {
    Control(CONTROL.lock().unwrap_or_else(|p| p.into_inner()))
}

thread_local! {
    /// The control lock held across a `fork` by the forking thread (see [`lock_across_fork`]).
    static HELD_FOR_FORK: std::cell::RefCell<Option<Control>> = const { std::cell::RefCell::new(None) };
}

/// A fork copies only the calling thread: a lock another thread held at that moment would stay
/// locked in the child forever, and the child's next `gdr_*` call would hang. So the forking
/// thread takes the control lock before the fork and both sides release it afterwards; the child
/// then finds the tables consistent (no control call was half done). Registered once, at the first
/// `gdr_open`.
fn lock_across_fork() {
    extern "C" fn prepare() {
        let g = lock();
        HELD_FOR_FORK.with(|h| *h.borrow_mut() = Some(g));
    }
    extern "C" fn release() {
        HELD_FOR_FORK.with(|h| drop(h.borrow_mut().take()));
    }
    extern "C" fn child() {
        // The other threads' lines name what they last copied through, and those threads do not
        // exist here: left alone, they would keep every such mapping parked in the child.
        grace::forget_other_threads();
        release();
    }
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: the handlers are plain functions of this library that only take or drop the
        // control lock and (in the child) clear grace lines; glibc unregisters them when the
        // library is unloaded.
        let r = unsafe { libc::pthread_atfork(Some(prepare), Some(release), Some(child)) };
        if r != 0 {
            gdr_warn!("pthread_atfork failed ({r}): a fork during a control call may hang the child");
        }
    });
}

fn put<T>(v: &mut Vec<Option<T>>, i: usize, x: T) {
    if v.len() <= i {
        v.resize_with(i + 1, || None);
    }
    v[i] = Some(x);
}

/// A validated `gdr_mh_t`: its slot index and pin.
pub(crate) struct Handle {
    index: SlotIndex<HandleSlot>,
    pub(crate) pin: Arc<Pin>,
}

impl Handle {
    /// The `gdr_mh_t.h` value: the slot's address, also the key copies announce.
    pub(crate) fn key(&self) -> usize {
        HANDLES.addr_of(self.index)
    }
}

impl Tables {
    /// Registers a new instance; returns the `gdr_t` value.
    pub(crate) fn add_instance(&mut self, instance: Instance) -> Result<usize> {
        grace::init();
        lock_across_fork();
        let i = self.instance_slots.alloc(&INSTANCES)?;
        let page = instance.page();
        let slot = INSTANCES.get(i);
        // SAFETY: we hold the control mutex, the only writer; the slot is not live, so no C code
        // holds its address.
        unsafe {
            *slot.header.get() = GdrHeader {
                fd: instance.raw_fd(),
                list_head: 0,
                page_size: page.size,
                page_mask: page.mask(),
                page_shift: page.shift,
                gdrdrv_version: instance.recorded_driver_version(),
                backend: u32::from(instance.uses_dma_buf()),
            };
        }
        slot.open.store(1, Ordering::Release);
        put(&mut self.instances, i.get(), instance);
        Ok(INSTANCES.addr_of(i))
    }

    fn instance_index(&self, g: usize) -> Result<SlotIndex<InstanceSlot>> {
        match INSTANCES.index_of(g) {
            Some(i) if self.instances.get(i.get()).is_some_and(Option::is_some) => Ok(i),
            _ => {
                gdr_err!("invalid gdr_t {g:#x} (not open, or already closed)");
                Err(Errno::EINVAL)
            }
        }
    }

    /// The instance behind a `gdr_t`.
    pub(crate) fn instance(&self, g: usize) -> Result<&Instance> {
        let i = self.instance_index(g)?;
        Ok(self.instances[i.get()].as_ref().expect("checked"))
    }

    /// Unregisters an instance whose handles are all gone; returns it for the final drop.
    pub(crate) fn remove_instance(&mut self, g: usize) -> Result<Instance> {
        let i = self.instance_index(g)?;
        INSTANCES.get(i).open.store(0, Ordering::Release);
        self.instance_slots.free(i);
        Ok(self.instances[i.get()].take().expect("checked"))
    }

    /// Registers a pin of instance `g`; returns the `gdr_mh_t.h` value.
    pub(crate) fn add_handle(&mut self, g: usize, pin: Arc<Pin>) -> Result<usize> {
        let owner = self.instance_index(g)?.get();
        let i = self.handle_slots.alloc(&HANDLES)?;
        let slot = HANDLES.get(i);
        let mut record = HandleRecord::default();
        if let Some(h) = pin.kernel_handle() {
            // Upstream keeps the kernel handle as a uint32_t at offset 24.
            record.words[0] = u64::from(h as u32);
        }
        // SAFETY: control mutex held; the slot is not live.
        unsafe { *slot.record.get() = record };
        slot.map_addr.store(0, Ordering::Relaxed);
        slot.fast_lim.store(0, Ordering::Relaxed);
        slot.state.store(PINNED, Ordering::Release);
        put(&mut self.handles, i.get(), (pin, owner, i));
        Ok(HANDLES.addr_of(i))
    }

    /// The pin behind handle `h`, checking that it belongs to `g`.
    pub(crate) fn handle(&self, g: usize, h: usize) -> Result<Handle> {
        let owner = self.instance_index(g)?.get();
        let entry = HANDLES.index_of(h).and_then(|i| Some((i, self.handles.get(i.get())?.as_ref()?)));
        match entry {
            Some((index, (pin, o, _))) if *o == owner => Ok(Handle { index, pin: pin.clone() }),
            Some(_) => {
                gdr_err!("handle {h:#x} belongs to another gdr_t");
                Err(Errno::EINVAL)
            }
            None => {
                gdr_err!("invalid handle {h:#x} (not pinned, or already unpinned)");
                Err(Errno::EINVAL)
            }
        }
    }

    /// The live handles of instance `g`, most recent first.
    pub(crate) fn handles_of(&self, g: usize) -> Result<Vec<Handle>> {
        let owner = self.instance_index(g)?.get();
        let inst = self.instances[owner].as_ref().expect("checked");
        let mut v: Vec<Handle> = self
            .handles
            .iter()
            .filter_map(|e| match e {
                Some((pin, o, index)) if *o == owner => Some(Handle { index: *index, pin: pin.clone() }),
                _ => None,
            })
            .collect();
        let order = inst.live_pins();
        v.sort_by_key(|h| std::cmp::Reverse(order.iter().position(|p| Arc::ptr_eq(p, &h.pin))));
        Ok(v)
    }

    /// Shows a new mapping of `h` to the copy paths (and in the record, where upstream keeps it).
    pub(crate) fn publish_mapping(&self, h: &Handle, m: CpuMapping, t: MappingType) {
        let slot = HANDLES.get(h.index);
        slot.map_addr.store(m.addr, Ordering::Relaxed);
        // SAFETY: control mutex held.
        unsafe { (*slot.record.get()).mapping_type = t as u32 };
        slot.state.store(state_word(PINNED | MAPPED | (t as u64) << TYPE_SHIFT, m.len), Ordering::Release);
        slot.show_fast(conditions::allowed());
    }

    /// Hides `h`'s mapping from the copy paths. Returns what was published (to restore it if
    /// unmapping fails) and how the range must leave ([`Exit::Parked`] while a copy may still
    /// use it, [`grace::retire`]); `None` if it was not mapped.
    pub(crate) fn retract_mapping(&self, h: &Handle) -> Option<(CpuMapping, MappingType, Exit)> {
        let slot = HANDLES.get(h.index);
        slot.fast_lim.store(0, Ordering::SeqCst);
        let old = slot.state.swap(PINNED, Ordering::AcqRel);
        if bits_of(old) & MAPPED == 0 {
            return None;
        }
        let key = h.key();
        let exit = grace::retire(key);
        // SAFETY: control mutex held.
        unsafe { (*slot.record.get()).mapping_type = MappingType::None as u32 };
        let m = CpuMapping { addr: slot.map_addr.load(Ordering::Relaxed), len: len_of(old) };
        Some((m, type_of(old), exit))
    }

    /// Forgets an unpinned handle. Its mapping must have been retracted.
    pub(crate) fn remove_handle(&mut self, h: Handle) {
        let slot = HANDLES.get(h.index);
        debug_assert_eq!(slot.state.load(Ordering::Relaxed) & MAPPED, 0);
        slot.state.store(0, Ordering::Release);
        self.handles[h.index.get()] = None;
        self.handle_slots.free(h.index);
    }

    /// Shows or hides every live write-combined mapping to the fast copy path after the
    /// process-wide conditions for it changed (several mapping types live, no `membarrier`). Only
    /// a change walks the handles. Hiding needs no grace period: the mappings stay mapped, and a
    /// copy already past the check finishes as it would have a moment earlier.
    fn sync_fast_paths(&mut self) {
        let allowed = conditions::allowed();
        if allowed == self.fast_allowed {
            return;
        }
        self.fast_allowed = allowed;
        for (_, _, i) in self.handles.iter().flatten() {
            HANDLES.get(*i).show_fast(allowed);
        }
    }
}

impl HandleSlot {
    /// Sets the fast path's mirror from the published state: the window limit of a live
    /// write-combined mapping when `allowed`, else 0. Control mutex held.
    fn show_fast(&self, allowed: bool) {
        let state = self.state.load(Ordering::Relaxed);
        let lim = if allowed && bits_of(state) == WC_MAPPED { window_limit(len_of(state)) } else { 0 };
        self.fast_lim.store(lim, Ordering::Release);
    }
}

fn type_of(state: u64) -> MappingType {
    MappingType::from_raw((bits_of(state) >> TYPE_SHIFT) as u32 & 3).unwrap_or(MappingType::None)
}

/// The copy path: the live mapping of handle `h`, protected from being unmapped until the
/// returned announcement is dropped; `None` for anything else (see [`mapping_of`] for why). No
/// lock, no read-modify-write, no allocation after the thread's first copy, nothing that panics.
#[inline(always)]
pub(crate) fn mapped(h: usize) -> Option<(Announced, CpuMapping, MappingType)> {
    let slot = HANDLES.get_at(HANDLES.index_of(h)?, h);
    let announced = grace::announce(h);
    remember_handles();
    let state = slot.state.load(Ordering::Acquire);
    if state & MAPPED == 0 {
        return None;
    }
    let m = CpuMapping { addr: slot.map_addr.load(Ordering::Relaxed), len: len_of(state) };
    Some((announced, m, type_of(state)))
}

/// Keeps the handle region's bounds in this thread's words, where the fast path checks handles
/// against them ([`Mirror::known_to`]). Only while the thread has a grace line (the words' count
/// also stands for that): the general copy path calls this after announcing itself.
fn remember_handles() {
    let t = thread_words::mine();
    debug_assert!(!t.line.get().is_null());
    let (base, count) = HANDLES.bounds();
    t.handles_base.set(base);
    t.handles_limit.set(count);
}

/// A handle slot as the public copy calls' fast path reads it (`crate::fastcopy`).
#[derive(Clone, Copy)]
pub(crate) struct Mirror(&'static HandleSlot);

/// Offsets at the end of a mapping where an 8-byte access would not fit: the window limit of a
/// mapping of `len` bytes is `len - SLACK`.
pub(crate) const SLACK: usize = 7;

/// The fast path's window limit for a mapping of `len` bytes: the number of offsets at which an
/// access of up to 8 bytes fits. So one compare (`offset < limit`) settles every copy of 1-8
/// bytes, and a limit of 0, the mirror's "no fast path", fails it for every offset. Copies that
/// start in the last 7 bytes of a mapping take the general path.
pub(crate) const fn window_limit(len: usize) -> usize {
    len.saturating_sub(SLACK)
}

/// What [`Mirror::fast_window`] reads: the mapping's address and its window limit
/// ([`window_limit`]; 0 when copies may not take the fast path).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FastWindow {
    pub(crate) addr: usize,
    pub(crate) lim: usize,
}

impl Mirror {
    /// The slot at address `h`, if `h` is one (live or not: [`Mirror::fast_window`] tells).
    pub(crate) fn of(h: usize) -> Option<Mirror> {
        Some(Mirror(HANDLES.get_at(HANDLES.index_of(h)?, h)))
    }

    /// [`Mirror::of`] against the region's bounds as thread `t` last saw them: `None` as well for
    /// a handle newer than that, and for every value while the thread has no grace line. So
    /// `Some` also means that `t.line` is not null.
    #[inline(always)]
    pub(crate) fn known_to(t: &thread_words::ThreadWords, h: usize) -> Option<Mirror> {
        // SAFETY: the words hold this region's bounds (only `remember_handles` sets them) or a
        // count of 0 (a fresh thread, or one whose line was given back).
        let i = unsafe { HANDLES.index_within(h, t.handles_base.get(), t.handles_limit.get()) }?;
        Some(Mirror(HANDLES.get_at(i, h)))
    }

    /// The slot at address `h`, a handle [`Mirror::known_to`] accepted before (for any thread):
    /// slot memory is never returned, so it is still a slot.
    ///
    /// # Safety
    /// `h` is such a handle.
    #[inline(always)]
    pub(crate) unsafe fn named(h: usize) -> Mirror {
        // SAFETY: the caller's contract: `h` is the address of a slot of the region, which stays
        // mapped and initialised for the life of the process.
        Mirror(unsafe { &*(h as *const HandleSlot) })
    }

    /// The handle's mapping address and window limit if copies may take the fast path through
    /// it; otherwise a limit of 0, inside which no range lies. Read it only while the handle is
    /// announced ([`grace`]): a non-zero limit then stays valid, and the address with it, until
    /// the thread's next copy (the control path clears the limit first, and keeps the range
    /// reserved while an announcement names the handle, [`super::parking`]).
    #[inline(always)]
    pub(crate) fn fast_window(self) -> FastWindow {
        let slot = self.0;
        let lim = slot.fast_lim.load(Ordering::Acquire);
        FastWindow { addr: slot.map_addr.load(Ordering::Relaxed), lim }
    }
}

/// [`mapped`] with the reason for a refusal (logged).
pub(crate) fn mapping_of(h: usize) -> Result<(Announced, CpuMapping, MappingType)> {
    let Some(i) = HANDLES.index_of(h) else { return Err(invalid_handle(h)) };
    let slot = HANDLES.get(i);
    let announced = grace::announce(h);
    let state = slot.state.load(Ordering::Acquire);
    if state & MAPPED == 0 {
        drop(announced);
        return Err(not_mapped(h, state));
    }
    let m = CpuMapping { addr: slot.map_addr.load(Ordering::Relaxed), len: len_of(state) };
    Ok((announced, m, type_of(state)))
}

#[cold]
fn invalid_handle(h: usize) -> Errno {
    gdr_err!("invalid handle {h:#x} (not pinned, or already unpinned)");
    Errno::EINVAL
}

#[cold]
fn not_mapped(h: usize, state: u64) -> Errno {
    if state & PINNED == 0 {
        invalid_handle(h)
    } else {
        gdr_err!("mh is not mapped");
        Errno::EINVAL
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn private_layouts_match_upstream_tests() {
        assert_eq!(size_of::<GdrHeader>(), 48);
        assert_eq!(offset_of!(GdrHeader, fd), 0);
        assert_eq!(offset_of!(GdrHeader, list_head), 8);
        assert_eq!(offset_of!(GdrHeader, page_size), 16);
        assert_eq!(offset_of!(GdrHeader, page_mask), 24);
        assert_eq!(offset_of!(GdrHeader, page_shift), 32);
        assert_eq!(offset_of!(GdrHeader, gdrdrv_version), 36);
        assert_eq!(offset_of!(GdrHeader, backend), 40);
        assert_eq!(size_of::<HandleRecord>(), 104);
        assert_eq!(offset_of!(HandleRecord, mapping_type), 16);
        assert_eq!(offset_of!(HandleRecord, words), 24);
        assert_eq!(offset_of!(InstanceSlot, header), 0);
        assert_eq!(offset_of!(HandleSlot, record), 0);
    }

    /// The fast path's mirror: the window limit of a live write-combined mapping while the process
    /// allows the fast path, 0 otherwise, and 0 before a retraction's grace period starts.
    #[test]
    fn fast_mirror_follows_the_mapping_and_the_process_conditions() {
        use crate::conditions::{Why, set_general};
        grace::init();
        // A table of our own (the process's is shared with other tests), over slots of the
        // process's region, which is what the copy path validates handles against.
        let mut t = Tables {
            instance_slots: Allocator::new(),
            handle_slots: Allocator::new(),
            instances: Vec::new(),
            handles: Vec::new(),
            fast_allowed: true,
        };
        let index = CONTROL.lock().unwrap().handle_slots.alloc(&HANDLES).unwrap();
        let slot = HANDLES.get(index);
        slot.state.store(PINNED, Ordering::Release);
        let h = Handle { index, pin: Pin::detached() };
        put(&mut t.handles, index.get(), (h.pin.clone(), 0, index));
        let window = || Mirror::of(HANDLES.addr_of(index)).expect("a slot").fast_window();
        let m = CpuMapping { addr: 0x7f00_0000_0000, len: 0x30000 };

        let lim = window_limit(m.len);
        assert_eq!(window().lim, 0, "pinned, not mapped");
        t.publish_mapping(&h, m, MappingType::WriteCombined);
        assert_eq!(window(), FastWindow { addr: m.addr, lim });
        assert_eq!(
            mapping_of(HANDLES.addr_of(index)).map(|(_, m, ty)| (m.addr, m.len, ty)),
            Ok((m.addr, m.len, MappingType::WriteCombined))
        );

        set_general(Why::MixedTypes, true);
        t.sync_fast_paths();
        assert_eq!(window().lim, 0, "mixed mapping types take the general path");
        set_general(Why::MixedTypes, false);
        t.sync_fast_paths();
        assert_eq!(window().lim, lim, "and the fast path comes back when they end");

        assert_eq!(
            t.retract_mapping(&h).map(|(r, ty, exit)| (r.addr, r.len, ty, exit)),
            Some((m.addr, m.len, MappingType::WriteCombined, Exit::Now)),
            "no copy names the handle: unmap now"
        );
        assert_eq!(window().lim, 0, "retracted");
        t.publish_mapping(&h, m, MappingType::Caching);
        assert_eq!(window().lim, 0, "cached mappings take the general path");
        assert_eq!(mapping_of(HANDLES.addr_of(index)).map(|(_, m, ty)| (m.len, ty)), Ok((m.len, MappingType::Caching)));
        assert!(t.retract_mapping(&h).is_some());
        t.remove_handle(h);
        assert_eq!(window().lim, 0);
        assert!(mapping_of(HANDLES.addr_of(index)).is_err());
    }

    #[test]
    fn a_thread_knows_handles_only_after_its_general_path() {
        grace::init();
        let index = CONTROL.lock().unwrap().handle_slots.alloc(&HANDLES).unwrap();
        let h = HANDLES.addr_of(index);
        HANDLES.get(index).state.store(PINNED, Ordering::Release);
        std::thread::spawn(move || {
            let t = thread_words::mine();
            assert!(Mirror::known_to(t, h).is_none(), "a fresh thread has no line: general path");
            assert!(mapped(h).is_none(), "pinned, not mapped");
            assert!(!t.line.get().is_null(), "the general path gave the thread a line");
            assert!(Mirror::known_to(t, h).is_some(), "and the handle region's bounds");
            assert!(Mirror::known_to(t, h + 64).is_none(), "inside a slot is not a slot");
            assert!(Mirror::known_to(t, h.wrapping_sub(HANDLES.addr_of(index) + (1 << 40))).is_none());
        })
        .join()
        .unwrap();
        HANDLES.get(index).state.store(0, Ordering::Release);
        CONTROL.lock().unwrap().handle_slots.free(index);
    }

    #[test]
    fn unknown_values_are_rejected() {
        let t = lock();
        assert_eq!(t.instance(0x1234).err(), Some(Errno::EINVAL));
        assert_eq!(t.handle(1, 0x5678).err().map(|e| e.0), Some(libc::EINVAL));
        drop(t);
        assert_eq!(mapping_of(0x5678).err().map(|e| e.0), Some(libc::EINVAL));
    }
}
