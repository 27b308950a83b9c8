//! Integration tests of the SQL backend against real databases: SQLite
//! files, and PostgreSQL and MariaDB servers spawned by the test kit.

// The test support every backend crate keeps in tests/common/mod.rs.
mod batch;
#[path = "../common/mod.rs"]
mod common;
mod config;
mod conflicts;
mod fencing;
mod holding;
mod list;
mod meta;
mod races;
mod restart;
mod schema;
mod space;
mod stale_write;
mod throughput;
mod tls;
mod waiting;
