//! Gives the shared library upstream's soname, so consumers linked against us record
//! `libgdrapi.so.2` exactly as they would with gdrcopy.
fn main() {
    let major = env!("CARGO_PKG_VERSION_MAJOR");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libgdrapi.so.{major}");
    // Upstream links with -z defs: fail the link on any undefined symbol.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,defs");
    // Never unloaded: a thread's rseq critical-section pointer may still name our descriptor after
    // a copy, and the kernel kills a process whose pointer names unmapped memory (src/rseq.rs).
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    println!("cargo:rerun-if-changed=build.rs");
}
