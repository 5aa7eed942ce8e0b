//! Test and local-run support: a real swtpm per test, and a harness that starts the whole system
//! as real processes over real Unix sockets.

pub mod harness;
pub mod process;
pub mod swtpm;
