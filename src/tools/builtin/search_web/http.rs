//! One HTTP exchange with a search provider, retried the way docs/design.md §8.4 asks: 429 (honouring
//! `Retry-After`), 5xx and failed connections are tried again with the shared backoff
//! ([`crate::tools::builtin::retry`]), never past the call's deadline; any other 4xx fails at once with the
//! provider's own message. Also turns bodies that are not what a provider documents into
//! readable errors instead of panics.

use crate::call::{CallError, ErrorCode};
use crate::tools::builtin::retry::{self, Backoff, Decision, Stop};
use reqwest::header::CONTENT_TYPE;
use reqwest::{RequestBuilder, StatusCode};
use serde::de::DeserializeOwned;
use std::time::{Duration, Instant};

/// 200 ms, 400 ms, 800 ms, … up to 5 s between attempts. Even with a long deadline, hammering
/// a failing provider more than six times helps no one.
const BACKOFF: Backoff = Backoff {
    base: Duration::from_millis(200),
    max: Duration::from_secs(5),
    max_attempts: 6,
    min_attempt_time: Duration::from_millis(250),
};
/// A request timing out this close to the deadline timed out because of it.
const DEADLINE_SLACK: Duration = Duration::from_millis(50);
/// Search answers are a few hundred KiB at most; anything bigger is not one.
const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;
/// How much of an error body is quoted in a message.
const ERROR_BODY_CHARS: usize = 300;
/// How much of an unreadable body is quoted in a message.
const GARBAGE_BODY_CHARS: usize = 200;

/// What the retry loop needs to know about a provider.
pub(super) struct Endpoint {
    /// The provider's name as written in the config, used in every message.
    pub provider: &'static str,
    /// Pulls the provider's own error message out of an error body, when it has a format.
    pub error_message: fn(&str) -> Option<String>,
    /// A hint for the person reading the error, by status ("check the api_key").
    pub hint: fn(StatusCode) -> Option<&'static str>,
}

/// A successful (2xx) answer, body read in full.
#[derive(Debug)]
pub(super) struct Reply {
    pub status: StatusCode,
    /// The `Content-Type` header, or `no content type`; only ever shown in messages.
    pub content_type: String,
    pub body: Vec<u8>,
    /// The body was longer than [`MAX_BODY_BYTES`] and was cut there.
    pub truncated: bool,
}

impl Reply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// "(text/html, 1234 bytes)"
    fn shape(&self) -> String {
        let more = if self.truncated { "more than " } else { "" };
        format!("({}, {more}{} bytes)", self.content_type, self.body.len())
    }

    /// EXECUTION_ERROR (not retryable) for an answer that is not the provider's format.
    pub fn unreadable(&self, provider: &str, what: &str) -> CallError {
        let shape = self.shape();
        let message = if self.body.iter().all(u8::is_ascii_whitespace) {
            format!("{provider} returned an empty body {shape} instead of {what}")
        } else {
            let quoted = excerpt(&self.text(), GARBAGE_BODY_CHARS);
            format!("{provider} returned something that is not {what} {shape}: {quoted}")
        };
        CallError::new(ErrorCode::ExecutionError, message).retryable(false)
    }

    /// EXECUTION_ERROR (not retryable) for JSON that lacks what the provider documents.
    pub fn wrong_shape(&self, provider: &str, why: &str) -> CallError {
        let quoted = excerpt(&self.text(), GARBAGE_BODY_CHARS);
        CallError::new(
            ErrorCode::ExecutionError,
            format!(
                "{provider} returned JSON without the shape of its JSON format ({why}) {}: {quoted}",
                self.shape()
            ),
        )
        .retryable(false)
    }

    /// Deserializes the body as the provider's documented JSON, or explains why it is not.
    pub fn json<T: DeserializeOwned>(&self, provider: &str) -> Result<T, CallError> {
        match serde_json::from_slice::<T>(&self.body) {
            Ok(value) => Ok(value),
            Err(e) if e.is_data() => Err(self.wrong_shape(provider, &e.to_string())),
            Err(_) => Err(self.unreadable(provider, "its JSON format")),
        }
    }
}

/// Why one attempt failed in a way worth retrying.
#[derive(Debug)]
enum Failure {
    Status {
        status: StatusCode,
        body: String,
        retry_after: Option<Duration>,
    },
    Transport(String),
}

impl Failure {
    /// "answered 500 Internal Server Error" / "could not be reached"
    fn headline(&self) -> String {
        match self {
            Failure::Status { status, .. } => format!("answered {}", status_text(*status)),
            Failure::Transport(_) => "could not be reached".to_string(),
        }
    }

