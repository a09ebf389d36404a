//! Restartable sequences (`rseq(2)`) for the commonest copy: one naturally aligned access of 1, 2,
//! 4 or 8 bytes through a live write-combined mapping. Such a copy then writes nothing but its
//! own data: no announcement, no clear.
//!
//! Why: the public call's cost over the engine is what users see, and at these sizes it was the
//! two stores of the grace announcement ([`crate::grace`]), not the checks. With the `SFENCE`
//! every copy ends with, each store of the call has to drain before the call can finish; the
//! checks are loads and compares that run in the shadow of the copy (measured on the H100
//! machine: an 8-byte load with every check but no announcement costs what the bare access plus a
//! call does; the announcement and its clear add about 0.65 ns, half the public call's overhead).
//!
//! How it stays safe: the checks and the access run inside an rseq critical section, an address
//! range the kernel knows about. If the thread is preempted, migrated, signalled, or interrupted
//! by `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ)` while inside it, the kernel resumes it
//! at the section's abort address instead, which hands the call to the announcing fast path.
//! So a thread retracting a mapping clears the handle's mirror as before, and its grace period's
//! membarrier, with the rseq flavour, both orders memory and aborts every section in flight: after
//! it returns, a section either saw the cleared mirror or had finished its access (a finished
//! access is retired; a write-combined store still buffered is flushed by the interrupt). The
//! sections themselves are the exported `gdr_copy_*` symbols' first instructions
//! ([`crate::capi`]), naked functions, because a section must be one fixed address range.
//!
//! The section is armed by storing its descriptor's address in the thread's `rseq_cs` word. The
//! kernel clears that word whenever it finds the thread outside the section, so the section's
//! first instruction compares it with our descriptor, and only a mismatch (a preemption since the
//! last copy, or another user of rseq in between) stores it again: in the steady state the
//! section stores nothing but the copy's own data.
//!
//! Requirements, checked once by [`init`] (at the first `gdr_open`), else copies of every size
//! take the announcing fast path as before: x86-64 Linux, glibc's own rseq registration (glibc
//! 2.35 and later; we use its area, found through `__rseq_offset`/`__rseq_size` looked up at run
//! time so the library still loads on older glibc, and never register one of our own), and
//! `membarrier` with the rseq commands (Linux 5.10 and later). A thread whose registration failed
//! (glibc marks it with a negative CPU number) uses the announcing path.
//!
//! The library is linked `-z nodelete` (build.rs): a thread's `rseq_cs` may still point at our
//! descriptor after a copy, and the kernel kills a process whose `rseq_cs` points at unmapped
//! memory, so the library must never be unloaded.

