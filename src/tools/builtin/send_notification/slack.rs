//! Slack incoming webhooks: `POST {"text": …}`, success is 200 with the body `ok`; errors are
//! plain strings (`invalid_payload`, `no_service`, …). The webhook returns no message id, so
//! the call id stands in for one (docs/design.md §8.10).

use super::{WEBHOOK_BACKOFF, Webhook, request_error, status_error, time_left};
use crate::call::CallError;
use crate::tools::ToolCall;
use crate::tools::builtin::retry::{self, Decision};
use reqwest::StatusCode;
use serde_json::json;
use std::time::Instant;

/// Posts one message and returns its message_id (the call id).
pub(super) async fn post(
    http: &reqwest::Client,
    hook: &Webhook,
    subject: &str,
    body: &str,
    call: &ToolCall<'_>,
) -> Result<String, CallError> {
    let payload = payload(subject, body);
    let mut attempt = 1;
    loop {
        let left = time_left(hook, call.deadline)?;
        let response = http
            .post(hook.url.clone())
            .timeout(left)
            .json(&payload)
            .send()
            .await
            .map_err(|e| request_error(hook, e))?;
        let status = response.status();
        let headers = response.headers().clone();
        let answer = response.text().await.unwrap_or_default();
        if status.is_success() {
            if answer.trim() != "ok" {
                tracing::warn!(
                    call_id = call.call_id,
                    webhook = hook.name,
                    "Slack answered {status} with an unexpected body; counting it as posted"
                );
            }
            return Ok(call.call_id.to_string());
        }
        // A 429 means nothing was posted: waiting and posting again cannot duplicate.
        if status == StatusCode::TOO_MANY_REQUESTS
            && let Some(wait) = retry::retry_after(&headers)
            && let Decision::Wait(delay) =
                WEBHOOK_BACKOFF.after_failure(attempt, Some(wait), Instant::now(), call.deadline)
        {
            tokio::time::sleep(delay).await;
            attempt += 1;
            continue;
        }
        return Err(status_error(hook, status, &answer));
    }
}

/// The JSON body of the POST (also what a dry run shows).
pub(super) fn payload(subject: &str, body: &str) -> serde_json::Value {
    json!({ "text": text(subject, body) })
}

