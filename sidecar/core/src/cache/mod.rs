//! The cache's rules as the core applies them, each the one implementation of
//! `sidecar.cache.policy`'s rule or checked against it: the key every stored object is
//! found by (`key`), and what a fill keeps of an origin's common response (`judge`).

pub mod judge;
pub mod key;