pub(crate) use imp::*;

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod imp {
    /// No restartable sections on this target: nothing to decide.
    pub(crate) fn init() {}

    /// Never: this target has no sections to abort.
    pub(crate) fn enabled() -> bool {
        false
    }

    /// Nothing to turn off.
    pub(crate) fn disable() {}

    /// Sections are never on here.
    pub(crate) fn observe() -> Option<(bool, u64)> {
        None
    }

    /// Never issued here ([`enabled`] is false); the value is Linux's.
    pub(crate) const MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ: libc::c_int = 1 << 7;
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod imp {
    use std::ffi::c_void;
    use std::sync::atomic::{AtomicIsize, AtomicU64, Ordering};

    /// The thread-pointer offset of the thread's `rseq_cs` word (glibc's `__rseq_offset` + 8), or
    /// 0 while sections are off. 0 can never be it: `%fs:0` is the thread pointer itself (the
    /// x86-64 TLS ABI), so a section's compare with our descriptor fails there and the arming
    /// code sees the 0 and hands over to the announcing path.
    pub(crate) static RSEQ_CS_OFFSET: AtomicIsize = AtomicIsize::new(0);

    /// Sections aborted so far (the kernel resumed a thread at an abort address): tests use it
    /// to show that aborts happen and are survived. Counted on the abort path only.
    pub(crate) static ABORTS: AtomicU64 = AtomicU64::new(0);

    /// The signature glibc registers on x86 (`RSEQ_SIG`): the kernel checks that the four bytes
    /// before an abort address hold it, and kills the thread if not.
    pub(crate) const SIGNATURE: u32 = 0x5305_3053;

    const MEMBARRIER_CMD_QUERY: libc::c_int = 0;
    /// Aborts every rseq section running in a thread of this process, and orders memory like
    /// `MEMBARRIER_CMD_PRIVATE_EXPEDITED`.
    pub(crate) const MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ: libc::c_int = 1 << 7;
    const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ: libc::c_int = 1 << 8;
    /// Offset of `rseq_cs` in `struct rseq` (after `cpu_id_start` and `cpu_id`).
    const RSEQ_CS_IN_AREA: isize = 8;

    /// Whether copies may run in restartable sections now.
    pub(crate) fn enabled() -> bool {
        RSEQ_CS_OFFSET.load(Ordering::Relaxed) != 0
    }

    /// Turns sections on if everything in the module documentation holds. Called once, by
    /// [`crate::grace::init`], after it found `membarrier` usable and before any handle exists.
    pub(crate) fn init() {
        match glibc_area() {
            Err(why) => gdr_dbg!("copies use no restartable sections: {why}"),
            Ok(offset) => {
                // SAFETY: membarrier takes integers and touches no memory of ours.
                let supported = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_QUERY, 0) };
                let wanted = libc::c_long::from(
                    MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ | MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ,
                );
                if supported < 0 || supported & wanted != wanted {
                    gdr_dbg!("copies use no restartable sections: membarrier has no rseq commands");
                    return;
                }
                // SAFETY: as above.
                let r =
                    unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ, 0) };
                if r != 0 {
                    gdr_dbg!(
                        "copies use no restartable sections: membarrier registration failed ({})",
                        std::io::Error::last_os_error()
                    );
                    return;
                }
                RSEQ_CS_OFFSET.store(offset + RSEQ_CS_IN_AREA, Ordering::SeqCst);
                gdr_dbg!("copies of one aligned access run in restartable sections");
            }
        }
    }

    /// With sections on: whether this thread's `rseq_cs` word names a section now (after a copy
    /// of one aligned access it names ours until the kernel next finds the thread outside it),
    /// and the number of aborts so far. For tests.
    pub(crate) fn observe() -> Option<(bool, u64)> {
        let off = RSEQ_CS_OFFSET.load(Ordering::Relaxed);
        // SAFETY: a non-zero offset is glibc's area of this thread plus 8 (checked by `init`).
        (off != 0).then(|| unsafe {
            (thread_pointer().byte_offset(off).cast::<u64>().read_volatile() != 0, ABORTS.load(Ordering::Relaxed))
        })
    }

    /// Turns sections off for good (the grace period's membarrier failed: see `grace`).
    pub(crate) fn disable() {
        RSEQ_CS_OFFSET.store(0, Ordering::SeqCst);
    }

    /// The thread-pointer offset of glibc's rseq area, if glibc registered one for this thread.
    fn glibc_area() -> Result<isize, &'static str> {
        // SAFETY: dlsym with a NUL-terminated name; the results are read only if non-null, as the
        // types glibc declares them with (`const ptrdiff_t`, `const unsigned int`).
        let (offset, size) = unsafe {
            let offset = libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_offset".as_ptr()).cast::<isize>();
            let size = libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_size".as_ptr()).cast::<u32>();
            if offset.is_null() || size.is_null() {
                return Err("the C library does not register rseq (glibc before 2.35)");
            }
            (offset.read(), size.read())
        };
        if (size as isize) < RSEQ_CS_IN_AREA + 8 {
            return Err("the C library's rseq registration is off (glibc.pthread.rseq=0, or the kernel lacks rseq)");
        }
        if offset + RSEQ_CS_IN_AREA == 0 {
            return Err("unexpected rseq area offset");
        }
        // This thread's CPU number, written by the kernel: negative unless registered.
        // SAFETY: glibc's area is `size` bytes at `offset` from this thread's pointer; cpu_id is
        // the second 32-bit word.
        let cpu = unsafe { thread_pointer().byte_offset(offset + 4).cast::<i32>().read_volatile() };
        if cpu < 0 {
            return Err("this thread's rseq registration failed");
        }
        Ok(offset)
    }

    /// `%fs:0`, the thread pointer.
    fn thread_pointer() -> *const c_void {
        let tp: *const c_void;
        // SAFETY: reads the TCB's self pointer, which the x86-64 TLS ABI guarantees.
        unsafe {
            std::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) tp, options(nostack, readonly, preserves_flags))
        };
        tp
    }
}

