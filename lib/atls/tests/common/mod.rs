//! What the aTLS test files share; each uses its own part of it.
#![allow(dead_code)]

pub mod handshake;
pub mod openssl;
