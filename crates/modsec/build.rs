//! Links Debian's libmodsecurity 3 through pkg-config.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    if let Err(e) = pkg_config::Config::new()
        .atleast_version("3.0")
        .probe("modsecurity")
    {
        // Fall back to a plain `-lmodsecurity` so that an unusual install can still
        // link; the error says why pkg-config failed.
        println!("cargo:warning=pkg-config could not find modsecurity ({e}); trying -lmodsecurity");
        println!("cargo:rustc-link-lib=modsecurity");
    }
}
