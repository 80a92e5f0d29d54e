//! The memory the sidecar's processes share: the file mapped whole (`mapping`) and the
//! lock every process takes to change it (`lock`).

pub mod lock;
pub mod mapping;
