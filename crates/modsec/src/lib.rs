//! Safe Rust wrapper over Debian's libmodsecurity 3 (own FFI, linked via pkg-config).