/// `*subject*` in bold, then the body. `&`, `<` and `>` are escaped as Slack asks, so note
/// text cannot turn into `<!channel>` mentions or disguised links.
fn text(subject: &str, body: &str) -> String {
    format!("*{}*\n{}", escape(subject), escape(body))
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::super::tests_support::*;
    use super::*;
    use wiremock::matchers::{body_json, method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    const TOKEN_PATH: &str = "/services/T000/B000/XXXXSECRETTOKEN";

    async fn slack_tool(
        server_uri: &str,
    ) -> crate::tools::builtin::send_notification::SendNotification {
        let mut config = base_config();
        config
            .slack
            .insert("ops".into(), secret(&format!("{server_uri}{TOKEN_PATH}")));
        tool(&config)
    }

    #[test]
    fn text_is_bold_subject_then_escaped_body() {
        assert_eq!(text("Deploy", "done"), "*Deploy*\ndone");
        assert_eq!(
            text("a & b", "<!channel> <https://x|y>"),
            "*a &amp; b*\n&lt;!channel&gt; &lt;https://x|y&gt;"
        );
    }

    #[tokio::test]
    async fn posts_once_and_returns_the_call_id() {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path(TOKEN_PATH))
            .and(body_json(json!({ "text": "*Deploy*\nall green" })))
            .respond_with(ResponseTemplate::new(200).set_body_string("ok"))
            .expect(1)
            .mount(&server)
            .await;
        let tool = slack_tool(&server.uri()).await;
        let out = run(
            &tool,
            "c-slack1",
            slack_params("ops", "Deploy", "all green"),
        )
        .await
        .unwrap();
        assert_eq!(
            out.data,
            json!({ "success": true, "message_id": "c-slack1" })
        );
        assert_eq!(out.summary, "slack ops");
        server.verify().await;
    }

    #[tokio::test]
    async fn a_500_is_retryable_and_never_shows_the_url() {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(ResponseTemplate::new(500).set_body_string("rollup_error"))
            .expect(1)
            .mount(&server)
            .await;
        let tool = slack_tool(&server.uri()).await;
        let err = run(&tool, "c-slack2", slack_params("ops", "s", "b"))
            .await
            .unwrap_err();
        assert_eq!(err.code, crate::call::ErrorCode::ExecutionError);
        assert!(err.retryable);
        assert_eq!(
            err.message,
            "Slack webhook `ops` answered 500: rollup_error"
        );
        assert_no_url(&err.message, &server.uri(), TOKEN_PATH);
    }

    #[tokio::test]
    async fn a_404_is_permanent() {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(ResponseTemplate::new(404).set_body_string("no_service"))
            .expect(1)
            .mount(&server)
            .await;
        let tool = slack_tool(&server.uri()).await;
        let err = run(&tool, "c-slack3", slack_params("ops", "s", "b"))
            .await
            .unwrap_err();
        assert!(!err.retryable);
        assert_eq!(err.message, "Slack webhook `ops` answered 404: no_service");
    }

    #[tokio::test]
    async fn a_429_with_retry_after_is_waited_out() {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(
                ResponseTemplate::new(429)
                    .insert_header("Retry-After", "0")
                    .set_body_string("rate_limited"),
            )
            .up_to_n_times(1)
            .expect(1)
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .respond_with(ResponseTemplate::new(200).set_body_string("ok"))
            .expect(1)
            .mount(&server)
            .await;
        let tool = slack_tool(&server.uri()).await;
        run(&tool, "c-slack4", slack_params("ops", "s", "b"))
            .await
            .unwrap();
        server.verify().await;
    }

    #[tokio::test]
    async fn a_429_whose_wait_passes_the_deadline_is_not_retried() {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(
                ResponseTemplate::new(429)
                    .insert_header("Retry-After", "3600")
                    .set_body_string("rate_limited"),
            )
            .expect(1)
            .mount(&server)
            .await;
        let tool = slack_tool(&server.uri()).await;
        let err = run(&tool, "c-slack5", slack_params("ops", "s", "b"))
            .await
            .unwrap_err();
        assert!(err.retryable);
        assert_eq!(
            err.message,
            "Slack webhook `ops` answered 429: rate_limited"
        );
        server.verify().await;
    }

    #[tokio::test]
    async fn a_closed_port_is_retryable_and_never_shows_the_url() {
        let uri = closed_port_uri();
        let tool = slack_tool(&uri).await;
        let err = run(&tool, "c-slack6", slack_params("ops", "s", "b"))
            .await
            .unwrap_err();
        assert_eq!(err.code, crate::call::ErrorCode::ExecutionError);
        assert!(err.retryable, "{err:?}");
        assert!(
            err.message
                .starts_with("Slack webhook `ops` could not be reached"),
            "{}",
            err.message
        );
        assert_no_url(&err.message, &uri, TOKEN_PATH);
    }

    #[tokio::test]
    async fn no_answer_before_the_deadline_is_a_timeout() {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_string("ok")
                    .set_delay(std::time::Duration::from_secs(5)),
            )
            .mount(&server)
            .await;
        let tool = slack_tool(&server.uri()).await;
        let parameters = slack_params("ops", "s", "b");
        let err = crate::tools::Tool::run(
            &tool,
            ToolCall {
                note: "Needs_Action/test.md",
                note_id: "n-000000000001",
                call_id: "c-slack7",
                parameters: &parameters,
                deadline: std::time::Instant::now() + std::time::Duration::from_millis(300),
                answer: None,
            },
        )
        .await
        .unwrap_err();
        assert_eq!(err.code, crate::call::ErrorCode::Timeout);
        assert!(err.retryable);
        assert_no_url(&err.message, &server.uri(), TOKEN_PATH);
    }
}
