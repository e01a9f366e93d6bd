//! `vaultd mcp serve --listen`: the gateway over streamable HTTP (docs/design.md §14 item 1), on a
//! loopback address or a unix socket, endpoint `/mcp`. rmcp's `StreamableHttpService` speaks the
//! protocol (sessions for 2025 clients, stateless 2026-07-28 requests, `Host` checks against DNS
//! rebinding); hyper's HTTP/1 server carries it. Every request must carry the bearer token of
//! `[gateway] token` before it reaches the protocol.

use super::Gateway;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use sha2::{Digest, Sha256};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

/// Where the gateway listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl Listen {
    /// `127.0.0.1:8765`, `[::1]:8765`, `localhost:8765` or `unix:PATH`. Only loopback: the
    /// gateway runs a person's tools, and a port open to the network would offer them to it.
    pub fn parse(text: &str) -> Result<Listen, String> {
        if let Some(path) = text.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(
                    "`unix:` needs a socket path, e.g. unix:/run/user/1000/vaultd.sock".into(),
                );
            }
            return Ok(Listen::Unix(PathBuf::from(path)));
        }
        let text = match text.strip_prefix("localhost:") {
            Some(port) => format!("127.0.0.1:{port}"),
            None => text.to_string(),
        };
        let addr: SocketAddr = text.parse().map_err(|_| {
            format!("`{text}` is not an address: give 127.0.0.1:PORT, [::1]:PORT or unix:PATH")
        })?;
        if !addr.ip().is_loopback() {
            return Err(format!(
                "{addr} is not a loopback address: the gateway listens on 127.0.0.1, ::1 or a unix socket only"
            ));
        }
        Ok(Listen::Tcp(addr))
    }
}

type Reply = hyper::Response<http_body_util::combinators::BoxBody<Bytes, Infallible>>;

fn plain(status: u16, text: &str) -> Reply {
    let mut r = hyper::Response::new(Full::new(Bytes::from(text.to_string())).boxed());
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::BAD_REQUEST);
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Whether `request` carries `Authorization: Bearer TOKEN` (compared as SHA-256 digests, so
/// the comparison's time says nothing about the token).
fn authorized(request: &hyper::Request<Incoming>, token: Option<&[u8; 32]>) -> bool {
    let Some(want) = token else { return true };
    request
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|got| Sha256::digest(got.trim().as_bytes()).as_slice() == want.as_slice())
}

/// Accepts connections on a TCP or unix listener, each served on its own task, until
/// `shutdown` resolves.
macro_rules! accept_until {
    ($listener:ident, $shutdown:ident, $handle:ident) => {
        loop {
            tokio::select! {
                accepted = $listener.accept() => {
                    let Ok((stream, _)) = accepted else { continue };
                    spawn_connection(stream, $handle.clone());
                }
                () = &mut $shutdown => break,
            }
        }
    };
}

/// Serves `gateway` on `listen` until `shutdown` resolves. `token`: what clients must send
/// (`None` only with `--insecure-no-token`). `ready` is told the address actually bound
/// (port 0 picks a free one).
pub async fn serve(
    gateway: Gateway,
    listen: Listen,
    token: Option<String>,
    ready: impl FnOnce(String),
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    // Its defaults: `Host` must be a loopback name (DNS rebinding), 2025 clients get sessions.
    // A request that carries an `Origin` (a browser's) must come from a page on this machine:
    // a web page elsewhere is refused even with the token (the MCP transport spec's check).
    let config = StreamableHttpServerConfig::default().with_allowed_origins([
        "http://localhost:*",
        "http://127.0.0.1:*",
        "http://[::1]:*",
    ]);
    let service = StreamableHttpService::new(
        move || Ok(gateway.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let token: Option<[u8; 32]> = token.map(|t| Sha256::digest(t.as_bytes()).into());
    let handle = move |request: hyper::Request<Incoming>| {
        let service = service.clone();
        async move {
            if request.uri().path() != "/mcp" {
                return Ok::<_, Infallible>(plain(404, "not found: the MCP endpoint is /mcp\n"));
            }
            if !authorized(&request, token.as_ref()) {
                let mut r = plain(401, "a bearer token is required ([gateway] token)\n");
                r.headers_mut().insert(
                    hyper::header::WWW_AUTHENTICATE,
                    hyper::header::HeaderValue::from_static("Bearer"),
                );
                return Ok(r);
            }
            Ok(service.handle(request).await)
        }
    };
    tokio::pin!(shutdown);
    match listen {
        Listen::Tcp(addr) => {
            let listener = tokio::net::TcpListener::bind(addr).await?;
            ready(format!("http://{}/mcp", listener.local_addr()?));
            accept_until!(listener, shutdown, handle);
        }
        Listen::Unix(path) => {
            // A socket left by a gateway that crashed; anything else at the path is refused.
            if std::fs::symlink_metadata(&path)
                .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
            {
                std::fs::remove_file(&path)?;
            }
            let listener = bind_owner_only(&path)?;
            let _unlink = RemoveOnDrop(&path);
            ready(format!("unix:{} (endpoint /mcp)", path.display()));
            accept_until!(listener, shutdown, handle);
        }
    }
    Ok(())
}

/// Removes the socket at its path however serving ends: by `shutdown`, or by this future
/// being dropped (`vaultd mcp serve` whose own daemon stopped).
struct RemoveOnDrop<'a>(&'a std::path::Path);

impl Drop for RemoveOnDrop<'_> {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.0);
    }
}

