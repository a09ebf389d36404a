//! What a table times: `memcpy`, the dispatcher (inlined, or behind a C call), each engine,
//! and the public `gdr_copy_*` of a library, each as a loop of calls on opaque arguments.

use std::ffi::{c_int, c_void};

use gdrapi::copy::{self, Direction, Engine, MappingKind};

use crate::gdrlib::{BarMapping, CopyFn, GdrMh};

#[derive(Clone)]
pub(crate) enum Method {
    Memcpy,
    /// The dispatcher for WC plus the caller's store fence, with extra device/host offsets.
    Dispatch {
        dev_off: usize,
        host_off: usize,
    },
    Engine(Engine),
    /// The dispatcher and its fence behind a C call shaped like `gdr_copy_*` (four arguments,
    /// through a function pointer): the call boundary a C caller pays, without the public call's
    /// checks, so public minus this is what the library's own layer costs.
    DispatchCalled,
    /// A library's public `gdr_copy_*` on its own mapping of the same device memory, with extra
    /// device/host offsets (0, 0 but for the misaligned column of ours).
    Public {
        label: String,
        m: BarMapping,
        dev_off: usize,
        host_off: usize,
    },
}

impl Method {
    pub(crate) fn name(&self) -> String {
        match self {
            Method::Memcpy => "memcpy".into(),
            Method::Dispatch { dev_off: 0, host_off: 0 } => "dispatch".into(),
            Method::Dispatch { dev_off, host_off } => format!("dispatch dev+{dev_off} host+{host_off}"),
            Method::Engine(e) => format!("{}{}", e.name, if e.selected { "*" } else { "" }),
            Method::DispatchCalled => "dispatch (C call)".into(),
            Method::Public { label, .. } => label.clone(),
        }
    }

    pub(crate) fn usable(&self, len: usize) -> bool {
        match self {
            Method::Engine(e) => len.is_multiple_of(e.width),
            _ => true,
        }
    }

    /// `iters` calls, as a library user makes them in a loop (copy, then the fence `gdr_copy_*`
    /// issues). The method is chosen once, outside the loop, so each loop holds nothing but its
    /// own copy: the dispatcher inlined, the engines and C-call columns one call each, like a C
    /// consumer's loop around `gdr_copy_*` (public_copy_floor.c has the same shape). Pointers and
    /// length pass through [`opaque`] every iteration, so no check can be hoisted out of a loop.
    ///
    /// # Safety
    /// `dev` and `host` are valid for `len` + 64 bytes, disjoint, and page aligned.
    #[inline(never)]
    pub(crate) unsafe fn run(&self, dir: Direction, dev: *mut u8, host: *mut u8, len: usize, iters: usize) {
        // Every unsafe block below: the forwarded contract; engines are only called with `usable`
        // lengths on page-aligned device pointers; the offsets of Dispatch stay inside the 64
        // bytes of slack.
        match (self, dir) {
            (Method::Memcpy, Direction::ToDevice) => {
                for _ in 0..iters {
                    // SAFETY: as said at the top of `run`.
                    unsafe { std::ptr::copy_nonoverlapping(opaque(host), opaque(dev), opaque(len)) };
                }
            }
            (Method::Memcpy, Direction::FromDevice) => {
                for _ in 0..iters {
                    // SAFETY: as said at the top of `run`.
                    unsafe { std::ptr::copy_nonoverlapping(opaque(dev), opaque(host), opaque(len)) };
                }
            }
            (Method::Dispatch { dev_off, host_off }, Direction::ToDevice) => {
                // SAFETY: as said at the top of `run`.
                let (dev, host) = unsafe { (dev.add(*dev_off), host.add(*host_off)) };
                for _ in 0..iters {
                    // SAFETY: as said at the top of `run`.
                    unsafe {
                        copy::copy_to_mapping(MappingKind::WriteCombined, opaque(dev), opaque(host), opaque(len))
                    };
                    copy::store_fence();
                }
            }
            (Method::Dispatch { dev_off, host_off }, Direction::FromDevice) => {
                // SAFETY: as said at the top of `run`.
                let (dev, host) = unsafe { (dev.add(*dev_off), host.add(*host_off)) };
                for _ in 0..iters {
                    // SAFETY: as said at the top of `run`.
                    unsafe {
                        copy::copy_from_mapping(MappingKind::WriteCombined, opaque(host), opaque(dev), opaque(len))
                    };
                    copy::store_fence();
                }
            }
            (Method::Engine(e), Direction::ToDevice) => {
                for _ in 0..iters {
                    // SAFETY: as said at the top of `run`.
                    unsafe { (e.f)(opaque(dev), opaque(host), opaque(len)) };
                    copy::store_fence();
                }
            }
            (Method::Engine(e), Direction::FromDevice) => {
                for _ in 0..iters {
                    // SAFETY: as said at the top of `run`.
                    unsafe { (e.f)(opaque(host), opaque(dev), opaque(len)) };
                    copy::store_fence();
                }
            }
            (Method::DispatchCalled, Direction::ToDevice) => {
                let f = dispatch_called().0;
                for _ in 0..iters {
                    // SAFETY: as said at the top of `run`.
                    unsafe { f(GdrMh { h: 0 }, opaque(dev).cast(), opaque(host).cast(), opaque(len)) };
                }
            }
            (Method::DispatchCalled, Direction::FromDevice) => {
                let f = dispatch_called().1;
                for _ in 0..iters {
                    // SAFETY: as said at the top of `run`.
                    unsafe { f(GdrMh { h: 0 }, opaque(host).cast(), opaque(dev).cast(), opaque(len)) };
                }
            }
            // `dev` is our mapping; the library copies at the same offset of its own mapping.
            (Method::Public { m, dev_off, host_off, .. }, Direction::ToDevice) => {
                // SAFETY: as said at the top of `run`.
                let (bar, host) = unsafe { (m.bar.add(*dev_off), host.add(*host_off)) };
                for _ in 0..iters {
                    // SAFETY: as said at the top of `run`.
                    unsafe { (m.copy_to)(m.mh, opaque(bar).cast(), opaque(host).cast(), opaque(len)) };
                }
            }
            (Method::Public { m, dev_off, host_off, .. }, Direction::FromDevice) => {
                // SAFETY: as said at the top of `run`.
                let (bar, host) = unsafe { (m.bar.add(*dev_off), host.add(*host_off)) };
                for _ in 0..iters {
                    // SAFETY: as said at the top of `run`.
                    unsafe { (m.copy_from)(m.mh, opaque(host).cast(), opaque(bar).cast(), opaque(len)) };
                }
            }
        }
    }
}

