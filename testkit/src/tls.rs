//! A test certificate authority and a server certificate it signed, made
//! with the `openssl` command line, for servers that speak TLS in tests.
//!
//! A real chain, not one self-signed certificate: rustls (webpki) refuses
//! a CA certificate presented as the server's own, so a client that
//! verifies needs a CA file apart from the server's certificate. The server
//! certificate names `localhost` and `127.0.0.1`, so clients may verify the
//! host name too.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::Result;
use crate::process::{find_binary, CommandSpec};

/// How long one openssl step may take.
const STEP_TIMEOUT: Duration = Duration::from_secs(60);

/// The files [`make_certs`] wrote.
#[derive(Clone, Debug)]
pub struct TestCerts {
    /// The CA certificate (PEM): what a client trusts.
    pub ca: PathBuf,
    /// The server's certificate (PEM), signed by the CA.
    pub cert: PathBuf,
    /// The server's private key (PEM), readable by its owner only.
    pub key: PathBuf,
}

/// Writes a new CA and a server certificate for `localhost`/127.0.0.1 into
/// `dir` (which must exist), running openssl as `os_user` when given, so
/// that the files belong to the server's OS user (PostgreSQL refuses a key
/// that others can read or that is not its own).
pub fn make_certs(dir: &Path, os_user: Option<(u32, u32)>) -> Result<TestCerts> {
    let openssl = find_binary("openssl", "openssl", &[])?;
    let step = |what: &str, args: &[&str]| {
        CommandSpec::new(&openssl)
            .args(args)
            .user(os_user)
            .cwd(dir)
            .run_checked(what, STEP_TIMEOUT)
            .map(drop)
    };
    step(
        "making a test CA",
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=polylock test CA",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ],
    )?;
    step(
        "making a server key and request",
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ],
    )?;
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )
    .map_err(|e| crate::Error::io(format!("writing {}", dir.join("server.ext").display()), e))?;
    if let Some((uid, gid)) = os_user {
        std::os::unix::fs::chown(dir.join("server.ext"), Some(uid), Some(gid)).map_err(|e| {
            crate::Error::io(format!("chown {}", dir.join("server.ext").display()), e)
        })?;
    }
    step(
        "signing the server certificate",
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "server.ext",
            "-out",
            "server.pem",
        ],
    )?;
    Ok(TestCerts {
        ca: dir.join("ca.pem"),
        cert: dir.join("server.pem"),
        key: dir.join("server.key"),
    })
}
