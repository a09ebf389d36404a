//! Gives the shared library upstream's soname, so consumers linked against us record
//! `libgdrapi.so.2` exactly as they would with gdrcopy.
fn main() {
    let major = env!("CARGO_PKG_VERSION_MAJOR");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libgdrapi.so.{major}");
    // Upstream links with -z defs: fail the link on any undefined symbol.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,defs");
    println!("cargo:rerun-if-changed=build.rs");
}
