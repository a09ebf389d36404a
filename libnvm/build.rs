//! Gives the shared library libnvm's own soname, `libnvm.so` (upstream sets no SOVERSION), so
//! programs already linked against upstream's library load ours unchanged. docs/storage.md has
//! the reasoning.
fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if os == "linux" {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvm.so");
        println!("cargo:rustc-cdylib-link-arg=-Wl,-z,defs");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
