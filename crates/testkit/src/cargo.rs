//! Programs of the workspace a test runs but cargo does not build for it: examples, and
//! binaries of other packages. Found next to the running test executable, built with cargo
//! if missing.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `target/<profile>`, the directory above the running test executable's `deps/`.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|err| panic!("current_exe: {err}"));
    exe.parent()
        .and_then(Path::parent)
        .unwrap_or_else(|| panic!("unexpected test executable path {}", exe.display()))
        .to_path_buf()
}

/// The path of example `name` of workspace package `package`
/// (`target/<profile>/examples/<name>`), built with `cargo build -p <package> --example
/// <name>` if it is missing.
pub fn example_path(package: &str, name: &str) -> PathBuf {
    let path = profile_dir().join("examples").join(name);
    if !path.exists() {
        build(&["-p", package, "--example", name]);
    }
    path
}

/// The path of binary `name` of workspace package `package` (`target/<profile>/<name>`),
/// built with `cargo build -p <package> --bin <name>` if it is missing. (A package's own
/// binaries are `env!("CARGO_BIN_EXE_<name>")` in its tests.)
pub fn bin_path(package: &str, name: &str) -> PathBuf {
    let path = profile_dir().join(name);
    if !path.is_file() {
        build(&["-p", package, "--bin", name]);
    }
    path
}

/// `cargo build ARGS` in the running test's profile. Panics if it fails.
fn build(args: &[&str]) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.arg("build").args(args);
    if profile_dir().file_name().is_some_and(|p| p == "release") {
        cmd.arg("--release");
    }
    eprintln!("testkit: running {cmd:?}");
    let status = cmd
        .status()
        .unwrap_or_else(|err| panic!("cannot run cargo: {err}"));
    assert!(status.success(), "{cmd:?} failed");
}
