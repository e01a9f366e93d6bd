//! The Tavily search API (`POST {base}/search` with a Bearer key), mapped from
//! `results[].{title,url,content}`.

use super::http::{self, Endpoint};
use super::{SearchHit, SearchRequest};
use crate::call::{CallError, ErrorCode};
use reqwest::StatusCode;
use reqwest::header::{ACCEPT, AUTHORIZATION, HeaderValue};
use serde::Deserialize;
use serde_json::{Value, json};

pub(super) const DEFAULT_BASE_URL: &str = "https://api.tavily.com";

const ENDPOINT: Endpoint = Endpoint {
    provider: "tavily",
    error_message,
    hint,
};

/// Only `results` matters; `response_time` is a number or a string depending on the
/// docs page, so it is not read at all.
#[derive(Debug, Deserialize)]
struct Response {
    results: Vec<TavilyResult>,
}

#[derive(Debug, Deserialize)]
struct TavilyResult {
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    content: Option<String>,
}

pub(super) async fn search(
    request: &SearchRequest<'_>,
    api_key: &str,
) -> Result<Vec<SearchHit>, CallError> {
    let mut bearer = HeaderValue::from_str(&format!("Bearer {api_key}")).map_err(|_| {
        CallError::new(
            ErrorCode::NotConfigured,
            "tools.search_web.api_key contains characters an HTTP header cannot carry",
        )
    })?;
    bearer.set_sensitive(true);
    let url = request.url("/search");
    let body = json!({
        "query": request.query,
        "max_results": request.num_results,
        "search_depth": "basic",
    });
    let reply = http::send(&ENDPOINT, request.deadline, || {
        request
            .http
            .post(&url)
            .header(AUTHORIZATION, bearer.clone())
            .header(ACCEPT, "application/json")
            .json(&body)
    })
    .await?;
    let response: Response = reply.json(ENDPOINT.provider)?;
    Ok(response
        .results
        .into_iter()
        .filter_map(|r| {
            let url = r.url.filter(|u| !u.trim().is_empty())?;
            let title = r
                .title
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty());
            Some(SearchHit {
                title: title.unwrap_or_else(|| url.clone()),
                snippet: r.content.map(|c| c.trim().to_string()).unwrap_or_default(),
                url,
            })
        })
        .collect())
}

/// Tavily errors are `{"detail": {"error": "…"}}`; FastAPI validation errors are
/// `{"detail": [{"loc": […], "msg": "…"}]}` and some are `{"detail": "…"}`.
fn error_message(body: &str) -> Option<String> {
    let value: Value = serde_json::from_str(body).ok()?;
    match value.get("detail")? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("error").and_then(Value::as_str).map(str::to_string),
        Value::Array(items) => {
            let messages: Vec<&str> = items
                .iter()
                .filter_map(|i| i.get("msg").and_then(Value::as_str))
                .collect();
            (!messages.is_empty()).then(|| messages.join("; "))
        }
        _ => None,
    }
}