/// `x`, unknown to the optimiser, in a register (`black_box` would go through the stack): each
/// iteration of a timing loop then works on a value the compiler cannot prove loop-invariant.
#[inline(always)]
fn opaque<T: OpaqueWord>(x: T) -> T {
    x.opaque()
}

/// Values [`opaque`] takes: one machine word.
trait OpaqueWord: Copy {
    fn opaque(self) -> Self;
}

impl OpaqueWord for usize {
    #[inline(always)]
    fn opaque(self) -> usize {
        let mut x = self;
        // SAFETY: an empty template: the register is declared read and written, nothing else.
        unsafe { std::arch::asm!("/* {0} */", inout(reg) x, options(nomem, nostack, preserves_flags)) };
        x
    }
}

impl<T> OpaqueWord for *mut T {
    #[inline(always)]
    fn opaque(self) -> *mut T {
        (self as usize).opaque() as *mut T
    }
}

impl<T> OpaqueWord for *const T {
    #[inline(always)]
    fn opaque(self) -> *const T {
        (self as usize).opaque() as *const T
    }
}

/// The dispatcher behind [`CopyFn`]s.
static DISPATCH_CALLED: (CopyFn, CopyFn) = (dispatch_to_called, dispatch_from_called);

/// [`DISPATCH_CALLED`], loaded so that the compiler cannot see the functions: every call is then
/// indirect, through a pointer read from memory, as the public columns' calls are.
#[inline(always)]
fn dispatch_called() -> (CopyFn, CopyFn) {
    // SAFETY: a valid, aligned static.
    unsafe { std::ptr::read_volatile(&DISPATCH_CALLED) }
}

/// The dispatcher for WC plus the store fence, called as `gdr_copy_to_mapping` is.
///
/// # Safety
/// As `Method::run`.
#[inline(never)]
unsafe extern "C" fn dispatch_to_called(_h: GdrMh, dev: *mut c_void, host: *const c_void, n: usize) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { copy::copy_to_mapping(MappingKind::WriteCombined, dev.cast(), host.cast(), n) };
    copy::store_fence();
    0
}

/// The dispatcher for WC plus the store fence, called as `gdr_copy_from_mapping` is.
///
/// # Safety
/// As `Method::run`.
#[inline(never)]
unsafe extern "C" fn dispatch_from_called(_h: GdrMh, host: *mut c_void, dev: *const c_void, n: usize) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { copy::copy_from_mapping(MappingKind::WriteCombined, host.cast(), dev.cast(), n) };
    copy::store_fence();
    0
}
