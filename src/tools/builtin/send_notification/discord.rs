//! Discord webhooks: `POST …?wait=true` so Discord answers 200 with the Message object, whose
//! `id` is the message_id (docs/design.md §8.10). Mentions are switched off: note text must not be
//! able to ping @everyone.

use super::{WEBHOOK_BACKOFF, Webhook, request_error, status_error, time_left, truncate_chars};
use crate::call::CallError;
use crate::tools::ToolCall;
use crate::tools::builtin::retry::{self, Decision};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::time::Instant;

/// Discord refuses `content` longer than this many characters.
const MAX_CONTENT_CHARS: usize = 2000;

/// Posts one message and returns Discord's message id.
pub(super) async fn post(
    http: &reqwest::Client,
    hook: &Webhook,
    subject: &str,
    body: &str,
    call: &ToolCall<'_>,
) -> Result<String, CallError> {
    let url = with_wait(&hook.url);
    let payload = payload(subject, body);
    let mut attempt = 1;
    loop {
        let left = time_left(hook, call.deadline)?;
        let response = http
            .post(url.clone())
            .timeout(left)
            .json(&payload)
            .send()
            .await
            .map_err(|e| request_error(hook, e))?;
        let status = response.status();
        let headers = response.headers().clone();
        let answer = response.text().await.unwrap_or_default();
        let json: Option<Value> = serde_json::from_str(&answer).ok();
        if status.is_success() {
            return Ok(message_id(hook, json.as_ref(), call));
        }
        // A 429 means nothing was posted: waiting and posting again cannot duplicate.
        if status == StatusCode::TOO_MANY_REQUESTS {
            let wait = json
                .as_ref()
                .and_then(|j| j.get("retry_after"))
                .and_then(Value::as_f64)
                .and_then(retry::seconds)
                .or_else(|| retry::retry_after(&headers));
            if let Some(wait) = wait
                && let Decision::Wait(delay) = WEBHOOK_BACKOFF.after_failure(
                    attempt,
                    Some(wait),
                    Instant::now(),
                    call.deadline,
                )
            {
                tokio::time::sleep(delay).await;
                attempt += 1;
                continue;
            }
        }
        // Discord's errors are JSON: `{"message": "Unknown Webhook", "code": 10015}`.
        let detail = match json
            .as_ref()
            .and_then(|j| j.get("message"))
            .and_then(Value::as_str)
        {
            Some(m) => match json
                .as_ref()
                .and_then(|j| j.get("code"))
                .and_then(Value::as_i64)
            {
                Some(code) if code != 0 => format!("{m} (code {code})"),
                _ => m.to_string(),
            },
            None => answer,
        };
        return Err(status_error(hook, status, &detail));
    }
}

/// The JSON body of the POST (also what a dry run shows). Mentions are off.
pub(super) fn payload(subject: &str, body: &str) -> Value {
    json!({
        "content": content(subject, body),
        "allowed_mentions": { "parse": [] },
    })
}

/// The webhook URL with `wait=true`, keeping any other query (`thread_id`, …).
fn with_wait(url: &reqwest::Url) -> reqwest::Url {
    let mut url = url.clone();
    let kept: Vec<(String, String)> = url
        .query_pairs()
        .filter(|(k, _)| k != "wait")
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    url.query_pairs_mut()
        .clear()
        .extend_pairs(kept)
        .append_pair("wait", "true");
    url
}

/// `**subject**` in bold, then the body, cut to Discord's 2000 characters.
fn content(subject: &str, body: &str) -> String {
    let text = format!("**{subject}**\n{body}");
    if text.chars().count() <= MAX_CONTENT_CHARS {
        text
    } else {
        // The ellipsis says it was cut, and keeps the total at the limit.
        truncate_chars(&text, MAX_CONTENT_CHARS - 1)
    }
}

