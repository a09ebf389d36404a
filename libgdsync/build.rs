// Sets the shared library's soname as upstream's libtool -version-info 4:0:2 gives on Linux:
// current - age = 2, so the soname is libgdsync.so.2 (real file name libgdsync.so.2.2.0 is made by
// the installer).
fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if os == "linux" {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libgdsync.so.2");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
