//! The Brave Search API (`GET {base}/res/v1/web/search?q=…&count=N&text_decorations=false`
//! with `X-Subscription-Token`), mapped from `web.results[].{title,url,description}`.

use super::http::{self, Endpoint};
use super::{SearchHit, SearchRequest, collapse_whitespace, decode_entities};
use crate::call::{CallError, ErrorCode};
use reqwest::StatusCode;
use reqwest::header::{ACCEPT, HeaderValue};
use serde::Deserialize;
use serde_json::Value;

pub(super) const DEFAULT_BASE_URL: &str = "https://api.search.brave.com";

const ENDPOINT: Endpoint = Endpoint {
    provider: "brave",
    error_message,
    hint,
};

#[derive(Debug, Deserialize)]
struct Response {
    /// Absent when Brave found no web results.
    #[serde(default)]
    web: Option<Web>,
    /// Always present in a search answer; tells an empty answer from some other JSON.
    #[serde(default)]
    query: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct Web {
    #[serde(default)]
    results: Vec<WebResult>,
}

#[derive(Debug, Deserialize)]
struct WebResult {
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    description: Option<String>,
}

pub(super) async fn search(
    request: &SearchRequest<'_>,
    api_key: &str,
) -> Result<Vec<SearchHit>, CallError> {
    let mut token = HeaderValue::from_str(api_key).map_err(|_| {
        CallError::new(
            ErrorCode::NotConfigured,
            "tools.search_web.api_key contains characters an HTTP header cannot carry",
        )
    })?;
    token.set_sensitive(true);
    let url = request.url("/res/v1/web/search");
    let count = request.num_results.to_string();
    let reply = http::send(&ENDPOINT, request.deadline, || {
        request
            .http
            .get(&url)
            .query(&[
                ("q", request.query),
                ("count", count.as_str()),
                ("text_decorations", "false"),
            ])
            .header("X-Subscription-Token", token.clone())
            .header(ACCEPT, "application/json")
    })
    .await?;
    let response: Response = reply.json(ENDPOINT.provider)?;
    let Some(web) = response.web else {
        return match response.query {
            Some(_) => Ok(Vec::new()),
            None => Err(reply.wrong_shape(ENDPOINT.provider, "neither `web` nor `query`")),
        };
    };
    Ok(web
        .results
        .into_iter()
        .filter_map(|r| {
            let url = r.url.filter(|u| !u.trim().is_empty())?;
            let title = r.title.map(|t| plain(&t)).filter(|t| !t.is_empty());
            Some(SearchHit {
                title: title.unwrap_or_else(|| url.clone()),
                snippet: r.description.map(|d| plain(&d)).unwrap_or_default(),
                url,
            })
        })
        .collect())
}

/// Brave's text without the `<strong>` highlighting it may still add, entities decoded.
fn plain(text: &str) -> String {
    let unmarked = text.replace("<strong>", "").replace("</strong>", "");
    collapse_whitespace(&decode_entities(&unmarked))
}

/// `{"type":"ErrorResponse","error":{"code":"…","detail":"…","meta":{"errors":[{"loc":[…],"msg":"…"}]}}}`
/// -> "VALIDATION: Unable to validate request parameter(s) (query.count: …)".
fn error_message(body: &str) -> Option<String> {
    let value: Value = serde_json::from_str(body).ok()?;
    let error = value.get("error")?;
    let detail = error.get("detail").and_then(Value::as_str);
    let code = error.get("code").and_then(Value::as_str);
    let mut message = match (code, detail) {
        (Some(code), Some(detail)) => format!("{code}: {detail}"),
        (Some(one), None) | (None, Some(one)) => one.to_string(),
        (None, None) => return None,
    };
    let problems: Vec<String> = error
        .pointer("/meta/errors")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let msg = e.get("msg").and_then(Value::as_str)?;
            let loc: Vec<String> = e
                .get("loc")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|l| l.as_str().map_or_else(|| l.to_string(), str::to_string))
                .collect();
            Some(if loc.is_empty() {
                msg.to_string()
            } else {
                format!("{}: {msg}", loc.join("."))
            })
        })
        .collect();
    if !problems.is_empty() {
        message.push_str(&format!(" ({})", problems.join("; ")));
    }
    Some(message)
}

