//! The register's line protocol from async code: the client processes talk
//! to the fenced register without blocking their runtime.

use std::io;
use std::net::SocketAddr;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

/// One connection to the register, speaking for one client id.
#[derive(Debug)]
pub struct Wire {
    id: String,
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
}

impl Wire {
    /// Connects as `id` (one word, as the register requires).
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped connect leaves nothing behind.
    pub async fn connect(addr: SocketAddr, id: &str) -> io::Result<Wire> {
        if id.is_empty() || id.contains(char::is_whitespace) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("client id {id:?} must be one word"),
            ));
        }
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (r, writer) = stream.into_split();
        Ok(Wire {
            id: id.to_owned(),
            reader: BufReader::new(r),
            writer,
        })
    }

    /// Sends `VERB ID ARG` and returns the reply (`OK`, `STALE`).
    ///
    /// # Cancel safety
    /// Not cancel safe: a call dropped between its request and its reply
    /// leaves the reply unread, and the next call would read it.
    pub async fn call(&mut self, verb: &str, arg: &str) -> io::Result<String> {
        let line = if arg.is_empty() {
            format!("{verb} {}\n", self.id)
        } else {
            format!("{verb} {} {arg}\n", self.id)
        };
        self.writer.write_all(line.as_bytes()).await?;
        let mut reply = String::new();
        if self.reader.read_line(&mut reply).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let reply = reply.trim_end();
        match reply.strip_prefix("ERR ") {
            Some(why) => Err(io::Error::new(io::ErrorKind::InvalidData, why.to_owned())),
            None => Ok(reply.to_owned()),
        }
    }

    /// `WRITE`: `Ok(true)` when the fence accepted the token.
    ///
    /// # Cancel safety
    /// Not cancel safe, as [`call`](Wire::call).
    pub async fn write(&mut self, token: u64) -> io::Result<bool> {
        Ok(self.call("WRITE", &token.to_string()).await? == "OK")
    }
}
