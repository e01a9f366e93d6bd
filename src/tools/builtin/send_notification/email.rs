//! Email through lettre: the `.eml` outbox (the default: a fresh install sends nothing) or
//! SMTP with implicit TLS or STARTTLS. Every message carries `Message-ID: <call_id@host>` so
//! a duplicate can always be told apart (docs/design.md §4, §8.10).

use super::{EmailConfig, EmailTransport, StartTls};
use crate::call::{CallError, ErrorCode};
use crate::tools::{RegistryError, ToolCall};
use lettre::message::Mailbox;
use lettre::message::header::ContentType;
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
use lettre::transport::smtp::{AsyncSmtpTransport, AsyncSmtpTransportBuilder};
use lettre::{Address, AsyncTransport, Message, Tokio1Executor};
use std::error::Error as _;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use super::TOOL;

const SMTPS_PORT: u16 = 465;
const SUBMISSION_PORT: u16 = 587;

pub(super) struct Email {
    from: Mailbox,
    /// The right-hand side of every Message-ID.
    message_id_host: String,
    transport: Transport,
}

enum Transport {
    File {
        outbox: PathBuf,
    },
    Smtp(Box<Smtp>),
}

struct Smtp {
    /// `host:port`, for messages (the URL never holds credentials: the config refuses them).
    server: String,
    /// Everything decided and checked in `new`: host, port, TLS mode, credentials, timeout.
    builder: AsyncSmtpTransportBuilder,
    /// The pooled transport, built once from `builder` at the first send: lettre's pool spawns
    /// its cleanup task on the current tokio runtime, so building it in `new` would panic
    /// wherever the registry is built outside a runtime (e.g. `vaultd tools`).
    transport: OnceLock<AsyncSmtpTransport<Tokio1Executor>>,
}

/// How the connection to the SMTP server is protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Security {
    /// `smtps://`: TLS from the first byte.
    Implicit,
    /// `smtp://` and the server must upgrade with STARTTLS, or nothing is sent.
    StartTlsRequired,
    /// `smtp://`, STARTTLS when offered, plaintext otherwise.
    StartTlsOpportunistic,
}

/// Where and how to connect, decided from the config alone (pure, so it is tested alone).
#[derive(Debug, Clone, PartialEq, Eq)]
struct SmtpPlan {
    host: String,
    port: u16,
    security: Security,
}

/// Reads `smtp://host[:port]` / `smtps://host[:port]`. Credentials never travel over an
/// unencrypted connection except to a loopback address (docs/design.md §8.12): with credentials and a
/// remote host, opportunistic STARTTLS becomes required.
fn plan_smtp(url: &str, starttls: StartTls, has_credentials: bool) -> Result<SmtpPlan, String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("`{url}` is not a URL: {e}"))?;
    let Some(host) = parsed.host_str() else {
        return Err(format!("`{url}` has no host"));
    };
    // IPv6 hosts come bracketed (`[::1]`); lettre and rustls want the bare address.
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
        .to_string();
    let (security, default_port) = match (parsed.scheme(), starttls) {
        ("smtps", _) => (Security::Implicit, SMTPS_PORT),
        ("smtp", StartTls::Required) => (Security::StartTlsRequired, SUBMISSION_PORT),
        ("smtp", StartTls::Opportunistic) if has_credentials && !crate::tools::http::is_loopback_host(&host) => {
            (Security::StartTlsRequired, SUBMISSION_PORT)
        }
        ("smtp", StartTls::Opportunistic) => (Security::StartTlsOpportunistic, SUBMISSION_PORT),
        (other, _) => return Err(format!("scheme `{other}` is not smtp or smtps")),
    };
    Ok(SmtpPlan {
        host,
        port: parsed.port().unwrap_or(default_port),
        security,
    })
}

impl Email {
    pub(super) fn new(config: &EmailConfig, timeout: Duration) -> Result<Email, RegistryError> {
        Email::with_extra_roots(config, timeout, &[])
    }

