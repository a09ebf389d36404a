//! Tests of the patchable export entries (entry.rs) through the exports themselves: a sibling of
//! the export modules, so entry.rs, which they build on, imports none of them.

use crate::capi::*;
use crate::entry::PROLOGUE_LEN;
use crate::stubs::*;
use crate::types::*;
use std::ptr::null_mut;

/// Length of one instruction that UCX 1.13's x86-64 relocator (ucm/bistro) copies verbatim,
/// or None where it would give up. Only the verbatim-copied forms are modelled: our
/// prologues need no translation.
fn relocatable_len(code: &[u8]) -> Option<usize> {
    let (rex, op, at) = match code[0] & 0xf0 == 0x40 {
        true => (code[0], code[1], 2),
        false => (0, code[0], 1),
    };
    match (rex, op) {
        (0 | 0x41, 0x50..=0x57) => Some(at),                  // push reg
        (0x48, 0x81) if code[at] == 0xec => Some(at + 1 + 4), // sub rsp, imm32
        (0x48, 0x89) if code[at] == 0xe5 => Some(at + 1),     // mov rbp, rsp
        (0, 0xb8..=0xbf) => Some(at + 4),                     // mov r32, imm32
        _ => None,
    }
}

/// Bytes of `f`'s start that a relocator can move, up to the first instruction it cannot.
fn relocatable_prefix(f: *const u8) -> usize {
    // SAFETY: f is the start of a function in this binary's text; 32 bytes lie within it or
    // the text that follows (functions are not at the end of the mapped text).
    let code = unsafe { std::slice::from_raw_parts(f, 32) };
    let mut at = 0;
    while at < 16 {
        match relocatable_len(&code[at..]) {
            Some(n) => at += n,
            None => break,
        }
    }
    at
}

#[test]
fn decoder_rejects_what_rust_emits() {
    // sub rsp, 8 (imm8 form), mov rbx, rdi, endbr64: the relocator takes none of them.
    for code in [[0x48u8, 0x83, 0xec, 0x08], [0x48, 0x89, 0xfb, 0x90], [0xf3, 0x0f, 0x1e, 0xfa]] {
        let mut buf = [0x90u8; 32];
        buf[..4].copy_from_slice(&code);
        assert_eq!(relocatable_prefix(buf.as_ptr()), 0, "{code:02x?}");
    }
    let mut buf = [0xccu8; 32];
    buf[..6].copy_from_slice(&[0x55, 0x48, 0x89, 0xe5, 0x41, 0x57]);
    assert_eq!(relocatable_prefix(buf.as_ptr()), 6);
}

/// Every function UCX's CUDA memory hooks patch (1.13 and later lists), plus a few others:
/// each starts with at least 12 relocatable bytes, the longest patch UCX writes.
#[test]
fn hooked_exports_have_a_relocatable_prologue() {
    let fns: &[(&str, *const u8)] = &[
        ("cuMemAlloc_v2", cuMemAlloc_v2 as *const u8),
        ("cuMemFree_v2", cuMemFree_v2 as *const u8),
        ("cuMemAllocHost_v2", cuMemAllocHost_v2 as *const u8),
        ("cuMemHostAlloc", cuMemHostAlloc as *const u8),
        ("cuMemFreeHost", cuMemFreeHost as *const u8),
        ("cuMemAllocManaged", cuMemAllocManaged as *const u8),
        ("cuMemAllocPitch_v2", cuMemAllocPitch_v2 as *const u8),
        ("cuMemAllocAsync", cuMemAllocAsync as *const u8),
        ("cuMemFreeAsync", cuMemFreeAsync as *const u8),
        ("cuMemCreate", cuMemCreate as *const u8),
        ("cuMemRelease", cuMemRelease as *const u8),
        ("cuMemMap", cuMemMap as *const u8),
        ("cuCtxGetId", cuCtxGetId as *const u8),
        ("cuInit", cuInit as *const u8),
    ];
    for &(name, f) in fns {
        let n = relocatable_prefix(f);
        assert!(n >= 12, "{name}: only {n} relocatable bytes at its start");
        assert_eq!(n, PROLOGUE_LEN, "{name}");
    }
}

#[test]
fn ctx_get_id_is_per_context_and_never_reused() {
    let mut prim = null_mut();
    let (mut a, mut b, mut c) = (null_mut(), null_mut(), null_mut());
    let (mut id_p, mut id_a, mut id_b, mut id_cur, mut id_c) = (0u64, 0u64, 0u64, 0u64, 0u64);
    // SAFETY: valid out-pointers; contexts created here are destroyed here.
    unsafe {
        assert_eq!(cuInit(0), err::SUCCESS);
        assert_eq!(cuDevicePrimaryCtxRetain(&mut prim, 0), err::SUCCESS);
        assert_eq!(cuCtxGetId(prim, &mut id_p), err::SUCCESS);
        assert_eq!(cuCtxCreate_v2(&mut a, 0, 0), err::SUCCESS); // also made current
        assert_eq!(cuCtxGetId(a, &mut id_a), err::SUCCESS);
        assert_eq!(cuCtxGetId(null_mut(), &mut id_cur), err::SUCCESS);
        assert_eq!(cuCtxCreate_v2(&mut b, 0, 0), err::SUCCESS);
        assert_eq!(cuCtxGetId(b, &mut id_b), err::SUCCESS);
        assert_eq!(cuCtxGetId(a, std::ptr::null_mut()), err::INVALID_VALUE);
        assert_eq!(cuCtxDestroy_v2(b), err::SUCCESS);
        assert_eq!(cuCtxGetId(b, &mut id_c), err::INVALID_CONTEXT, "destroyed context");
        assert_eq!(cuCtxCreate_v2(&mut c, 0, 0), err::SUCCESS);
        assert_eq!(cuCtxGetId(c, &mut id_c), err::SUCCESS);
        assert_eq!(cuCtxDestroy_v2(c), err::SUCCESS);
        assert_eq!(cuCtxDestroy_v2(a), err::SUCCESS);
    }
    assert!(id_p > 0 && id_a > 0, "ids start at 1");
    assert_eq!(id_cur, id_a, "NULL means the current context");
    let ids = [id_p, id_a, id_b, id_c];
    for i in 0..ids.len() {
        for j in i + 1..ids.len() {
            assert_ne!(ids[i], ids[j], "ids {ids:?}");
        }
    }
    // A thread with no current context gets INVALID_CONTEXT for NULL.
    let r = std::thread::spawn(|| {
        let mut id = 0u64;
        // SAFETY: valid out-pointer.
        unsafe { cuCtxGetId(null_mut(), &mut id) }
    })
    .join()
    .unwrap();
    assert_eq!(r, err::INVALID_CONTEXT);
}