    /// "body: …" / "error: …", or "with an empty body".
    fn detail(&self, last: bool) -> String {
        let label = if last { "last " } else { "" };
        match self {
            Failure::Status { body, .. } if body.is_empty() => "with an empty body".to_string(),
            Failure::Status { body, .. } => format!("; {label}body: {body}"),
            Failure::Transport(e) => format!("; {label}error: {e}"),
        }
    }
}

/// The failed attempts so far, enough to write one honest final message.
#[derive(Default)]
struct History {
    attempts: u32,
    /// How many of the attempts failed exactly like the last one.
    same_as_last: u32,
    last: Option<Failure>,
}

impl History {
    fn record(&mut self, failure: Failure) {
        self.attempts += 1;
        let same = match (&self.last, &failure) {
            (Some(Failure::Status { status: a, .. }), Failure::Status { status: b, .. }) => a == b,
            (Some(Failure::Transport(_)), Failure::Transport(_)) => true,
            _ => false,
        };
        self.same_as_last = if same { self.same_as_last + 1 } else { 1 };
        self.last = Some(failure);
    }

    /// "searxng answered 500 Internal Server Error 4 times; last body: …"
    fn describe(&self, provider: &str) -> String {
        let Some(last) = &self.last else {
            return format!("{provider} was not tried");
        };
        let headline = last.headline();
        let several = self.attempts > 1;
        let message = if self.same_as_last == self.attempts {
            let times = if several {
                format!(" {} times", self.attempts)
            } else {
                String::new()
            };
            format!("{provider} {headline}{times}")
        } else {
            format!(
                "{provider} failed {} attempts; the last {headline}",
                self.attempts
            )
        };
        let detail = last.detail(several);
        let separator = if detail.starts_with(';') { "" } else { " " };
        format!("{message}{separator}{detail}")
    }

    /// EXECUTION_ERROR, retryable: the provider kept failing and time ran out for retries.
    fn give_up(&self, provider: &str, why: Option<String>) -> CallError {
        let mut message = self.describe(provider);
        if let Some(why) = why {
            message.push_str(&format!(" ({why})"));
        }
        CallError::new(ErrorCode::ExecutionError, message).retryable(true)
    }

    /// TIMEOUT: the deadline passed while an attempt was still waiting for an answer.
    fn deadline_passed(&self, provider: &str) -> CallError {
        let mut message = format!("{provider} did not answer before the call's deadline");
        if self.last.is_some() {
            message.push_str(&format!("; before that, {}", self.describe(provider)));
        }
        CallError::new(ErrorCode::Timeout, message)
    }
}

/// Sends the request `build` makes (once per attempt) until it succeeds, fails for good, or
/// the next attempt could not start before `deadline`. Each attempt may use all the time
/// left until the deadline.
pub(super) async fn send(
    endpoint: &Endpoint,
    deadline: Instant,
    build: impl Fn() -> RequestBuilder,
) -> Result<Reply, CallError> {
    let provider = endpoint.provider;
    let mut history = History::default();
    loop {
        let Some(left) = deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
        else {
            return Err(history.deadline_passed(provider));
        };
        let attempt = exchange(build().timeout(left));
        let failure = match tokio::time::timeout(left, attempt).await {
            Err(_elapsed) => return Err(history.deadline_passed(provider)),
            Ok(Ok(reply)) if reply.status.is_success() => return Ok(reply.into()),
            Ok(Ok(reply)) if is_retryable_status(reply.status) => Failure::Status {
                status: reply.status,
                body: excerpt(&reply.text(), ERROR_BODY_CHARS),
                retry_after: reply.retry_after,
            },
            Ok(Ok(reply)) => return Err(rejected(endpoint, &reply)),
            Ok(Err(e)) if e.is_builder() => {
                return Err(CallError::new(
                    ErrorCode::ExecutionError,
                    format!(
                        "vaultd could not build the {provider} request: {}",
                        describe_reqwest_error(e)
                    ),
                )
                .retryable(false));
            }
            // The per-attempt timeout is the time left, so this is the deadline, not the
            // provider; a client-level connect timeout earlier on is retried below.
            Ok(Err(e)) if e.is_timeout() && Instant::now() + DEADLINE_SLACK >= deadline => {
                return Err(history.deadline_passed(provider));
            }
            Ok(Err(e)) => Failure::Transport(describe_reqwest_error(e)),
        };
        tracing::debug!(
            provider,
            attempt = history.attempts + 1,
            failure = %failure.headline(),
            "search attempt failed"
        );
        let retry_after = match &failure {
            Failure::Status { retry_after, .. } => *retry_after,
            Failure::Transport(_) => None,
        };
        history.record(failure);
        let delay =
            match BACKOFF.after_failure(history.attempts, retry_after, Instant::now(), deadline) {
                Decision::Wait(delay) => delay,
                Decision::Stop(Stop::Attempts) => return Err(history.give_up(provider, None)),
                Decision::Stop(Stop::Deadline { asked: Some(r) }) => {
                    let why = format!(
                        "Retry-After asked for {} s, past the call's deadline",
                        r.as_secs()
                    );
                    return Err(history.give_up(provider, Some(why)));
                }
                Decision::Stop(Stop::Deadline { asked: None }) => {
                    let why = "no time left to retry before the call's deadline".to_string();
                    return Err(history.give_up(provider, Some(why)));
                }
            };
        tokio::time::sleep(delay).await;
    }
}

