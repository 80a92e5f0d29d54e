//! The buffer as the core keeps it: the table of answers Python recorded for stored
//! objects (`answers`), which worker fetches which key and the room each fills alone
//! (`claims`), and the digest stored bodies are checked against (`digest`).

pub mod answers;
pub mod claims;
pub mod digest;
