//! With the `bpf` feature: compiles `src/bpf/relay.bpf.c` (the fast path) and
//! `src/bpf/reflect.bpf.c` (the benchmark's kernel echo) with clang (`-target bpf`) into
//! `$OUT_DIR`, which the crate embeds. Without it: nothing (no clang needed).
//! `LASTCALL_BPF_CLANG` names another clang.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=src/bpf/relay.bpf.c");
    println!("cargo:rerun-if-changed=src/bpf/reflect.bpf.c");
    println!("cargo:rerun-if-env-changed=LASTCALL_BPF_CLANG");
    if env::var_os("CARGO_FEATURE_BPF").is_none() {
        return;
    }
    let dir = PathBuf::from(env::var_os("OUT_DIR").unwrap_or_default());
    let clang = env::var("LASTCALL_BPF_CLANG").unwrap_or_else(|_| "clang".to_string());
    // <asm/types.h> lives under the multiarch include directory on Debian.
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let multiarch = format!("/usr/include/{arch}-linux-gnu");
    for name in ["relay", "reflect"] {
        let status = Command::new(&clang)
            .args([
                "-O2", "-g", "-target", "bpf", "-mcpu=v3", "-Wall", "-Werror",
            ])
            .arg(format!("-I{multiarch}"))
            .arg("-c")
            .arg(format!("src/bpf/{name}.bpf.c"))
            .arg("-o")
            .arg(dir.join(format!("{name}.bpf.o")))
            .status();
        match status {
            Ok(s) if s.success() => {}
            Ok(s) => panic!(
                "{clang} could not build the BPF object {name} ({s}); scripts/setup.sh installs clang and libbpf-dev"
            ),
            Err(e) => panic!(
                "the `bpf` feature needs clang (and libbpf-dev) to build the BPF object: {clang}: {e}"
            ),
        }
    }
}
