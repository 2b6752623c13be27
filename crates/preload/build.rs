// Records the torch version the core is built against, so that the entry
// point can refuse a different torch at run time before it loads the core.
fn main() {
    let torch = opdump_torchfind::find_or_exit();
    println!("cargo:rustc-env=TORCH_VERSION_AT_BUILD={}", torch.version);
    println!(
        "cargo:rustc-env=TORCH_CXX11_ABI_AT_BUILD={}",
        u8::from(torch.cxx11_abi)
    );
    println!("cargo:rerun-if-changed=build.rs");
}