fn hint(status: StatusCode) -> Option<&'static str> {
    matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN)
        .then_some("check tools.search_web.api_key")
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use crate::call::ErrorCode;
    use crate::tools::builtin::search_web::SearchProvider;
    use serde_json::json;
    use wiremock::matchers::{header, method, path, query_param};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    fn answer() -> serde_json::Value {
        json!({
            "type": "search",
            "query": { "original": "rust async", "more_results_available": true },
            "mixed": { "type": "mixed", "main": [] },
            "web": {
                "type": "search",
                "family_friendly": true,
                "results": [
                    {
                        "type": "search_result",
                        "title": "Async in <strong>Rust</strong> &amp; Tokio",
                        "url": "https://tokio.rs/tokio/tutorial",
                        "description": "Tokio is an &quot;asynchronous&quot; runtime for the <strong>Rust</strong> language &lt;3 it&#39;s fast",
                        "age": "March 1, 2026",
                        "page_age": "2026-03-01T00:00:00",
                        "language": "en",
                        "profile": { "name": "Tokio", "url": "https://tokio.rs", "long_name": "tokio.rs" },
                        "extra_snippets": ["more text"]
                    },
                    {
                        "title": "The async book",
                        "url": "https://rust-lang.github.io/async-book/",
                        "description": "Asynchronous Programming in Rust"
                    },
                    {
                        "title": "Third",
                        "url": "https://example.org/3",
                        "description": "three"
                    }
                ]
            },
            "news": { "type": "news", "results": [] },
            "videos": { "type": "videos", "results": [] }
        })
    }

    #[tokio::test]
    async fn sends_the_documented_request_and_maps_results() {
        let server = MockServer::start().await;
        Mock::given(method("GET"))
            .and(path("/res/v1/web/search"))
            .and(query_param("q", "rust async"))
            .and(query_param("count", "2"))
            .and(query_param("text_decorations", "false"))
            .and(header("x-subscription-token", KEY))
            .and(header("accept", "application/json"))
            .respond_with(ResponseTemplate::new(200).set_body_json(answer()))
            .expect(1)
            .mount(&server)
            .await;
        let tool = tool(SearchProvider::Brave, Some(&server.uri()), Some(KEY));
        let out = run_search(&tool, "rust async", 2).await.unwrap();
        assert_eq!(
            hits(&out),
            vec![
                (
                    "Async in Rust & Tokio".into(),
                    "https://tokio.rs/tokio/tutorial".into(),
                    "Tokio is an \"asynchronous\" runtime for the Rust language <3 it's fast"
                        .into()
                ),
                (
                    "The async book".into(),
                    "https://rust-lang.github.io/async-book/".into(),
                    "Asynchronous Programming in Rust".into()
                ),
            ]
        );
        assert_eq!(out.summary, "2 results");
    }

    #[tokio::test]
    async fn no_web_section_is_an_empty_answer() {
        let server = MockServer::start().await;
        Mock::given(path("/res/v1/web/search"))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({
                "type": "search", "query": {"original": "zzqx"}, "mixed": {}
            })))
            .mount(&server)
            .await;
        let tool = tool(SearchProvider::Brave, Some(&server.uri()), Some(KEY));
        let out = run_search(&tool, "zzqx", 5).await.unwrap();
        assert_eq!(out.data, json!({"results": []}));
    }

    #[tokio::test]
    async fn json_that_is_not_a_search_answer_is_an_error() {
        let server = MockServer::start().await;
        Mock::given(path("/res/v1/web/search"))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({"hello": "world"})))
            .mount(&server)
            .await;
        let tool = tool(SearchProvider::Brave, Some(&server.uri()), Some(KEY));
        let e = run_search(&tool, "rust", 5).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::ExecutionError);
        assert!(!e.retryable);
        assert!(
            e.message.contains("neither `web` nor `query`"),
            "{}",
            e.message
        );
    }

    #[tokio::test]
    async fn a_422_fails_at_once_with_braves_message() {
        let server = MockServer::start().await;
        let body = json!({
            "type": "ErrorResponse",
            "error": {
                "id": "3b1e6f0a-0000-4000-8000-000000000000",
                "status": 422,
                "code": "VALIDATION",
                "detail": "Unable to validate request parameter(s)",
                "meta": { "errors": [ {
                    "type": "less_than_equal",
                    "loc": ["query", "count"],
                    "msg": "Input should be less than or equal to 20",
                    "input": "50",
                    "ctx": {"le": 20}
                } ] }
            },
            "time": 1_767_225_600
        });
        Mock::given(path("/res/v1/web/search"))
            .respond_with(ResponseTemplate::new(422).set_body_json(body))
            .mount(&server)
            .await;
        let tool = tool(SearchProvider::Brave, Some(&server.uri()), Some(KEY));
        let e = run_search(&tool, "rust", 5).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::ExecutionError);
        assert!(!e.retryable);
        assert_eq!(
            e.message,
            "brave answered 422 Unprocessable Entity: VALIDATION: Unable to validate request \
             parameter(s) (query.count: Input should be less than or equal to 20)"
        );
        assert_eq!(server.received_requests().await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_bad_token_says_so_and_never_shows_the_key() {
        let server = MockServer::start().await;
        let body = json!({
            "type": "ErrorResponse",
            "error": {"id": "x", "status": 401, "code": "SUBSCRIPTION_TOKEN_INVALID",
                      "detail": format!("The provided subscription token {KEY} is invalid."), "meta": {}}
        });
        Mock::given(path("/res/v1/web/search"))
            .respond_with(ResponseTemplate::new(401).set_body_json(body))
            .mount(&server)
            .await;
        let tool = tool(SearchProvider::Brave, Some(&server.uri()), Some(KEY));
        let e = run_search(&tool, "rust", 5).await.unwrap_err();
        assert!(!e.retryable);
        assert!(!e.message.contains(KEY), "{}", e.message);
        assert_eq!(
            e.message,
            "brave answered 401 Unauthorized: SUBSCRIPTION_TOKEN_INVALID: The provided \
             subscription token [redacted] is invalid. (check tools.search_web.api_key)"
        );
    }

    #[tokio::test]
    async fn retries_a_429_once_then_succeeds() {
        let server = MockServer::start().await;
        Mock::given(path("/res/v1/web/search"))
            .respond_with(
                ResponseTemplate::new(429)
                    .insert_header("Retry-After", "0")
                    .insert_header("X-RateLimit-Limit", "1, 15000")
                    .insert_header("X-RateLimit-Remaining", "0, 1000")
                    .insert_header("X-RateLimit-Reset", "1, 1419704")
                    .set_body_json(json!({"type": "ErrorResponse", "error": {
                        "code": "RATE_LIMITED", "detail": "Request rate limit exceeded for plan.", "status": 429}})),
            )
            .up_to_n_times(1)
            .mount(&server)
            .await;
        Mock::given(path("/res/v1/web/search"))
            .respond_with(ResponseTemplate::new(200).set_body_json(answer()))
            .mount(&server)
            .await;
        let tool = tool(SearchProvider::Brave, Some(&server.uri()), Some(KEY));
        let out = run_search(&tool, "rust", 5).await.unwrap();
        assert_eq!(hits(&out).len(), 3);
        assert_eq!(server.received_requests().await.unwrap().len(), 2);
    }

    #[tokio::test]
    async fn a_truncated_answer_is_a_readable_error() {
        let server = MockServer::start().await;
        Mock::given(path("/res/v1/web/search"))
            .respond_with(ResponseTemplate::new(200).set_body_raw(
                br#"{"type":"search","web":{"results":[{"ti"#.to_vec(),
                "application/json",
            ))
            .mount(&server)
            .await;
        let tool = tool(SearchProvider::Brave, Some(&server.uri()), Some(KEY));
        let e = run_search(&tool, "rust", 5).await.unwrap_err();
        assert!(!e.retryable);
        assert!(
            e.message.starts_with(
                "brave returned something that is not its JSON format (application/json, 39 bytes)"
            ),
            "{}",
            e.message
        );
    }

    #[test]
    fn error_message_without_brave_format_is_none() {
        assert_eq!(super::error_message("<html>nope</html>"), None);
        assert_eq!(super::error_message(r#"{"error": {}}"#), None);
        assert_eq!(
            super::error_message(r#"{"error": {"detail": "Bad things"}}"#).as_deref(),
            Some("Bad things")
        );
    }
}
