//! Email through lettre: the `.eml` outbox (the default: a fresh install sends nothing) or
//! SMTP with implicit TLS or STARTTLS. Every message carries `Message-ID: <call_id@host>` so
//! a duplicate can always be told apart (DESIGN §4, §8.10).

use crate::call::{CallError, ErrorCode};
use crate::config::{EmailConfig, EmailTransport, StartTls};
use crate::tools::{RegistryError, ToolCall};
use lettre::message::Mailbox;
use lettre::message::header::ContentType;
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Tls, TlsParameters};
use lettre::transport::smtp::{AsyncSmtpTransport, AsyncSmtpTransportBuilder};
use lettre::{Address, AsyncFileTransport, AsyncTransport, Message, Tokio1Executor};
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
        transport: AsyncFileTransport<Tokio1Executor>,
    },
    Smtp(Smtp),
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
/// unencrypted connection except to a loopback address (DESIGN §8.12): with credentials and a
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
        ("smtp", StartTls::Opportunistic) if has_credentials && !is_loopback(&host) => {
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

/// 127.0.0.0/8, ::1 and `localhost`.
fn is_loopback(host: &str) -> bool {
    match host.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => host.eq_ignore_ascii_case("localhost"),
    }
}

impl Email {
    pub(super) fn new(config: &EmailConfig, timeout: Duration) -> Result<Email, RegistryError> {
        let setup = |key: &str, message: String| RegistryError::Setup {
            tool: TOOL.to_string(),
            message: format!("tools.send_notification.email.{key}: {message}"),
        };
        let from: Mailbox = config
            .from
            .parse()
            .map_err(|e| setup("from", format!("`{}` is not a mailbox: {e}", config.from)))?;
        let transport = match &config.transport {
            EmailTransport::File { outbox } => Transport::File {
                outbox: outbox.clone(),
                transport: AsyncFileTransport::<Tokio1Executor>::new(outbox),
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
                    TlsParameters::new(plan.host.clone())
                        .map_err(|e| setup("smtp_url", format!("TLS setup failed: {e}")))
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
                Transport::Smtp(Smtp {
                    server: format!("{}:{}", plan.host, plan.port),
                    builder,
                    transport: OnceLock::new(),
                })
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
            Transport::File { outbox, transport } => {
                tokio::fs::create_dir_all(outbox).await.map_err(|e| {
                    CallError::new(
                        ErrorCode::ExecutionError,
                        format!("cannot create the outbox {}: {e}", outbox.display()),
                    )
                })?;
                let id = transport.send(message).await.map_err(|e| {
                    CallError::new(
                        ErrorCode::ExecutionError,
                        format!(
                            "cannot write the email into the outbox {}: {}",
                            outbox.display(),
                            super::error_chain(&e)
                        ),
                    )
                })?;
                tracing::info!(call_id = call.call_id, file = %outbox.join(format!("{id}.eml")).display(), "email written to the outbox");
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
/// and 4xx (transient) replies, not for 5xx (permanent) ones (DESIGN §8.4).
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
        let retry = if e.is_transient() {
            " (temporary; try again later)"
        } else {
            ""
        };
        return CallError::new(ErrorCode::ExecutionError, format!("{what}: {reply}{retry}"))
            .retryable(e.is_transient());
    }
    let chain = super::error_chain(e);
    if e.is_timeout() {
        return CallError::new(
            ErrorCode::ExecutionError,
            format!("SMTP server {server} did not answer in time: {chain}"),
        )
        .retryable(true);
    }
    if e.is_tls() {
        return CallError::new(
            ErrorCode::ExecutionError,
            format!("TLS with the SMTP server {server} failed: {chain}"),
        );
    }
    if e.is_client() || e.is_response() {
        // Our side refused to go on (e.g. STARTTLS required but not offered, no common AUTH
        // mechanism) or the server spoke nonsense: trying again changes nothing.
        return CallError::new(
            ErrorCode::ExecutionError,
            format!("SMTP with {server} failed: {chain}"),
        );
    }
    CallError::new(
        ErrorCode::ExecutionError,
        format!("could not reach the SMTP server {server}: {chain}"),
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
}