    /// `extra_roots` are trusted beside the platform's: tests use it for their own CA.
    fn with_extra_roots(
        config: &EmailConfig,
        timeout: Duration,
        extra_roots: &[Certificate],
    ) -> Result<Email, RegistryError> {
        let setup = |key: &str, message: String| RegistryError::Setup {
            tool: TOOL.to_string(),
            message: format!("tools.send_notification.email.{key}: {message}"),
        };
        let setup_failed = |key: &str, message: String, source: Box<dyn std::error::Error + Send + Sync>| {
            RegistryError::SetupFailed {
                tool: TOOL.to_string(),
                message: format!("tools.send_notification.email.{key}: {message}"),
                source,
            }
        };
        let from: Mailbox = config.from.parse().map_err(|e| {
            setup_failed(
                "from",
                format!("`{}` is not a mailbox", config.from),
                Box::new(e),
            )
        })?;
        let transport = match &config.transport {
            EmailTransport::File { outbox } => Transport::File {
                outbox: outbox.clone(),
            },
            EmailTransport::Smtp {
                url,
                starttls,
                username,
                password,
            } => {
                let credentials = match (username, password) {
                    (Some(u), Some(p)) => Some(Credentials::new(u.clone(), p.expose().to_string())),
                    (None, None) => None,
                    _ => {
                        return Err(setup(
                            "username",
                            "`username` and `password` go together: set both or neither".into(),
                        ));
                    }
                };
                let plan = plan_smtp(url, *starttls, credentials.is_some())
                    .map_err(|m| setup("smtp_url", m))?;
                if plan.security == Security::StartTlsRequired
                    && *starttls == StartTls::Opportunistic
                {
                    tracing::info!(
                        host = plan.host,
                        "SMTP credentials are configured for a remote server: STARTTLS is required, never plaintext"
                    );
                }
                let tls_parameters = || {
                    extra_roots
                        .iter()
                        .fold(TlsParameters::builder(plan.host.clone()), |b, c| {
                            b.add_root_certificate(c.clone())
                        })
                        .build()
                        .map_err(|e| {
                            setup_failed("smtp_url", "TLS setup failed".to_string(), Box::new(e))
                        })
                };
                let tls = match plan.security {
                    Security::Implicit => Tls::Wrapper(tls_parameters()?),
                    Security::StartTlsRequired => Tls::Required(tls_parameters()?),
                    Security::StartTlsOpportunistic => Tls::Opportunistic(tls_parameters()?),
                };
                let mut builder =
                    AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(plan.host.clone())
                        .port(plan.port)
                        .tls(tls)
                        // Per SMTP command; the whole send is also bounded by the deadline.
                        .timeout(Some(timeout));
                if let Some(c) = credentials {
                    builder = builder.credentials(c);
                }
                Transport::Smtp(Box::new(Smtp {
                    server: format!("{}:{}", plan.host, plan.port),
                    builder,
                    transport: OnceLock::new(),
                }))
            }
        };
        Ok(Email {
            from,
            message_id_host: config.message_id_host.clone(),
            transport,
        })
    }

