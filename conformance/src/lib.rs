//! The one polylock conformance suite.
//!
//! Every case in [`cases`] runs against every backend in
//! [`backends::registered`], selected by the backend's declared
//! [`Guarantees`](lock_core::Guarantees) — never by the backend's name.
//! `cargo test -p conformance` runs it; the usual libtest filters apply
//! (`cargo test -p conformance -- memory::`).

pub mod backends;
pub mod broken;
pub mod cases;
pub mod counting;
pub mod fixture;
pub mod harness;
