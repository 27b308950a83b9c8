//! Real servers and network faults for polylock's tests.
//!
//! Each server type starts the real daemon as a child process on a free port
//! of 127.0.0.1, with its data in a fresh temp directory, and returns once it
//! answers its protocol. Tests can then freeze it ([`RedisServer::pause`],
//! SIGSTOP), continue it (`resume`, SIGCONT), crash it (`kill`, SIGKILL) and
//! bring it back (`restart`: same port, same data directory). Dropping a
//! server kills its process group and removes the directory; a watchdog
//! process does the same if the test binary dies without running destructors.
//!
//! The API is synchronous and every type is `Send + Sync` with `&self`
//! methods, so one server can be shared by tests running on different async
//! runtimes (for example from a `static` `OnceLock`).
//!
//! A server whose binary is missing makes `start` return
//! [`Error::MissingBinary`], naming the binary and the Debian package that
//! `scripts/install-deps.sh` installs.
//!
//! [`register::Register`] is the fenced register the fault suite and the
//! migration drill check mutual exclusion with, outside every client.
//!
//! [`Proxy`] sits between a client and a server to delay, blackhole or reset
//! the traffic.

mod clock;
mod error;
mod etcd;
mod mariadb;
mod ports;
mod postgres;
mod process;
mod proxy;
mod redis;
mod redis_cluster;
pub mod register;
mod tls;
mod zookeeper;

pub use clock::{FakeClock, LIBFAKETIME};
pub use error::{Error, Result};
pub use etcd::{EtcdCluster, EtcdMember, EtcdServer};
pub use mariadb::MariaDbServer;
pub use ports::{free_port, try_free_port};
pub use postgres::PostgresServer;
pub use process::{run_with_timeout, ServerProcess};
pub use proxy::{Mode, Proxy};
pub use redis::RedisServer;
pub use redis_cluster::RedisCluster;
pub use tls::{make_certs, TestCerts};
pub use zookeeper::{ZooKeeperEnsemble, ZooKeeperMember, ZooKeeperServer};

#[cfg(test)]
mod send_sync {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn all_public_types_are_send_and_sync() {
        assert_send_sync::<RedisServer>();
        assert_send_sync::<RedisCluster>();
        assert_send_sync::<EtcdServer>();
        assert_send_sync::<EtcdMember>();
        assert_send_sync::<EtcdCluster>();
        assert_send_sync::<ZooKeeperServer>();
        assert_send_sync::<ZooKeeperMember>();
        assert_send_sync::<ZooKeeperEnsemble>();
        assert_send_sync::<PostgresServer>();
        assert_send_sync::<MariaDbServer>();
        assert_send_sync::<ServerProcess>();
        assert_send_sync::<Proxy>();
        assert_send_sync::<FakeClock>();
        assert_send_sync::<Error>();
    }
}
