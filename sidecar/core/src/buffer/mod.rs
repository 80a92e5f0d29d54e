//! The buffer as the core reads it: the table of answers Python recorded for stored
//! objects (`answers`), and the digest stored bodies are checked against (`digest`).

pub mod answers;
pub mod digest;
