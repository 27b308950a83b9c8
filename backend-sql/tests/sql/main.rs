//! Integration tests of the SQL backend against real databases: SQLite
//! files, and PostgreSQL and MariaDB servers spawned by the test kit.

mod common;
mod config;
mod fencing;
mod holding;
mod races;
mod restart;
mod schema;
mod stale_write;
mod tls;
mod waiting;