fn message_id(hook: &Webhook, json: Option<&Value>, call: &ToolCall<'_>) -> String {
    let id = json.and_then(|j| j.get("id"));
    match id {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => {
            // Posted (2xx) but without the Message object `wait=true` promises: the send
            // happened, so it must not fail, but say why the id is ours.
            tracing::warn!(
                call_id = call.call_id,
                webhook = hook.name,
                "Discord answered without a message id; using the call id"
            );
            call.call_id.to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests_support::*;
    use super::*;
    use crate::call::ErrorCode;
    use wiremock::matchers::{body_json, method, path, query_param};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    const TOKEN_PATH: &str = "/api/webhooks/123456/XXXXSECRETTOKEN";

    fn discord_tool(hook_url: &str) -> crate::tools::builtin::send_notification::SendNotification {
        let mut config = base_config();
        config.discord.insert("alerts".into(), secret(hook_url));
        tool(&config)
    }

    fn message(id: &str) -> Value {
        json!({ "id": id, "channel_id": "42", "content": "…", "webhook_id": "123456" })
    }

    #[test]
    fn wait_is_added_and_other_query_kept() {
        let u = reqwest::Url::parse("https://discord.com/api/webhooks/1/t").unwrap();
        assert_eq!(with_wait(&u).query(), Some("wait=true"));
        let u = reqwest::Url::parse("https://discord.com/api/webhooks/1/t?thread_id=9&wait=false")
            .unwrap();
        assert_eq!(with_wait(&u).query(), Some("thread_id=9&wait=true"));
    }

    #[test]
    fn content_is_cut_to_2000_chars() {
        assert_eq!(content("Hi", "there"), "**Hi**\nthere");
        let long = content("S", &"é".repeat(5000));
        assert_eq!(long.chars().count(), 2000);
        assert!(long.ends_with('…'));
    }

    #[tokio::test]
    async fn posts_with_wait_and_returns_discords_id() {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path(TOKEN_PATH))
            .and(query_param("wait", "true"))
            .and(query_param("thread_id", "7"))
            .and(body_json(json!({
                "content": "**Disk full**\n/var at 99%",
                "allowed_mentions": { "parse": [] }
            })))
            .respond_with(ResponseTemplate::new(200).set_body_json(message("1122334455667788")))
            .expect(1)
            .mount(&server)
            .await;
        let tool = discord_tool(&format!("{}{TOKEN_PATH}?thread_id=7", server.uri()));
        let out = run(
            &tool,
            "c-disc1",
            discord_params("alerts", "Disk full", "/var at 99%"),
        )
        .await
        .unwrap();
        assert_eq!(
            out.data,
            json!({ "success": true, "message_id": "1122334455667788" })
        );
        assert_eq!(out.summary, "discord alerts");
        server.verify().await;
    }

    #[tokio::test]
    async fn a_429_is_waited_out_then_posted() {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(ResponseTemplate::new(429).set_body_json(json!({
                "message": "You are being rate limited.", "retry_after": 0.2, "global": false
            })))
            .up_to_n_times(1)
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .respond_with(ResponseTemplate::new(200).set_body_json(message("99")))
            .mount(&server)
            .await;
        let tool = discord_tool(&format!("{}{TOKEN_PATH}", server.uri()));
        let started = std::time::Instant::now();
        let out = run(&tool, "c-disc2", discord_params("alerts", "s", "b"))
            .await
            .unwrap();
        assert!(started.elapsed() >= std::time::Duration::from_millis(200));
        assert_eq!(out.data["message_id"], "99");
        let requests = server.received_requests().await.unwrap();
        assert_eq!(requests.len(), 2);
    }

    #[tokio::test]
    async fn a_404_is_asked_once_and_not_retryable() {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(
                ResponseTemplate::new(404)
                    .set_body_json(json!({ "message": "Unknown Webhook", "code": 10015 })),
            )
            .mount(&server)
            .await;
        let tool = discord_tool(&format!("{}{TOKEN_PATH}", server.uri()));
        let err = run(&tool, "c-disc3", discord_params("alerts", "s", "b"))
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::ExecutionError);
        assert!(!err.retryable);
        assert_eq!(
            err.message,
            "Discord webhook `alerts` answered 404: Unknown Webhook (code 10015)"
        );
        assert_no_url(&err.message, &server.uri(), TOKEN_PATH);
        assert_eq!(server.received_requests().await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_closed_port_is_retryable_and_never_shows_the_url() {
        let uri = closed_port_uri();
        let tool = discord_tool(&format!("{uri}{TOKEN_PATH}"));
        let err = run(&tool, "c-disc4", discord_params("alerts", "s", "b"))
            .await
            .unwrap_err();
        assert!(err.retryable);
        assert_no_url(&err.message, &uri, TOKEN_PATH);
    }
}
