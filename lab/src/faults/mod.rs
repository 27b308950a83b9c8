//! The fault suite behind `polylock compare`: the same faults against every
//! backend, with real servers (started by the test kit) and lock clients in
//! separate processes (so they can be paused and killed), judged by a fenced
//! register outside them; then each backend's declared claims are checked
//! against what was observed, and the tables, raw JSON and timelines are
//! written from the runs.

pub mod claims;
pub mod client;
pub mod output;
pub mod run;
pub mod scenario;
pub mod target;
pub mod wire;