/// A unix socket at `path` that only its owner may connect to, from its first moment: bound
/// in a folder of its own beside `path` that only the owner may enter (0700: connecting
/// needs search permission on it), made 0600, then renamed to `path` (never over anything
/// there), and the folder removed. Bound at `path` itself, it would be there with the
/// umask's mode until the chmod, and a connection made then would be accepted.
fn bind_owner_only(path: &std::path::Path) -> std::io::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let (Some(folder), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(std::io::Error::other(format!(
            "{}: not a path to a socket",
            path.display()
        )));
    };
    let folder = if folder.as_os_str().is_empty() {
        std::path::Path::new(".")
    } else {
        folder
    };
    let path = folder.join(name);
    // Short: a socket's path has at most 107 bytes, and this one should fit when `path` does.
    let private = folder.join(format!(".vd{}", std::process::id()));
    let staging = private.join("s");
    let _ = std::fs::remove_file(&staging);
    let _ = std::fs::remove_dir(&private);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&private)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", private.display())))?;
    let placed = tokio::net::UnixListener::bind(&staging)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))
        .and_then(|listener| {
            std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o600))?;
            match crate::beneath::rename_noreplace(folder, &staging, &path) {
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)) => {
                    // No RENAME_NOREPLACE on this file system: check, then rename.
                    if std::fs::symlink_metadata(&path).is_ok() {
                        return Err(std::io::Error::from(std::io::ErrorKind::AlreadyExists));
                    }
                    std::fs::rename(&staging, &path)?;
                }
                other => other?,
            }
            Ok(listener)
        });
    let _ = std::fs::remove_file(&staging);
    let _ = std::fs::remove_dir(&private);
    placed.map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            std::io::Error::new(
                e.kind(),
                format!("{} exists and is not a socket", path.display()),
            )
        } else {
            e
        }
    })
}

fn spawn_connection<IO, H, F>(stream: IO, handle: H)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    H: Fn(hyper::Request<Incoming>) -> F + Send + Sync + 'static,
    F: Future<Output = Result<Reply, Infallible>> + Send + 'static,
{
    tokio::spawn(async move {
        let io = hyper_util::rt::TokioIo::new(stream);
        let service = hyper::service::service_fn(handle);
        if let Err(e) = hyper::server::conn::http1::Builder::new()
            .serve_connection(io, service)
            .await
        {
            tracing::debug!("gateway HTTP connection: {e}");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_addresses_and_unix_sockets() {
        assert_eq!(
            Listen::parse("127.0.0.1:8765"),
            Ok(Listen::Tcp("127.0.0.1:8765".parse().unwrap()))
        );
        assert_eq!(
            Listen::parse("localhost:0"),
            Ok(Listen::Tcp("127.0.0.1:0".parse().unwrap()))
        );
        assert!(Listen::parse("[::1]:1").is_ok());
        assert_eq!(
            Listen::parse("unix:/tmp/v.sock"),
            Ok(Listen::Unix("/tmp/v.sock".into()))
        );
        for bad in [
            "0.0.0.0:8765",
            "192.168.1.2:80",
            "example.com:80",
            "unix:",
            "8765",
        ] {
            assert!(Listen::parse(bad).is_err(), "{bad}");
        }
    }
}
