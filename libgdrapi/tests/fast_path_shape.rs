//! The machine code of the public copy calls keeps the shape their speed depends on
//! (docs/performance.md): on x86-64, the straight line of `gdr_copy_to_mapping` and
//! `gdr_copy_from_mapping` from their entry to their first return (the 8-byte copy) is a leaf
//! that saves no register, touches no stack, calls nothing, fences once and stays short. A
//! change that breaks this compiles and passes every other test while costing every user a few
//! nanoseconds per copy; the disassembly of the built library is where it shows.
//!
//! The functions checked are the ones linked into this test binary: the same compiled code as
//! the cdylib's (one compilation of the crate), which `cargo test` does not necessarily rebuild.
//! Needs an optimised build (`cargo test --release`) and `objdump` (binutils, which
//! scripts/install-deps installs); without either the test says SKIP.

use std::path::Path;
use std::process::Command;

/// At most this many instructions from a copy export's entry to its first `ret`: the named-handle
/// check (the thread's words name the handle: valid and announced; the handle check and the
/// announcement's store are out of line, for a thread's first copy through a handle), the window
/// check, the width tests, the access, the fence, the return. 32 today; the bound leaves room for
/// one or two more, not for a new layer.
const MAX_STRAIGHT_LINE: usize = 34;

/// The instructions (mnemonic and operands, Intel syntax) of `symbol` in the binary `lib`, in
/// address order.
fn disassemble(lib: &Path, symbol: &str) -> Result<Vec<String>, String> {
    let out = Command::new("objdump")
        .args(["-d", "--no-show-raw-insn", "-M", "intel", &format!("--disassemble={symbol}")])
        .arg(lib)
        .output()
        .map_err(|e| format!("objdump: {e}"))?;
    if !out.status.success() {
        return Err(format!("objdump failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    // Instruction lines look like "   26040:\tmov    rax,QWORD PTR [...]".
    let body: Vec<String> = text
        .lines()
        .filter_map(|l| l.split_once(":\t"))
        .filter(|(addr, _)| addr.trim().chars().all(|c| c.is_ascii_hexdigit()))
        .map(|(_, insn)| insn.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    if body.is_empty() {
        return Err(format!("no instructions for {symbol} in {}", lib.display()));
    }
    Ok(body)
}

#[test]
fn copy_exports_reach_the_eight_byte_copy_as_a_short_leaf() {
    const TEST: &str = "copy_exports_reach_the_eight_byte_copy_as_a_short_leaf";
    if !cfg!(target_arch = "x86_64") {
        println!("SKIP {TEST}: the shape is checked on x86-64 only");
        return;
    }
    if cfg!(debug_assertions) {
        println!("SKIP {TEST}: an unoptimised build (run cargo test --release)");
        return;
    }
    // Keeps both exports linked into this binary.
    let exports: [unsafe extern "C" fn(
        gdrapi::abi::GdrMh,
        *mut std::ffi::c_void,
        *const std::ffi::c_void,
        usize,
    ) -> std::ffi::c_int; 2] = [gdrapi::capi::gdr_copy_to_mapping, gdrapi::capi::gdr_copy_from_mapping];
    std::hint::black_box(exports);
    let lib = std::env::current_exe().unwrap();
    if Command::new("objdump").arg("--version").output().is_err() {
        println!("SKIP {TEST}: objdump not installed (binutils)");
        return;
    }
    for symbol in ["gdr_copy_to_mapping", "gdr_copy_from_mapping"] {
        let body = disassemble(&lib, symbol).unwrap();
        let end =
            body.iter().position(|i| i == "ret").unwrap_or_else(|| panic!("{symbol}: no ret in\n{}", body.join("\n")));
        let line = &body[..=end];
        let listing = line.join("\n");
        assert!(line.len() <= MAX_STRAIGHT_LINE, "{symbol}: {} instructions to the first ret:\n{listing}", line.len());
        for bad in ["push", "pop", "call", "rsp", "rbp", "leave"] {
            assert!(
                !line.iter().any(|i| i.split([' ', ',', '[', ']', '+', '-']).any(|w| w == bad)),
                "{symbol}: `{bad}` on the way to the 8-byte copy:\n{listing}"
            );
        }
        // Intel syntax puts the destination first: a write to memory is a mov into "... PTR [".
        let writes = line
            .iter()
            .filter_map(|i| i.split_once(' '))
            .filter(|(op, args)| {
                op.starts_with("mov") && args.split(',').next().is_some_and(|dst| dst.contains("PTR ["))
            })
            .count();
        assert_eq!(
            writes, 1,
            "{symbol}: one memory write, the copy's own (a thread copying through the same handle again finds its announcement in place):\n{listing}"
        );
        let fences = line.iter().filter(|i| *i == "sfence").count();
        assert_eq!(fences, 1, "{symbol}: one store fence per copy:\n{listing}");
        assert!(line.iter().any(|i| i.contains("QWORD PTR [rdx]")), "{symbol}: the 8-byte access:\n{listing}");
        println!("{TEST}: {symbol}: {} instructions to the first ret, no stack, one fence", line.len());
    }
}