    /// Sends one message and returns its Message-ID value.
    pub(super) async fn send(
        &self,
        call: &ToolCall<'_>,
        to: Address,
        subject: &str,
        body: &str,
    ) -> Result<String, CallError> {
        let message_id = format!("<{}@{}>", call.call_id, self.message_id_host);
        let message = self.build_message(&message_id, to.clone(), subject, body)?;
        match &self.transport {
            Transport::File { outbox } => {
                // One trip to the blocking pool for the whole write (a hop each cost more than
                // the write itself under load). §9.5: the outbox holds whole messages: its
                // folder 0700, each file 0600, named `<uuid>.eml` as lettre's file transport
                // names them. Durable before the call is recorded as done: after a crash the
                // journal's "sent" must still have its message in the outbox. The file is
                // written before it has a name (`private::create_whole`), so a mail pickup
                // reading the outbox never finds half a message; its fsync after
                // the link makes the name durable too on the journaling file systems Linux
                // runs on. The folder's own fsync, which POSIX asks for, is left to the
                // flusher, shared with every email of the next few milliseconds
                // (`journal/mod.rs`, "Durability soon").
                let dir = outbox.clone();
                let bytes = message.formatted();
                let written = tokio::task::spawn_blocking(move || {
                    crate::private::create_dir(&dir).map_err(|e| {
                        format!("cannot create the outbox {}: {e}", dir.display())
                    })?;
                    let file = dir.join(format!("{}.eml", uuid::Uuid::new_v4()));
                    let written = crate::private::create_whole(&file, &bytes).map_err(|e| {
                        format!("cannot write the email into the outbox {}: {e}", dir.display())
                    })?;
                    // Named whole already: a failed fsync is no failed send (a retry would
                    // send twice), only a weaker durability, as ever.
                    if let Err(e) = written.sync_all() {
                        tracing::warn!(file = %file.display(), "cannot fsync the email in the outbox: {e}");
                    }
                    crate::files::fsync_dir_soon(&dir);
                    Ok::<_, String>(file)
                })
                .await
                .expect("outbox write task does not panic")
                .map_err(|message| CallError::new(ErrorCode::ExecutionError, message))?;
                tracing::info!(call_id = call.call_id, file = %written.display(), "email written to the outbox");
            }
            Transport::Smtp(smtp) => {
                let transport = smtp.transport.get_or_init(|| smtp.builder.clone().build());
                let deadline = tokio::time::Instant::from_std(call.deadline);
                match tokio::time::timeout_at(deadline, transport.send(message)).await {
                    Ok(Ok(response)) => {
                        tracing::info!(call_id = call.call_id, code = %response.code(), "email accepted by the SMTP server");
                    }
                    Ok(Err(e)) => return Err(smtp_error(&smtp.server, &to, &e)),
                    Err(_elapsed) => {
                        return Err(CallError::new(
                            ErrorCode::Timeout,
                            format!(
                                "the SMTP server {} did not finish before the call's deadline; the email may or may not have been sent (Message-ID {message_id})",
                                smtp.server
                            ),
                        ));
                    }
                }
            }
        }
        Ok(message_id)
    }

    /// The email exactly as [`send`](Self::send) would hand it to the transport (headers and
    /// body), and where it would go. Nothing is sent or written.
    pub(super) fn preview(
        &self,
        call: &ToolCall<'_>,
        to: Address,
        subject: &str,
        body: &str,
    ) -> serde_json::Value {
        let message_id = format!("<{}@{}>", call.call_id, self.message_id_host);
        let transport = match &self.transport {
            Transport::File { outbox } => {
                format!(
                    "written as an .eml file into the outbox {}",
                    outbox.display()
                )
            }
            Transport::Smtp(smtp) => format!("sent through the SMTP server {}", smtp.server),
        };
        match self.build_message(&message_id, to.clone(), subject, body) {
            Ok(message) => serde_json::json!({
                "description": format!("would send this email to {to}, {transport}"),
                "transport": transport,
                "message_id": message_id,
                "email": String::from_utf8_lossy(&message.formatted()).replace("\r\n", "\n"),
            }),
            Err(e) => serde_json::json!({ "description": format!("would fail: {e}") }),
        }
    }

    fn build_message(
        &self,
        message_id: &str,
        to: Address,
        subject: &str,
        body: &str,
    ) -> Result<Message, CallError> {
        // lettre encodes header values, but a line break has no business in a subject: fold
        // it into a space rather than trust every layer to keep it out of the header block.
        let subject: String = subject
            .chars()
            .map(|c| if c == '\r' || c == '\n' { ' ' } else { c })
            .collect();
        Message::builder()
            .from(self.from.clone())
            .to(Mailbox::new(None, to))
            .subject(subject)
            .message_id(Some(message_id.to_string()))
            .header(ContentType::TEXT_PLAIN)
            .body(body.to_string())
            .map_err(|e| {
                CallError::new(
                    ErrorCode::ExecutionError,
                    format!("cannot build the email: {e}"),
                )
            })
    }
}

