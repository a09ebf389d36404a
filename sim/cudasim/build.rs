// Gives the cdylib the soname of NVIDIA's driver library, so that programs linked against it
// record `libcuda.so.1`, exactly as when they link the real driver.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    println!("cargo:rerun-if-changed=build.rs");
}
