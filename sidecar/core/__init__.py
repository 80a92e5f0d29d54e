"""The byte path in Rust: `sidecar.core.native`, built from the crate in this folder."""