/// A readable SMTP failure that keeps the server's reply. Retryable for connection failures
/// and 4xx (transient) replies, not for 5xx (permanent) ones (docs/design.md §8.4).
fn smtp_error(server: &str, to: &Address, e: &lettre::transport::smtp::Error) -> CallError {
    if let Some(code) = e.status() {
        let reply = e.source().map(|s| s.to_string()).unwrap_or_default();
        let reply = format!("{code} {reply}");
        let reply = reply.trim();
        // 530/534/535/538 and 454 answer AUTH; everything else answers the mail itself.
        let auth = matches!(
            code.to_string().as_str(),
            "530" | "534" | "535" | "538" | "454"
        );
        let what = match (auth, e.is_transient()) {
            (true, _) => format!("SMTP server {server} refused the login"),
            (false, true) => format!("SMTP server {server} deferred the email to {to}"),
            (false, false) => format!("SMTP server {server} rejected the email to {to}"),
        };
        return CallError::new(ErrorCode::ExecutionError, format!("{what}: {reply}"))
            .retryable(e.is_transient());
    }
    let cause = super::root_cause(e);
    if e.is_timeout() {
        return CallError::new(
            ErrorCode::ExecutionError,
            format!("SMTP server {server} did not answer in time: {cause}"),
        )
        .retryable(true);
    }
    // lettre reports a failed TLS handshake (an untrusted certificate, say) as a connection
    // error; the TLS layer marks it as invalid data. Retrying cannot fix a certificate.
    if e.is_tls() || super::io_error_kind(e) == Some(std::io::ErrorKind::InvalidData) {
        return CallError::new(
            ErrorCode::ExecutionError,
            format!("TLS with the SMTP server {server} failed: {cause}"),
        );
    }
    if e.is_client() || e.is_response() {
        // Our side refused to go on (e.g. STARTTLS required but not offered, no common AUTH
        // mechanism) or the server spoke nonsense: trying again changes nothing.
        return CallError::new(
            ErrorCode::ExecutionError,
            format!("SMTP with {server} failed: {cause}"),
        );
    }
    CallError::new(
        ErrorCode::ExecutionError,
        format!("could not reach the SMTP server {server}: {cause}"),
    )
    .retryable(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_reads_schemes_ports_and_tls() {
        let p = plan_smtp("smtps://mail.example.org", StartTls::Opportunistic, true).unwrap();
        assert_eq!(
            p,
            SmtpPlan {
                host: "mail.example.org".into(),
                port: 465,
                security: Security::Implicit
            }
        );
        let p = plan_smtp("smtp://mail.example.org", StartTls::Required, false).unwrap();
        assert_eq!((p.port, p.security), (587, Security::StartTlsRequired));
        let p = plan_smtp(
            "smtp://mail.example.org:2525",
            StartTls::Opportunistic,
            false,
        )
        .unwrap();
        assert_eq!(
            (p.port, p.security),
            (2525, Security::StartTlsOpportunistic)
        );
        let p = plan_smtp("smtp://[::1]:25", StartTls::Opportunistic, true).unwrap();
        assert_eq!(p.host, "::1");
    }

    #[test]
    fn credentials_never_go_unencrypted_to_a_remote_host() {
        let p = plan_smtp("smtp://mail.example.org", StartTls::Opportunistic, true).unwrap();
        assert_eq!(p.security, Security::StartTlsRequired);
        for loopback in [
            "smtp://127.0.0.1:2525",
            "smtp://127.8.9.10",
            "smtp://[::1]:2525",
            "smtp://LocalHost:2525",
        ] {
            let p = plan_smtp(loopback, StartTls::Opportunistic, true).unwrap();
            assert_eq!(p.security, Security::StartTlsOpportunistic, "{loopback}");
        }
        // Not loopback, whatever the name suggests.
        let p = plan_smtp(
            "smtp://localhost.example.org",
            StartTls::Opportunistic,
            true,
        )
        .unwrap();
        assert_eq!(p.security, Security::StartTlsRequired);
    }

    use super::super::SendNotificationConfig;
    use super::super::tests_support::*;
    use crate::call::ErrorCode;
    use base64::Engine;
    use mailin_embedded::response::{self, Response};
    use mailin_embedded::{AuthMechanism, Handler, Server, SslConfig};
    use serde_json::json;
    use std::sync::{Arc, Mutex};

    const PASSWORD: &str = "s3cr3t-Pa55word";

    fn file_config(outbox: &std::path::Path) -> SendNotificationConfig {
        let mut c = base_config();
        c.email.transport = EmailTransport::File {
            outbox: outbox.to_path_buf(),
        };
        c
    }

    #[tokio::test]
    async fn the_outbox_gets_one_eml_with_headers_body_and_message_id() {
        let dir = tempfile::tempdir().unwrap();
        let outbox = dir.path().join("state/outbox"); // missing: created at the first send
        let tool = tool(&file_config(&outbox));
        let out = run(
            &tool,
            "c-3f2a9c1b0d4e",
            email_params("bob@x.org", "Weekly report", "All green.\nSee you."),
        )
        .await
        .unwrap();
        assert_eq!(
            out.data,
            json!({ "success": true, "message_id": "<c-3f2a9c1b0d4e@vault.test>" })
        );
        assert_eq!(out.summary, "email to bob@x.org");
        let files: Vec<_> = std::fs::read_dir(&outbox)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(files.len(), 1, "{files:?}");
        assert_eq!(files[0].extension().unwrap(), "eml");
        let eml = std::fs::read_to_string(&files[0]).unwrap();
        for line in [
            "From: \"Vault Agent\" <agent@example.com>\r\n",
            "To: bob@x.org\r\n",
            "Subject: Weekly report\r\n",
            "Message-ID: <c-3f2a9c1b0d4e@vault.test>\r\n",
            "Content-Type: text/plain; charset=utf-8\r\n",
        ] {
            assert!(eml.contains(line), "{line:?} missing in:\n{eml}");
        }
        assert!(eml.contains("All green.\r\nSee you."), "{eml}");
    }

    #[tokio::test]
    async fn a_line_break_in_the_subject_cannot_add_a_header() {
        let dir = tempfile::tempdir().unwrap();
        let tool = tool(&file_config(dir.path()));
        run(
            &tool,
            "c-inject",
            email_params("bob@x.org", "Hi\r\nBcc: evil@attacker.example", "b"),
        )
        .await
        .unwrap();
        let file = std::fs::read_dir(dir.path())
            .unwrap()
            .next()
            .unwrap()
            .unwrap();
        let eml = std::fs::read_to_string(file.path()).unwrap();
        assert!(!eml.contains("\r\nBcc:"), "{eml}");
        assert!(
            eml.contains("Subject: Hi  Bcc: evil@attacker.example\r\n"),
            "{eml}"
        );
    }

    // ---- SMTP against a real server (mailin-embedded) on 127.0.0.1 ----

    #[derive(Debug, Clone)]
    struct Received {
        from: String,
        to: Vec<String>,
        data: String,
    }

    /// How the test server answers; cloned per connection by mailin.
    #[derive(Clone, Default)]
    struct Smtpd {
        received: Arc<Mutex<Vec<Received>>>,
        /// Answer RCPT TO with this instead of 250.
        rcpt_reply: Option<(u16, &'static str)>,
        /// The only login AUTH PLAIN accepts.
        login: Option<(&'static str, &'static str)>,
        /// A careless server that quotes the password back in its refusal.
        echo_password_on_refusal: bool,
        current: Option<Received>,
    }

    impl Handler for Smtpd {
        fn rcpt(&mut self, _to: &str) -> Response {
            match self.rcpt_reply {
                Some((code, text)) => Response::custom(code, text.to_string()),
                None => response::OK,
            }
        }

        fn data_start(
            &mut self,
            _domain: &str,
            from: &str,
            _is8bit: bool,
            to: &[String],
        ) -> Response {
            self.current = Some(Received {
                from: from.to_string(),
                to: to.to_vec(),
                data: String::new(),
            });
            response::OK
        }

        fn data(&mut self, buf: &[u8]) -> std::io::Result<()> {
            if let Some(r) = self.current.as_mut() {
                r.data.push_str(&String::from_utf8_lossy(buf));
            }
            Ok(())
        }

        fn data_end(&mut self) -> Response {
            if let Some(r) = self.current.take() {
                self.received.lock().unwrap().push(r);
            }
            response::OK
        }

        fn auth_plain(&mut self, _authz: &str, user: &str, password: &str) -> Response {
            match self.login {
                Some(login) if login == (user, password) => response::AUTH_OK,
                _ if self.echo_password_on_refusal => {
                    Response::custom(535, format!("bad credentials {user}:{password}"))
                }
                _ => response::INVALID_CREDENTIALS,
            }
        }
    }

    // A test CA and a server certificate for 127.0.0.1 and localhost it signed (P-256, valid
    // until 2126), made with openssl. mailin offers AUTH only after STARTTLS, so every login
    // test runs over TLS.
    const TEST_CA: &str = "-----BEGIN CERTIFICATE-----
MIIBmTCCAT+gAwIBAgIURvoyFKCVdPyioCCY2vDQpC5+qNAwCgYIKoZIzj0EAwIw
GTEXMBUGA1UEAwwOdmF1bHRkIHRlc3QgQ0EwIBcNMjYxMTIxMTkwMDEyWhgPMjEy
NjEwMjgxOTAwMTJaMBkxFzAVBgNVBAMMDnZhdWx0ZCB0ZXN0IENBMFkwEwYHKoZI
zj0CAQYIKoZIzj0DAQcDQgAEuK0MU0RdHa/x+z/70dzz6T3JD5UhjlZccHSzlzMi
NaRq/61emBPxAys/QrZw3uc6sX54EGfrZLHVdrFRDIdk96NjMGEwHQYDVR0OBBYE
FAG+vprgenHWdHBoFN0FC76U7OP4MB8GA1UdIwQYMBaAFAG+vprgenHWdHBoFN0F
C76U7OP4MA8GA1UdEwEB/wQFMAMBAf8wDgYDVR0PAQH/BAQDAgEGMAoGCCqGSM49
BAMCA0gAMEUCIQDNGEPFiD9u3+l3XCZiJWKzBZp3yZWuxES38kILzfRJFQIgK6BJ
/jlYgOGlEXDoofzvRyMolvt2T2y3xEsZzK6wuE8=
-----END CERTIFICATE-----
";
    const SERVER_CERT: &str = "-----BEGIN CERTIFICATE-----
MIIBxDCCAWqgAwIBAgIUdP0yQgOb7wNEDeIOwHifyP/YRXswCgYIKoZIzj0EAwIw
GTEXMBUGA1UEAwwOdmF1bHRkIHRlc3QgQ0EwIBcNMjYxMTIxMTkwMDEyWhgPMjEy
NjEwMjgxOTAwMTJaMBQxEjAQBgNVBAMMCTEyNy4wLjAuMTBZMBMGByqGSM49AgEG
CCqGSM49AwEHA0IABBy1Q38z9cY4SDF/Ptk1FU6r7YI83enxI0e27HOr4bwfKiNm
jciZGBz1njG97nYYGSjzqhpxsiyWq2EYwSUWYUajgZIwgY8wDAYDVR0TAQH/BAIw
ADAOBgNVHQ8BAf8EBAMCB4AwEwYDVR0lBAwwCgYIKwYBBQUHAwEwGgYDVR0RBBMw
EYcEfwAAAYIJbG9jYWxob3N0MB0GA1UdDgQWBBQUqzO5VTD+qcN7YLYCYe9z7FMN
uTAfBgNVHSMEGDAWgBQBvr6a4Hpx1nRwaBTdBQu+lOzj+DAKBggqhkjOPQQDAgNI
ADBFAiEA/bSdC24XA2ziLsE5d89Mx18iW4jp6E3TOSHaP58inCgCIC5doBxcj2nw
sGdWp7HANNC3qv/5SeAybkHs8tOBT53C
-----END CERTIFICATE-----
";
    const SERVER_KEY: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgRQBcsnXq03Svj/bO
ynGPcV+tuLlHX+EgO8pLS4hOzLqhRANCAAQctUN/M/XGOEgxfz7ZNRVOq+2CPN3p
8SNHtuxzq+G8HyojZo3ImRgc9Z4xve52GBko86oacbIslqthGMElFmFG
-----END PRIVATE KEY-----
";

    /// Plaintext only, or STARTTLS with the test certificate and AUTH PLAIN.
    #[derive(Clone, Copy, PartialEq)]
    enum Offer {
        Plaintext,
        StartTlsAndLogin,
    }

    /// Starts the server on a thread (serve() blocks for ever) and returns its port.
    fn start_smtpd(handler: Smtpd, offer: Offer) -> u16 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut server = Server::new(handler);
        server.with_name("test.local").with_tcp_listener(listener);
        match offer {
            Offer::Plaintext => {
                server.with_ssl(SslConfig::None).unwrap();
            }
            Offer::StartTlsAndLogin => {
                // mailin reads the files in `with_ssl`; the folder may go right after.
                let dir = tempfile::tempdir().unwrap();
                let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
                std::fs::write(&cert, SERVER_CERT).unwrap();
                std::fs::write(&key, SERVER_KEY).unwrap();
                server
                    .with_ssl(SslConfig::SelfSigned {
                        cert_path: cert.display().to_string(),
                        key_path: key.display().to_string(),
                    })
                    .unwrap()
                    .with_auth(AuthMechanism::Plain);
            }
        }
        std::thread::spawn(move || {
            let _ = server.serve();
        });
        port
    }

    fn smtp_config(port: u16, login: Option<(&str, &str)>) -> SendNotificationConfig {
        let mut c = base_config();
        c.email.transport = EmailTransport::Smtp {
            url: format!("smtp://127.0.0.1:{port}"),
            starttls: StartTls::Opportunistic,
            username: login.map(|(u, _)| u.to_string()),
            password: login.map(|(_, p)| secret(p)),
        };
        c
    }

    /// The tool, trusting the test CA for SMTP.
    fn smtp_tool(config: &SendNotificationConfig) -> super::super::SendNotification {
        let mut t = tool(config);
        let ca = Certificate::from_pem(TEST_CA.as_bytes()).unwrap();
        t.email = Email::with_extra_roots(&config.email, config.timeout, &[ca]).unwrap();
        t
    }

    /// The password in every form it could leak in: plain and SMTP AUTH base64.
    fn assert_no_password(message: &str) {
        let b64 = base64::engine::general_purpose::STANDARD;
        assert!(!message.contains(PASSWORD), "{message}");
        assert!(!message.contains(&b64.encode(PASSWORD)), "{message}");
        assert!(
            !message.contains(&b64.encode(format!("\0agent\0{PASSWORD}"))),
            "{message}"
        );
    }

    #[tokio::test]
    async fn smtp_delivers_exactly_one_message_with_its_message_id() {
        let smtpd = Smtpd::default();
        let received = smtpd.received.clone();
        let port = start_smtpd(smtpd, Offer::Plaintext);
        let tool = smtp_tool(&smtp_config(port, None));
        let out = run(
            &tool,
            "c-smtp1",
            email_params("bob@x.org", "Build finished", "Everything passed."),
        )
        .await
        .unwrap();
        assert_eq!(out.data["message_id"], "<c-smtp1@vault.test>");
        let received = received.lock().unwrap().clone();
        assert_eq!(received.len(), 1, "{received:?}");
        let mail = &received[0];
        assert_eq!(mail.from, "agent@example.com");
        assert_eq!(mail.to, vec!["bob@x.org".to_string()]);
        assert!(
            mail.data.contains("Subject: Build finished\r\n"),
            "{}",
            mail.data
        );
        assert!(
            mail.data.contains("Message-ID: <c-smtp1@vault.test>\r\n"),
            "{}",
            mail.data
        );
        assert!(mail.data.contains("Everything passed."), "{}", mail.data);
    }

    #[tokio::test]
    async fn smtp_logs_in_on_loopback() {
        let smtpd = Smtpd {
            login: Some(("agent", PASSWORD)),
            ..Smtpd::default()
        };
        let received = smtpd.received.clone();
        let port = start_smtpd(smtpd, Offer::StartTlsAndLogin);
        let tool = smtp_tool(&smtp_config(port, Some(("agent", PASSWORD))));
        run(&tool, "c-smtp2", email_params("bob@x.org", "s", "b"))
            .await
            .unwrap();
        assert_eq!(received.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_refused_login_is_permanent_and_never_quotes_the_password() {
        let smtpd = Smtpd {
            login: Some(("agent", "another-password")),
            echo_password_on_refusal: true,
            ..Smtpd::default()
        };
        let port = start_smtpd(smtpd, Offer::StartTlsAndLogin);
        let tool = smtp_tool(&smtp_config(port, Some(("agent", PASSWORD))));
        let err = run(&tool, "c-smtp3", email_params("bob@x.org", "s", "b"))
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::ExecutionError);
        assert!(!err.retryable);
        assert!(
            err.message.contains("refused the login: 535"),
            "{}",
            err.message
        );
        assert!(err.message.contains("[redacted]"), "{}", err.message);
        assert_no_password(&err.message);
    }

    #[tokio::test]
    async fn a_550_for_the_recipient_is_readable_and_permanent() {
        let smtpd = Smtpd {
            rcpt_reply: Some((550, "5.1.1 No such user here")),
            login: Some(("agent", PASSWORD)),
            ..Smtpd::default()
        };
        let received = smtpd.received.clone();
        let port = start_smtpd(smtpd, Offer::StartTlsAndLogin);
        let tool = smtp_tool(&smtp_config(port, Some(("agent", PASSWORD))));
        let err = run(&tool, "c-smtp4", email_params("nobody@x.org", "s", "b"))
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::ExecutionError);
        assert!(!err.retryable);
        assert_eq!(
            err.message,
            format!(
                "SMTP server 127.0.0.1:{port} rejected the email to nobody@x.org: 550 5.1.1 No such user here"
            )
        );
        assert_no_password(&err.message);
        assert!(received.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_451_is_transient_and_retryable() {
        let smtpd = Smtpd {
            rcpt_reply: Some((451, "4.7.1 Greylisted, try again")),
            ..Smtpd::default()
        };
        let port = start_smtpd(smtpd, Offer::Plaintext);
        let tool = smtp_tool(&smtp_config(port, None));
        let err = run(&tool, "c-smtp5", email_params("bob@x.org", "s", "b"))
            .await
            .unwrap_err();
        assert!(err.retryable);
        assert!(
            err.message
                .contains("deferred the email to bob@x.org: 451 4.7.1 Greylisted"),
            "{}",
            err.message
        );
    }

    #[tokio::test]
    async fn a_closed_port_is_retryable_and_never_quotes_the_password() {
        let port = closed_port_uri()
            .rsplit(':')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let tool = smtp_tool(&smtp_config(port, Some(("agent", PASSWORD))));
        let err = run(&tool, "c-smtp6", email_params("bob@x.org", "s", "b"))
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::ExecutionError);
        assert!(err.retryable);
        assert!(
            err.message
                .starts_with(&format!("could not reach the SMTP server 127.0.0.1:{port}")),
            "{}",
            err.message
        );
        assert_no_password(&err.message);
    }

    #[tokio::test]
    async fn required_starttls_sends_nothing_to_a_plaintext_server() {
        let smtpd = Smtpd::default();
        let received = smtpd.received.clone();
        let port = start_smtpd(smtpd, Offer::Plaintext);
        let mut config = smtp_config(port, None);
        if let EmailTransport::Smtp { starttls, .. } = &mut config.email.transport {
            *starttls = StartTls::Required;
        }
        let err = run(
            &smtp_tool(&config),
            "c-smtp7",
            email_params("bob@x.org", "s", "b"),
        )
        .await
        .unwrap_err();
        assert!(!err.retryable);
        assert!(err.message.contains("STARTTLS"), "{}", err.message);
        assert!(received.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn an_untrusted_certificate_stops_the_login() {
        let smtpd = Smtpd {
            login: Some(("agent", PASSWORD)),
            ..Smtpd::default()
        };
        let received = smtpd.received.clone();
        let port = start_smtpd(smtpd, Offer::StartTlsAndLogin);
        // The plain tool: only the platform's roots, which do not include the test CA.
        let tool = tool(&smtp_config(port, Some(("agent", PASSWORD))));
        let err = run(&tool, "c-smtp8", email_params("bob@x.org", "s", "b"))
            .await
            .unwrap_err();
        assert!(!err.retryable, "{err:?}");
        assert!(
            err.message.starts_with("TLS with the SMTP server"),
            "{}",
            err.message
        );
        assert_no_password(&err.message);
        assert!(received.lock().unwrap().is_empty());
    }
}
