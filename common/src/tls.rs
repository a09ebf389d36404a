//! Per-thread blocks reached in two instructions, for the hot paths of both libraries.
//!
//! Rust's `thread_local!` in a shared library uses the general-dynamic TLS model: every access
//! is a call to `__tls_get_addr` (about ten instructions behind a PLT jump), plus the lazy
//! initialisation state test of the standard library. TLS descriptors (the "GNU2" dialect) are no
//! better for a library that is dlopen'ed, as NCCL and UCX load ours: glibc then resolves them
//! dynamically, and since 2.39 that path saves and restores every vector register (measured on
//! the H100 machine, Ubuntu 24.04: a copy took 14 ns against 10 ns with the model used here). So
//! on x86-64 Linux, [`initial_exec_block!`] declares the block in assembly and reaches it with the
//! initial-exec model: one load of its offset from the GOT and one add of the thread pointer.
//!
//! The price is the `STATIC_TLS` flag on the library: its blocks come from the static TLS surplus
//! glibc keeps for exactly such libraries (`glibc.rtld.optional_static_tls`, 512 bytes by
//! default); a process that has used that up gets "cannot allocate memory in static TLS block"
//! from `dlopen`, and the tunable raises it (docs/decisions/0004-initial-exec-tls.md). The whole TLS segment of the
//! library counts, not only the block (libgdrapi: 160 bytes, most of them the standard library's),
//! so the macro is for paths where a few nanoseconds matter: libgdrapi's copy path uses it;
//! libgdsync, whose calls take microseconds, does not.
//!
//! Elsewhere (aarch64 uses TLS descriptors by default) the macro falls back to `thread_local!`.

/// A type whose all-zero bytes are a valid value: what a block declared by
/// [`initial_exec_block!`] holds before its thread first writes it.
///
/// # Safety
/// Every field must accept all-zero bytes (integers, cells of them, raw pointers, `bool` false).
pub unsafe trait ZeroValid {}

/// Declares `fn $name() -> &'static $ty`: this thread's zero-initialised `$ty`, in a TLS block
/// named `$sym` (a hidden symbol: it never leaves the shared library). `$ty` must be
/// [`ZeroValid`], must not need dropping (the block has no destructor) and must not be `Sync`
/// (cells), so the reference cannot be shared with another thread; all three are checked when
/// the crate compiles.
///
/// The reference is valid wherever this thread's code runs: the block lives until the thread's
/// TLS is freed, after its TLS destructors ran.
#[macro_export]
macro_rules! initial_exec_block {
    ($(#[$attr:meta])* $vis:vis fn $name:ident() -> &'static $ty:ty = $sym:literal;) => {
        const _: () = {
            assert!(!::core::mem::needs_drop::<$ty>(), "a TLS block has no destructor");
            const fn zero_valid<T: $crate::tls::ZeroValid>() {}
            zero_valid::<$ty>()
        };
        // Not `Sync`: for a `Sync` type both impls below apply, and the path at the end is
        // ambiguous, which fails the build (stable Rust has no negative bounds).
        const _: () = {
            trait AmbiguousIfSync<Marker> {
                const SOME: () = ();
            }
            impl<T: ?Sized> AmbiguousIfSync<()> for T {}
            impl<T: ?Sized + Sync> AmbiguousIfSync<u8> for T {}
            <$ty as AmbiguousIfSync<_>>::SOME
        };

        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        ::core::arch::global_asm!(
            // Global but hidden: visible to the other codegen units of the crate (debug builds
            // split it into many objects), never exported from the shared library; named in the
            // implementation's namespace ("__"), so no C program's name can collide with it in
            // a static archive.
            concat!(".globl ", $sym),
            concat!(".hidden ", $sym),
            ".pushsection .tbss,\"awT\",@nobits",
            ".balign {align}",
            concat!(".type ", $sym, ",@object"),
            concat!(".size ", $sym, ",{size}"),
            concat!($sym, ":"),
            ".zero {size}",
            ".popsection",
            size = const ::core::mem::size_of::<$ty>(),
            align = const ::core::mem::align_of::<$ty>(),
        );

        $(#[$attr])*
        #[inline(always)]
        $vis fn $name() -> &'static $ty {
            #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
            {
                let addr: *const $ty;
                // SAFETY: the x86-64 initial-exec TLS sequence: the GOT entry holds the block's
                // offset from the thread pointer, which `%fs:0` holds. Reads only the GOT and
                // the TCB.
                unsafe {
                    ::core::arch::asm!(
                        concat!("movq ", $sym, "@gottpoff(%rip), {a}"),
                        "addq %fs:0, {a}",
                        a = out(reg) addr,
                        options(att_syntax, nostack, pure, readonly, preserves_flags),
                    );
                }
                // SAFETY: the pointer is this thread's block: sized and aligned for `$ty` by the
                // directives above, zero-initialised (a valid `$ty`, which is `ZeroValid`), and
                // alive as long as the thread (see the macro's documentation).
                unsafe { &*addr }
            }
            #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
            {
                ::std::thread_local! {
                    // SAFETY: `$ty` is `ZeroValid`.
                    static BLOCK: $ty = const { unsafe { ::core::mem::zeroed() } };
                }
                // SAFETY: as above: the thread's value lives as long as the thread, and `$ty`
                // needs no drop, so it is never destroyed before that.
                BLOCK.with(|b| unsafe { &*(b as *const $ty) })
            }
        }
    };
}
