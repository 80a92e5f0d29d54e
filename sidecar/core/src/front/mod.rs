//! The front end's clients before their streams: a listener's door for plain HTTP
//! (`door`), and any other client until its first request (`arrival`).

pub mod arrival;
pub mod door;
