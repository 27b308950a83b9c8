//! polylock's measuring tools, run against real servers started by the test
//! kit: the fault suite behind `polylock compare` and the benchmarks behind
//! `polylock bench`. They live apart from the `polylock` crate so that a lock
//! client never links the test kit; `polylock compare` and `polylock bench`
//! run this crate's `polylock-compare` and `polylock-bench` binaries.

pub mod faults;
