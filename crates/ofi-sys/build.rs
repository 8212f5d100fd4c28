//! Compiles the C shim and links libfabric, only with the `libfabric`
//! feature (see the crate docs).

fn main() {
    println!("cargo:rerun-if-changed=shim/spindle_ofi.c");
    println!("cargo:rerun-if-env-changed=LIBFABRIC_DIR");
    if std::env::var_os("CARGO_FEATURE_LIBFABRIC").is_none() {
        return;
    }
    let mut build = cc::Build::new();
    build.file("shim/spindle_ofi.c").warnings(true).extra_warnings(true);
    // A libfabric outside the system paths (a cluster's module, a build
    // from source): LIBFABRIC_DIR=<prefix> with include/ and lib/.
    if let Some(dir) = std::env::var_os("LIBFABRIC_DIR") {
        let dir = std::path::PathBuf::from(dir);
        build.include(dir.join("include"));
        println!("cargo:rustc-link-search=native={}", dir.join("lib").display());
    }
    build.compile("spindle_ofi");
    println!("cargo:rustc-link-lib=dylib=fabric");
}
