//! Exported entry points that binary patchers can hook, as they hook NVIDIA's driver.
//!
//! UCX's memory hooks (ucm, "bistro" mode, its default) overwrite the first 5 bytes (a near
//! `jmp`) or 12 bytes (`movabs rax; jmp rax`) of libcuda's allocation and free functions and
//! keep a copy of the overwritten instructions to call the original. Its x86-64 relocator only
//! understands a few prologue instructions (`push reg`, `mov rbp, rsp`, `sub rsp, imm32`,
//! stack-relative `mov`, `mov reg, imm32`, rip-relative `cmp`, short `jcc`), the ones the real
//! driver's entry points start with. Rust's code generation starts functions with whatever it
//! likes (`sub rsp, imm8`, `mov rbx, rdi`, ...), and one unrecognised export makes UCX refuse all
//! its CUDA hooks, after which its gdr_copy registration cache cannot learn of `cuMemFree`.
//!
//! So on x86-64 every export is a naked entry stub: 13 bytes of pushes that a relocator copies
//! verbatim, the matching pops, then a tail jump to the Rust implementation. The stack and every
//! argument register are as the caller left them when the implementation runs, so this holds for
//! any signature, stack-passed arguments included. `PROLOGUE_LEN` and the decoder in the tests
//! check the bytes.

/// Bytes of relocatable prologue at the start of every export: at least the 12 of the longest
/// patch UCX writes.
#[cfg(all(test, target_arch = "x86_64"))]
pub const PROLOGUE_LEN: usize = 13;

/// Defines `pub unsafe extern "C" fn $name(args) -> $ret`, exported unmangled, whose work is
/// `$imp` (a function with the same signature). See the module documentation.
#[cfg(target_arch = "x86_64")]
macro_rules! patchable_entry {
    ($(#[$m:meta])* fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty => $imp:path) => {
        crate::entry::patchable_entry!(@ [unsafe] $(#[$m])* fn $name($($arg: $ty),*) -> $ret => $imp);
    };
    ($(#[$m:meta])* safe fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty => $imp:path) => {
        crate::entry::patchable_entry!(@ [] $(#[$m])* fn $name($($arg: $ty),*) -> $ret => $imp);
    };
    (@ [$($q:tt)*] $(#[$m:meta])* fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty => $imp:path) => {
        $(#[$m])*
        #[unsafe(no_mangle)]
        // SAFETY: the body only saves and restores callee-saved registers (net stack change
        // zero) and tail-jumps to `$imp`, whose signature is this function's: the callee sees
        // the caller's registers and stack unchanged.
        #[unsafe(naked)]
        pub $($q)* extern "C" fn $name($($arg: $ty),*) -> $ret {
            core::arch::naked_asm!(
                // 13 bytes: 55 | 48 89 e5 | 53 | 41 54 | 41 55 | 41 56 | 41 57
                "push rbp",
                "mov rbp, rsp",
                "push rbx",
                "push r12",
                "push r13",
                "push r14",
                "push r15",
                "pop r15",
                "pop r14",
                "pop r13",
                "pop r12",
                "pop rbx",
                "pop rbp",
                "jmp {imp}",
                imp = sym $imp,
            )
        }
    };
}

#[cfg(not(target_arch = "x86_64"))]
macro_rules! patchable_entry {
    ($(#[$m:meta])* fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty => $imp:path) => {
        $(#[$m])*
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            // SAFETY: same signature and contract as the caller's.
            unsafe { $imp($($arg),*) }
        }
    };
    ($(#[$m:meta])* safe fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty => $imp:path) => {
        $(#[$m])*
        #[unsafe(no_mangle)]
        pub extern "C" fn $name($($arg: $ty),*) -> $ret {
            $imp($($arg),*)
        }
    };
}

pub(crate) use patchable_entry;
