// Gives the cdylib the soname of NVIDIA's driver library, so that programs linked against it
// record `libcuda.so.1`, exactly as when they link the real driver.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    // Never unmapped by dlclose (gdrcopy's dma-buf backend dlcloses libcuda on its last
    // gdr_close): stream worker threads may still be running the library's code.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    println!("cargo:rerun-if-changed=build.rs");
}
