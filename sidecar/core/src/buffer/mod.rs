//! The buffer as the core reads it: the key every stored object is found by (`key`), the
//! table of answers Python recorded for stored objects (`answers`), and the digest stored
//! bodies are checked against (`digest`).

pub mod answers;
pub mod digest;
pub mod key;