/// One width's path through the restartable section of [`section_copy`], as one string: armed?,
/// a handle this thread knows, inside the window of a live write-combined mapping, the access
/// (`$access`, reading `[rdx]` and writing `[rsi]`), the fence, the return. Straight through:
/// not one jump taken on the way. Its arming code is `section_arm!` of the same width.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
macro_rules! section_path {
    ($dir:literal, $w:literal, $dev:literal, $access:literal) => {
        concat!(
            ".Lgdrapi_rseq_",
            $dir,
            "_",
            $w,
            ":\n",
            // Armed? The kernel clears the word whenever it finds the thread elsewhere.
            "cmp qword ptr fs:[rax], r8\n",
            "jne .Lgdrapi_rseq_arm_",
            $dir,
            "_",
            $w,
            "\n",
            // A handle this thread knows (its words: the handle region's base and count).
            "mov r9, qword ptr [rip + __gdrapi_thread_words@GOTTPOFF]\n",
            "mov r10, rdi\n",
            "sub r10, qword ptr fs:[r9 + {words_base}]\n",
            "ror r10, {slot_shift}\n",
            "cmp r10, qword ptr fs:[r9 + {words_limit}]\n",
            "jae {announced}\n",
            // Inside the window of a live write-combined mapping (its limit is 0 otherwise).
            "mov r10, ",
            $dev,
            "\n",
            "sub r10, qword ptr [rdi + {mirror_addr}]\n",
            "cmp r10, qword ptr [rdi + {mirror_lim}]\n",
            "jae {announced}\n",
            $access,
            "\n",
            "sfence\n",
            "xor eax, eax\n",
            "ret"
        )
    };
}

/// The arming code of one width's path: sections off (offset 0) or this thread unregistered
/// (a negative `cpu_id`, the word before `rseq_cs`): the announcing path; else store the
/// descriptor and enter the path again.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
macro_rules! section_arm {
    ($dir:literal, $w:literal) => {
        concat!(
            ".Lgdrapi_rseq_arm_",
            $dir,
            "_",
            $w,
            ":\n",
            "test rax, rax\n",
            "je {announced}\n",
            "cmp dword ptr fs:[rax - 4], 0\n",
            "jl {announced}\n",
            "mov qword ptr fs:[rax], r8\n",
            "jmp .Lgdrapi_rseq_",
            $dir,
            "_",
            $w
        )
    };
}

