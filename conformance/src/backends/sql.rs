//! The SQL backend on its three databases: SQLite (a temp file), and
//! PostgreSQL and MariaDB spawned by the test kit.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use backend_sql::{Dialect, SqlBackend};
use lock_core::{Guarantees, LockBackend, LockError};
use testkit::{MariaDbServer, PostgresServer};

use super::Registration;
use crate::fixture::{Fixture, Link};

/// What keeps the database alive for the whole run.
enum Keep {
    #[allow(dead_code)] // held only for its lifetime
    Dir(TempDir),
    Postgres(PostgresServer),
    MariaDb(MariaDbServer),
}

/// One database; every client is a new `SqlBackend` with its own pool.
struct SqlFixture {
    dialect: Dialect,
    url: String,
    keep: Keep,
}

#[async_trait]
impl Fixture for SqlFixture {
    fn guarantees(&self) -> Guarantees {
        backend_sql::guarantees(self.dialect)
    }
    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        Ok(Arc::new(SqlBackend::connect(&self.url).await?))
    }

    async fn restart_server(&self) -> Result<bool, String> {
        match &self.keep {
            // The database is the file: every client opens it anew.
            Keep::Dir(_) => Ok(true),
            Keep::Postgres(server) => {
                tokio::task::block_in_place(|| server.restart()).map_err(|e| e.to_string())?;
                Ok(true)
            }
            Keep::MariaDb(server) => {
                tokio::task::block_in_place(|| server.restart()).map_err(|e| e.to_string())?;
                Ok(true)
            }
        }
    }

    async fn client_through_proxy(
        &self,
        op_timeout: Duration,
    ) -> Result<Option<(Arc<dyn LockBackend>, Link)>, LockError> {
        let addr = match &self.keep {
            Keep::Dir(_) => return Ok(None),
            Keep::Postgres(server) => server.addr(),
            Keep::MariaDb(server) => server.addr(),
        };
        let link = Link::to(&[addr])?;
        let url = link.url(&self.url, "op_timeout", op_timeout);
        Ok(Some((Arc::new(SqlBackend::connect(&url).await?), link)))
    }
}

/// SQLite on a temp file.
pub(super) fn sqlite() -> Registration {
    Registration {
        label: "sqlite",
        guarantees: || backend_sql::guarantees(Dialect::Sqlite),
        setup: sqlite_setup,
    }
}

/// PostgreSQL spawned by the test kit.
pub(super) fn postgres() -> Registration {
    Registration {
        label: "postgres",
        guarantees: || backend_sql::guarantees(Dialect::Postgres),
        setup: postgres_setup,
    }
}

/// MariaDB spawned by the test kit, through the `mariadb://` scheme.
pub(super) fn mariadb() -> Registration {
    Registration {
        label: "mariadb",
        guarantees: || backend_sql::guarantees(Dialect::MySql),
        setup: mariadb_setup,
    }
}

fn sqlite_setup() -> Result<Arc<dyn Fixture>, String> {
    let dir = TempDir::new().map_err(|e| format!("temp dir for SQLite: {e}"))?;
    let url = format!("sqlite://{}", dir.0.join("locks.db").display());
    Ok(Arc::new(SqlFixture {
        dialect: Dialect::Sqlite,
        url,
        keep: Keep::Dir(dir),
    }))
}

fn postgres_setup() -> Result<Arc<dyn Fixture>, String> {
    let server = PostgresServer::start().map_err(|e| e.to_string())?;
    Ok(Arc::new(SqlFixture {
        dialect: Dialect::Postgres,
        url: server.url(),
        keep: Keep::Postgres(server),
    }))
}

fn mariadb_setup() -> Result<Arc<dyn Fixture>, String> {
    let server = MariaDbServer::start().map_err(|e| e.to_string())?;
    // The `mariadb://` alias, so the suite covers it too.
    let url = server.url().replacen("mysql://", "mariadb://", 1);
    Ok(Arc::new(SqlFixture {
        dialect: Dialect::MySql,
        url,
        keep: Keep::MariaDb(server),
    }))
}

/// A temp directory named after this process. The harness exits without
/// running destructors, so each setup also removes the directories of
/// earlier runs whose process is gone.
struct TempDir(PathBuf);

const PREFIX: &str = "polylock-conformance-sqlite-";

impl TempDir {
    fn new() -> std::io::Result<TempDir> {
        let tmp = std::env::temp_dir();
        if let Ok(entries) = std::fs::read_dir(&tmp) {
            for entry in entries.flatten() {
                let name = entry.file_name();
                let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)) else {
                    continue;
                };
                let pid = pid.split('-').next().unwrap_or("");
                if !pid.is_empty() && !PathBuf::from(format!("/proc/{pid}")).exists() {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        let dir = tmp.join(format!(
            "{PREFIX}{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir)?;
        Ok(TempDir(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