fn hint(status: StatusCode) -> Option<&'static str> {
    match status.as_u16() {
        401 | 403 => Some("check tools.search_web.api_key"),
        432 | 433 => Some("the Tavily plan's credit limit is reached"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use crate::call::ErrorCode;
    use crate::tools::builtin::search_web::SearchProvider;
    use serde_json::json;
    use wiremock::matchers::{body_json, header, method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    fn answer() -> serde_json::Value {
        json!({
            "query": "rust async",
            "follow_up_questions": null,
            "answer": null,
            "images": [],
            "results": [
                {
                    "title": "Tokio - An asynchronous Rust runtime",
                    "url": "https://tokio.rs/",
                    "content": "Tokio is an event-driven, non-blocking I/O platform.",
                    "score": 0.81,
                    "raw_content": null,
                    "published_date": "2026-01-02"
                },
                {
                    "title": "async-book",
                    "url": "https://rust-lang.github.io/async-book/",
                    "content": "Asynchronous Programming in Rust",
                    "score": 0.74,
                    "raw_content": null
                }
            ],
            "response_time": "1.67",
            "request_id": "123e4567-e89b-12d3-a456-426614174111"
        })
    }

    #[tokio::test]
    async fn sends_the_documented_request_and_maps_results() {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/search"))
            .and(header("authorization", format!("Bearer {KEY}").as_str()))
            .and(header("content-type", "application/json"))
            .and(body_json(json!({
                "query": "rust async",
                "max_results": 7,
                "search_depth": "basic"
            })))
            .respond_with(ResponseTemplate::new(200).set_body_json(answer()))
            .expect(1)
            .mount(&server)
            .await;
        let tool = tool(SearchProvider::Tavily, Some(&server.uri()), Some(KEY));
        let out = run_search(&tool, "rust async", 7).await.unwrap();
        assert_eq!(
            hits(&out),
            vec![
                (
                    "Tokio - An asynchronous Rust runtime".into(),
                    "https://tokio.rs/".into(),
                    "Tokio is an event-driven, non-blocking I/O platform.".into()
                ),
                (
                    "async-book".into(),
                    "https://rust-lang.github.io/async-book/".into(),
                    "Asynchronous Programming in Rust".into()
                ),
            ]
        );
    }

    #[tokio::test]
    async fn truncates_to_num_results() {
        let server = MockServer::start().await;
        Mock::given(path("/search"))
            .respond_with(ResponseTemplate::new(200).set_body_json(answer()))
            .mount(&server)
            .await;
        let tool = tool(SearchProvider::Tavily, Some(&server.uri()), Some(KEY));
        let out = run_search(&tool, "rust async", 1).await.unwrap();
        assert_eq!(hits(&out).len(), 1);
        assert_eq!(out.summary, "1 result");
    }

    #[tokio::test]
    async fn a_400_fails_at_once_with_tavilys_message() {
        let server = MockServer::start().await;
        Mock::given(path("/search"))
            .respond_with(ResponseTemplate::new(400).set_body_json(json!({
                "detail": {"error": "Invalid search_depth. Must be 'basic' or 'advanced'."}
            })))
            .mount(&server)
            .await;
        let tool = tool(SearchProvider::Tavily, Some(&server.uri()), Some(KEY));
        let e = run_search(&tool, "rust", 5).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::ExecutionError);
        assert!(!e.retryable);
        assert_eq!(
            e.message,
            "tavily answered 400 Bad Request: Invalid search_depth. Must be 'basic' or 'advanced'."
        );
        assert_eq!(server.received_requests().await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn an_exhausted_plan_is_not_retried() {
        let server = MockServer::start().await;
        Mock::given(path("/search"))
            .respond_with(ResponseTemplate::new(432).set_body_json(json!({
                "detail": {"error": "This request exceeds your plan's set usage limit."}
            })))
            .mount(&server)
            .await;
        let tool = tool(SearchProvider::Tavily, Some(&server.uri()), Some(KEY));
        let e = run_search(&tool, "rust", 5).await.unwrap_err();
        assert!(!e.retryable);
        assert_eq!(
            e.message,
            "tavily answered 432: This request exceeds your plan's set usage limit. \
             (the Tavily plan's credit limit is reached)"
        );
        assert_eq!(server.received_requests().await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_503_then_200_succeeds_after_one_retry() {
        let server = MockServer::start().await;
        Mock::given(path("/search"))
            .respond_with(ResponseTemplate::new(503))
            .up_to_n_times(1)
            .mount(&server)
            .await;
        Mock::given(path("/search"))
            .respond_with(ResponseTemplate::new(200).set_body_json(answer()))
            .mount(&server)
            .await;
        let tool = tool(SearchProvider::Tavily, Some(&server.uri()), Some(KEY));
        let out = run_search(&tool, "rust", 5).await.unwrap();
        assert_eq!(hits(&out).len(), 2);
        assert_eq!(server.received_requests().await.unwrap().len(), 2);
    }

    #[tokio::test]
    async fn json_of_the_wrong_shape_is_a_readable_error() {
        let server = MockServer::start().await;
        Mock::given(path("/search"))
            .respond_with(
                ResponseTemplate::new(200).set_body_json(json!({"results": {"title": "x"}})),
            )
            .mount(&server)
            .await;
        let tool = tool(SearchProvider::Tavily, Some(&server.uri()), Some(KEY));
        let e = run_search(&tool, "rust", 5).await.unwrap_err();
        assert!(!e.retryable);
        assert!(
            e.message.starts_with(
                "tavily returned JSON without the shape of its JSON format (invalid type: map"
            ),
            "{}",
            e.message
        );
    }

    #[test]
    fn reads_every_error_shape() {
        use super::error_message;
        assert_eq!(
            error_message(r#"{"detail":{"error":"Unauthorized: missing or invalid API key."}}"#)
                .as_deref(),
            Some("Unauthorized: missing or invalid API key.")
        );
        assert_eq!(
            error_message(r#"{"detail":"Not Found"}"#).as_deref(),
            Some("Not Found")
        );
        assert_eq!(
            error_message(r#"{"detail":[{"loc":["body","query"],"msg":"Field required"}]}"#)
                .as_deref(),
            Some("Field required")
        );
        assert_eq!(error_message("oops"), None);
    }
}