/// The body of an exported copy function on x86-64 Linux, as a naked function: the restartable
/// section for one aligned access, or a jump to `$announced`, the announcing fast path for the
/// same arguments (an `extern "C" fn(usize, usize, usize, usize) -> c_int` in the export's own
/// argument order). `$dir` names the labels; `$dev` and `$host` are the registers that hold the
/// device and host pointers (the access itself reads `[rdx]` and writes `[rsi]` in both
/// directions: `rsi` is the destination argument of both exports).
///
/// The section is one address range holding four complete paths, one per width, so that each is
/// straight-line code once entered. An
/// abort anywhere in the range, even after the access, hands the call to the announcing path,
/// which at worst copies the same bytes again.
///
/// Register use, all caller-saved: rax (the `rseq_cs` offset, then the data), r8 (the
/// descriptor), r9 and r10 (scratch). The four arguments are never written, so every way out,
/// the abort included, can jump to `$announced` as if it had been called directly.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
macro_rules! section_copy {
    ($dir:literal, $dev:literal, $host:literal, $announced:path) => {
        ::core::arch::naked_asm!(
            // Sizes other than 1, 2, 4 or 8 at a multiple of themselves, and a NULL host pointer:
            // the announcing path (a size of 0 wraps to the top and fails the first test).
            "lea r9, [rcx - 1]",
            "cmp r9, 8",
            "jae {announced}",
            concat!("mov r10, ", $dev),
            "or r10, rcx",
            "test r10, r9",
            "jne {announced}",
            concat!("test ", $host, ", ", $host),
            "je {announced}",
            "mov rax, qword ptr [rip + {cs_offset}]",
            concat!("lea r8, [rip + .Lgdrapi_rseq_cs_", $dir, "]"),
            // Each path is entered with at most one jump taken, except 2 bytes (two): on the
            // H100 machine's cores each taken jump on the way costs about 0.5 ns. 8 bytes falls
            // straight through, 1 byte jumps from here, 4 bytes from the next test.
            "cmp rcx, 1",
            concat!("je .Lgdrapi_rseq_", $dir, "_1"),
            "test cl, 7",
            concat!("jne .Lgdrapi_rseq_", $dir, "_small"),
            // The section: the 8-byte path first, at its start.
            $crate::rseq::section_path!($dir, "8", $dev, "mov rax, qword ptr [rdx]\nmov qword ptr [rsi], rax"),
            // Inside the section too (harmless: it touches registers only).
            concat!(".Lgdrapi_rseq_", $dir, "_small:"),
            "cmp rcx, 2",
            concat!("je .Lgdrapi_rseq_", $dir, "_2"),
            $crate::rseq::section_path!($dir, "4", $dev, "mov eax, dword ptr [rdx]\nmov dword ptr [rsi], eax"),
            $crate::rseq::section_path!($dir, "2", $dev, "movzx eax, word ptr [rdx]\nmov word ptr [rsi], ax"),
            $crate::rseq::section_path!($dir, "1", $dev, "movzx eax, byte ptr [rdx]\nmov byte ptr [rsi], al"),
            concat!(".Lgdrapi_rseq_end_", $dir, ":"),
            $crate::rseq::section_arm!($dir, "8"),
            $crate::rseq::section_arm!($dir, "4"),
            $crate::rseq::section_arm!($dir, "2"),
            $crate::rseq::section_arm!($dir, "1"),
            // The abort address, preceded by the signature (as the operand of a UD1, so that the
            // bytes decode as one instruction that is never reached).
            ".byte 0x0f, 0xb9, 0x3d",
            ".long {signature}",
            concat!(".Lgdrapi_rseq_abort_", $dir, ":"),
            "lock inc qword ptr [rip + {aborts}]",
            "jmp {announced}",
            // The descriptor (struct rseq_cs: version, flags, start, length, abort address).
            ".pushsection .data.rel.ro,\"aw\",@progbits",
            ".balign 32",
            concat!(".Lgdrapi_rseq_cs_", $dir, ":"),
            ".long 0, 0",
            concat!(".quad .Lgdrapi_rseq_", $dir, "_8"),
            concat!(".quad .Lgdrapi_rseq_end_", $dir, " - .Lgdrapi_rseq_", $dir, "_8"),
            concat!(".quad .Lgdrapi_rseq_abort_", $dir),
            ".popsection",
            announced = sym $announced,
            cs_offset = sym $crate::rseq::RSEQ_CS_OFFSET,
            aborts = sym $crate::rseq::ABORTS,
            signature = const $crate::rseq::SIGNATURE,
            words_base = const $crate::thread_words::HANDLES_BASE_OFFSET,
            words_limit = const $crate::thread_words::HANDLES_LIMIT_OFFSET,
            slot_shift = const $crate::registry::HANDLE_SLOT_SHIFT,
            mirror_addr = const $crate::registry::MIRROR_ADDR_OFFSET,
            mirror_lim = const $crate::registry::MIRROR_LIM_OFFSET,
        )
    };
}
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(crate) use {section_arm, section_copy, section_path};