/// What one attempt brings back: any status, with its body.
struct Exchange {
    status: StatusCode,
    content_type: String,
    body: Vec<u8>,
    truncated: bool,
    retry_after: Option<Duration>,
}

impl Exchange {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

impl From<Exchange> for Reply {
    fn from(e: Exchange) -> Reply {
        Reply {
            status: e.status,
            content_type: e.content_type,
            body: e.body,
            truncated: e.truncated,
        }
    }
}

/// One request and its whole body (up to [`MAX_BODY_BYTES`]), whatever the status.
async fn exchange(request: RequestBuilder) -> Result<Exchange, reqwest::Error> {
    let mut response = request.send().await?;
    let status = response.status();
    let content_type = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map_or_else(|| "no content type".to_string(), str::to_string);
    let retry_after = retry::retry_after(response.headers());
    let mut body = Vec::new();
    let mut truncated = false;
    while let Some(chunk) = response.chunk().await? {
        let room = MAX_BODY_BYTES - body.len();
        if chunk.len() > room {
            body.extend_from_slice(&chunk[..room]);
            truncated = true;
            break;
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Exchange {
        status,
        content_type,
        body,
        truncated,
        retry_after,
    })
}

fn is_retryable_status(status: StatusCode) -> bool {
    status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error()
}

/// EXECUTION_ERROR, not retryable: the provider refused this request (4xx other than 429).
fn rejected(endpoint: &Endpoint, reply: &Exchange) -> CallError {
    let text = reply.text();
    let said = (endpoint.error_message)(&text)
        .map(|m| excerpt(&m, ERROR_BODY_CHARS))
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| excerpt(&text, ERROR_BODY_CHARS));
    let mut message = format!(
        "{} answered {}",
        endpoint.provider,
        status_text(reply.status)
    );
    if said.is_empty() {
        message.push_str(" with an empty body");
    } else {
        message.push_str(&format!(": {said}"));
    }
    if let Some(hint) = (endpoint.hint)(reply.status) {
        message.push_str(&format!(" ({hint})"));
    }
    CallError::new(ErrorCode::ExecutionError, message).retryable(false)
}

/// "500 Internal Server Error", or just "432" for codes without a standard reason.
fn status_text(status: StatusCode) -> String {
    match status.canonical_reason() {
        Some(reason) => format!("{} {reason}", status.as_u16()),
        None => status.as_u16().to_string(),
    }
}

/// A reqwest error with its causes ("error sending request: client error (Connect): tcp
/// connect error: Connection refused"), without the URL.
pub(super) fn describe_reqwest_error(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut message = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

/// The first `max` characters of `text` with runs of whitespace collapsed to one space,
/// and "…" when cut.
pub(super) fn excerpt(text: &str, max: usize) -> String {
    let collapsed = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match collapsed.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &collapsed[..cut]),
        None => collapsed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, body: &str) -> Failure {
        Failure::Status {
            status: StatusCode::from_u16(code).expect("valid status"),
            body: body.to_string(),
            retry_after: None,
        }
    }

    #[test]
    fn describes_what_happened_across_attempts() {
        let mut history = History::default();
        history.record(status(503, ""));
        assert_eq!(
            history.describe("brave"),
            "brave answered 503 Service Unavailable with an empty body"
        );
        history.record(Failure::Transport("connection reset".into()));
        history.record(status(500, "oops"));
        assert_eq!(
            history.describe("brave"),
            "brave failed 3 attempts; the last answered 500 Internal Server Error; last body: oops"
        );
        let mut history = History::default();
        history.record(Failure::Transport("refused".into()));
        history.record(Failure::Transport("refused".into()));
        assert_eq!(
            history.describe("tavily"),
            "tavily could not be reached 2 times; last error: refused"
        );
    }

    #[test]
    fn excerpts_collapse_whitespace_and_mark_the_cut() {
        assert_eq!(excerpt("  a \n\t b  ", 10), "a b");
        assert_eq!(excerpt("abcdef", 3), "abc…");
        assert_eq!(excerpt("ééééé", 2), "éé…");
    }

    #[test]
    fn unknown_statuses_are_shown_by_number() {
        assert_eq!(status_text(StatusCode::from_u16(432).unwrap()), "432");
        assert_eq!(status_text(StatusCode::BAD_GATEWAY), "502 Bad Gateway");
    }
}
