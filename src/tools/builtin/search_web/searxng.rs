//! SearXNG's JSON API (`GET {base}/search?q=…&format=json&pageno=N`), paged until
//! `num_results` is met or a page brings nothing new (docs/design.md §8.16).

use super::http::{self, Endpoint};
use super::{SearchHit, SearchRequest};
use crate::call::{CallError, ErrorCode};
use reqwest::StatusCode;
use reqwest::header::ACCEPT;
use serde::Deserialize;
use serde_json::Value;
use std::collections::HashSet;

/// SearXNG gives about 20 results a page and `num_results` is at most 20; this bounds the
/// paging when engines keep returning a handful each.
const MAX_PAGES: u32 = 5;

const ENDPOINT: Endpoint = Endpoint {
    provider: "searxng",
    error_message: |_| None,
    hint,
};

fn hint(status: StatusCode) -> Option<&'static str> {
    (status == StatusCode::FORBIDDEN)
        .then_some("is json listed in search.formats in the instance's settings.yml?")
}

/// The part of a SearXNG page vaultd uses; everything else (answers, infoboxes, …) is ignored.
#[derive(Debug, Deserialize)]
struct Page {
    results: Vec<PageResult>,
    /// `[["duckduckgo", "CAPTCHA"], …]`; almost never empty, only telling when `results` is.
    #[serde(default)]
    unresponsive_engines: Vec<Value>,
}

#[derive(Debug, Deserialize)]
struct PageResult {
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    content: Option<String>,
}

pub(super) async fn search(request: &SearchRequest<'_>) -> Result<Vec<SearchHit>, CallError> {
    let mut hits: Vec<SearchHit> = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();
    for pageno in 1..=MAX_PAGES {
        let page = match fetch_page(request, pageno).await {
            Ok(page) => page,
            // A later page failing still leaves a useful answer.
            Err(e) if !hits.is_empty() => {
                tracing::warn!(pageno, error = %e, "searxng: a further page failed; returning what earlier pages found");
                break;
            }
            Err(e) => return Err(e),
        };
        if pageno == 1 && page.results.is_empty() && !page.unresponsive_engines.is_empty() {
            return Err(CallError::new(
                ErrorCode::ExecutionError,
                format!(
                    "searxng found nothing because its engines failed: {}",
                    describe_engines(&page.unresponsive_engines)
                ),
            )
            .retryable(true));
        }
        let before = hits.len();
        for result in page.results {
            let Some(url) = result.url.filter(|u| !u.trim().is_empty()) else {
                continue;
            };
            if !seen.insert(url.clone()) {
                continue;
            }
            hits.push(SearchHit {
                title: result
                    .title
                    .map(|t| t.trim().to_string())
                    .filter(|t| !t.is_empty())
                    .unwrap_or_else(|| url.clone()),
                snippet: result
                    .content
                    .map(|c| c.trim().to_string())
                    .unwrap_or_default(),
                url,
            });
        }
        if hits.len() >= request.num_results || hits.len() == before {
            break;
        }
    }
    Ok(hits)
}

async fn fetch_page(request: &SearchRequest<'_>, pageno: u32) -> Result<Page, CallError> {
    let url = request.url("/search");
    let reply = http::send(&ENDPOINT, request.deadline, || {
        request
            .http
            .get(&url)
            .query(&[
                ("q", request.query),
                ("format", "json"),
                ("pageno", &pageno.to_string()),
            ])
            .header(ACCEPT, "application/json")
    })
    .await?;
    reply.json(ENDPOINT.provider)
}

/// "duckduckgo (CAPTCHA), brave (Suspended: too many requests)"
fn describe_engines(engines: &[Value]) -> String {
    engines
        .iter()
        .map(|engine| match engine {
            Value::Array(parts) => {
                let mut parts = parts.iter().map(|p| match p {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                });
                let name = parts.next().unwrap_or_default();
                let reasons: Vec<String> = parts.filter(|r| !r.is_empty()).collect();
                if reasons.is_empty() {
                    name
                } else {
                    format!("{name} ({})", reasons.join(", "))
                }
            }
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use crate::call::ErrorCode;
    use crate::tools::builtin::search_web::SearchProvider;
    use serde_json::{Value, json};
    use std::time::{Duration, Instant};
    use wiremock::matchers::{header, method, path, query_param};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    fn result(n: u32) -> Value {
        json!({
            "url": format!("https://example.org/{n}"),
            "title": format!("Result {n}"),
            "content": format!("Snippet {n}"),
            "engine": "brave",
            "engines": ["brave", "google"],
            "score": 3.2,
            "category": "general",
            "template": "default.html",
            "parsed_url": ["https", "example.org", format!("/{n}"), "", "", ""],
            "positions": [n],
            "publishedDate": null,
            "thumbnail": "",
            "img_src": ""
        })
    }

    fn page(results: Vec<Value>) -> Value {
        json!({
            "query": "rust async",
            "number_of_results": 0,
            "results": results,
            "answers": [{"answer": "42", "url": "https://example.org/a"}],
            "corrections": [],
            "infoboxes": [{"infobox": "Rust", "id": "https://rust-lang.org", "content": "A language",
                           "urls": [{"title": "Home", "url": "https://rust-lang.org"}]}],
            "suggestions": ["rust tokio"],
            "unresponsive_engines": [["duckduckgo", "CAPTCHA"]]
        })
    }

    async fn mount_page(server: &MockServer, pageno: u32, results: Vec<Value>) {
        Mock::given(method("GET"))
            .and(path("/search"))
            .and(query_param("pageno", pageno.to_string()))
            .respond_with(ResponseTemplate::new(200).set_body_json(page(results)))
            .mount(server)
            .await;
    }

    #[tokio::test]
    async fn sends_the_documented_request_and_maps_results() {
        let server = MockServer::start().await;
        Mock::given(method("GET"))
            .and(path("/search"))
            .and(query_param("q", "rust async & more"))
            .and(query_param("format", "json"))
            .and(query_param("pageno", "1"))
            .and(header("accept", "application/json"))
            .respond_with(ResponseTemplate::new(200).set_body_json(page(vec![
                result(1),
                result(2),
                json!({"url": "https://example.org/untitled", "title": null, "content": null}),
                json!({"title": "no url, skipped"}),
            ])))
            .expect(1)
            .mount(&server)
            .await;
        // Pages with nothing new stop the paging.
        mount_page(&server, 2, vec![]).await;
        let tool = tool(SearchProvider::Searxng, Some(&server.uri()), None);
        let out = run_search(&tool, "rust async & more", 5).await.unwrap();
        assert_eq!(
            hits(&out),
            vec![
                (
                    "Result 1".into(),
                    "https://example.org/1".into(),
                    "Snippet 1".into()
                ),
                (
                    "Result 2".into(),
                    "https://example.org/2".into(),
                    "Snippet 2".into()
                ),
                (
                    "https://example.org/untitled".into(),
                    "https://example.org/untitled".into(),
                    String::new()
                ),
            ]
        );
        assert_eq!(out.summary, "3 results");
    }

    #[tokio::test]
    async fn a_base_url_with_a_path_prefix_is_kept() {
        let server = MockServer::start().await;
        Mock::given(method("GET"))
            .and(path("/searxng/search"))
            .respond_with(ResponseTemplate::new(200).set_body_json(page(vec![result(1)])))
            .mount(&server)
            .await;
        let base = format!("{}/searxng/", server.uri());
        let tool = tool(SearchProvider::Searxng, Some(&base), None);
        let out = run_search(&tool, "rust", 1).await.unwrap();
        assert_eq!(hits(&out).len(), 1);
    }

    #[tokio::test]
    async fn pages_until_num_results_is_met() {
        let server = MockServer::start().await;
        mount_page(&server, 1, (1..=3).map(result).collect()).await;
        mount_page(&server, 2, (4..=6).map(result).collect()).await;
        mount_page(&server, 3, (7..=9).map(result).collect()).await;
        let tool = tool(SearchProvider::Searxng, Some(&server.uri()), None);
        let out = run_search(&tool, "rust", 5).await.unwrap();
        let urls: Vec<String> = hits(&out).into_iter().map(|h| h.1).collect();
        assert_eq!(
            urls,
            (1..=5)
                .map(|n| format!("https://example.org/{n}"))
                .collect::<Vec<_>>()
        );
        assert_eq!(out.summary, "5 results");
        let requests = server.received_requests().await.unwrap();
        assert_eq!(requests.len(), 2);
    }

    #[tokio::test]
    async fn stops_paging_at_an_empty_page() {
        let server = MockServer::start().await;
        mount_page(&server, 1, (1..=3).map(result).collect()).await;
        mount_page(&server, 2, vec![]).await;
        let tool = tool(SearchProvider::Searxng, Some(&server.uri()), None);
        let out = run_search(&tool, "rust", 10).await.unwrap();
        assert_eq!(hits(&out).len(), 3);
        assert_eq!(server.received_requests().await.unwrap().len(), 2);
    }

    #[tokio::test]
    async fn stops_paging_when_a_page_repeats_the_last() {
        let server = MockServer::start().await;
        mount_page(&server, 1, (1..=3).map(result).collect()).await;
        mount_page(&server, 2, (1..=3).map(result).collect()).await;
        let tool = tool(SearchProvider::Searxng, Some(&server.uri()), None);
        let out = run_search(&tool, "rust", 10).await.unwrap();
        assert_eq!(hits(&out).len(), 3);
        assert_eq!(server.received_requests().await.unwrap().len(), 2);
    }

    #[tokio::test]
    async fn a_failing_later_page_keeps_earlier_results() {
        let server = MockServer::start().await;
        mount_page(&server, 1, (1..=3).map(result).collect()).await;
        Mock::given(query_param("pageno", "2"))
            .respond_with(ResponseTemplate::new(403).set_body_string("Forbidden"))
            .mount(&server)
            .await;
        let tool = tool(SearchProvider::Searxng, Some(&server.uri()), None);
        let out = run_search(&tool, "rust", 10).await.unwrap();
        assert_eq!(hits(&out).len(), 3);
    }

    #[tokio::test]
    async fn truncates_to_num_results() {
        let server = MockServer::start().await;
        mount_page(&server, 1, (1..=8).map(result).collect()).await;
        let tool = tool(SearchProvider::Searxng, Some(&server.uri()), None);
        let out = run_search(&tool, "rust", 2).await.unwrap();
        assert_eq!(hits(&out).len(), 2);
        assert_eq!(out.summary, "2 results");
        assert_eq!(server.received_requests().await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn no_results_with_unresponsive_engines_is_a_failed_search() {
        let server = MockServer::start().await;
        let body = json!({
            "query": "rust", "number_of_results": 0, "results": [], "answers": [],
            "corrections": [], "infoboxes": [], "suggestions": [],
            "unresponsive_engines": [["duckduckgo", "CAPTCHA"], ["brave", "Suspended: too many requests"]]
        });
        Mock::given(path("/search"))
            .respond_with(ResponseTemplate::new(200).set_body_json(body))
            .expect(1)
            .mount(&server)
            .await;
        let tool = tool(SearchProvider::Searxng, Some(&server.uri()), None);
        let e = run_search(&tool, "rust", 5).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::ExecutionError);
        assert!(e.retryable);
        assert_eq!(
            e.message,
            "searxng found nothing because its engines failed: duckduckgo (CAPTCHA), \
             brave (Suspended: too many requests)"
        );
    }

    #[tokio::test]
    async fn no_results_and_no_failed_engines_is_an_empty_answer() {
        let server = MockServer::start().await;
        Mock::given(path("/search"))
            .respond_with(
                ResponseTemplate::new(200).set_body_json(
                    json!({"query": "zzz", "results": [], "unresponsive_engines": []}),
                ),
            )
            .mount(&server)
            .await;
        let tool = tool(SearchProvider::Searxng, Some(&server.uri()), None);
        let out = run_search(&tool, "zzz", 5).await.unwrap();
        assert_eq!(out.data, json!({"results": []}));
        assert_eq!(out.summary, "0 results");
    }

    #[tokio::test]
    async fn retries_a_429_once_then_succeeds() {
        let server = MockServer::start().await;
        Mock::given(path("/search"))
            .respond_with(
                ResponseTemplate::new(429)
                    .insert_header("Retry-After", "1")
                    .set_body_string("Too Many Requests"),
            )
            .up_to_n_times(1)
            .mount(&server)
            .await;
        mount_page(&server, 1, (1..=5).map(result).collect()).await;
        let tool = tool(SearchProvider::Searxng, Some(&server.uri()), None);
        let started = Instant::now();
        let out = run_search(&tool, "rust", 5).await.unwrap();
        assert_eq!(hits(&out).len(), 5);
        assert_eq!(server.received_requests().await.unwrap().len(), 2);
        assert!(
            started.elapsed() >= Duration::from_secs(1),
            "Retry-After was honoured"
        );
    }

    #[tokio::test]
    async fn persistent_500_gives_up_before_the_deadline() {
        // Attempts at 0, 0.2, 0.6, 1.4 and 3 s; the next would start at 6.2 s, past the
        // deadline, so the call gives up at about 3 s with the last error: 3 s of slack on a
        // loaded machine (with 2.9 s, 1.5 s of slack, it failed once under load; with 2 s,
        // one slow attempt made it a TIMEOUT). Reaching the deadline would be a TIMEOUT, so
        // the error's code is the check; no clock is read here.
        const DEADLINE: Duration = Duration::from_secs(6);
        let server = MockServer::start().await;
        Mock::given(path("/search"))
            .respond_with(
                ResponseTemplate::new(500).set_body_string("<h1>Internal   Server\nError</h1>"),
            )
            .mount(&server)
            .await;
        let tool = tool(SearchProvider::Searxng, Some(&server.uri()), None);
        let e = run(&tool, json!({"query": "rust"}), DEADLINE)
            .await
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::ExecutionError, "{}", e.message);
        assert!(e.retryable);
        let attempts = server.received_requests().await.unwrap().len();
        assert!(attempts >= 3, "{attempts} attempts");
        assert!(
            e.message.starts_with(&format!(
                "searxng answered 500 Internal Server Error {attempts} times; \
                 last body: <h1>Internal Server Error</h1>"
            )),
            "{}",
            e.message
        );
    }

    #[tokio::test]
    async fn a_retry_after_past_the_deadline_stops_at_once() {
        let server = MockServer::start().await;
        Mock::given(path("/search"))
            .respond_with(ResponseTemplate::new(429).insert_header("Retry-After", "60"))
            .mount(&server)
            .await;
        let tool = tool(SearchProvider::Searxng, Some(&server.uri()), None);
        let e = run(&tool, json!({"query": "rust"}), Duration::from_secs(5))
            .await
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::ExecutionError);
        assert!(e.retryable);
        assert!(e.message.contains("429 Too Many Requests"), "{}", e.message);
        assert!(e.message.contains("Retry-After"), "{}", e.message);
        assert_eq!(server.received_requests().await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_slow_provider_ends_in_timeout_at_the_deadline() {
        let server = MockServer::start().await;
        Mock::given(path("/search"))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_json(page(vec![result(1)]))
                    .set_delay(Duration::from_secs(5)),
            )
            .mount(&server)
            .await;
        let tool = tool(SearchProvider::Searxng, Some(&server.uri()), None);
        let started = Instant::now();
        let e = run(&tool, json!({"query": "rust"}), Duration::from_millis(500))
            .await
            .unwrap_err();
        // Well before the server's 5 s answer, with room for a loaded machine.
        assert!(started.elapsed() < Duration::from_secs(4));
        assert_eq!(e.code, ErrorCode::Timeout, "{}", e.message);
        assert!(e.retryable);
    }

    #[tokio::test]
    async fn a_400_fails_at_once_with_the_providers_message() {
        let server = MockServer::start().await;
        Mock::given(path("/search"))
            .respond_with(ResponseTemplate::new(400).set_body_string("Invalid   pageno\n"))
            .mount(&server)
            .await;
        let tool = tool(SearchProvider::Searxng, Some(&server.uri()), None);
        let e = run_search(&tool, "rust", 5).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::ExecutionError);
        assert!(!e.retryable);
        assert_eq!(
            e.message,
            "searxng answered 400 Bad Request: Invalid pageno"
        );
        assert_eq!(server.received_requests().await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_403_hints_at_the_json_format_setting() {
        let server = MockServer::start().await;
        Mock::given(path("/search"))
            .respond_with(ResponseTemplate::new(403).set_body_string("Forbidden"))
            .mount(&server)
            .await;
        let tool = tool(SearchProvider::Searxng, Some(&server.uri()), None);
        let e = run_search(&tool, "rust", 5).await.unwrap_err();
        assert!(!e.retryable);
        assert!(e.message.contains("search.formats"), "{}", e.message);
    }

    async fn garbage(status: u16, content_type: &str, body: &str) -> crate::call::CallError {
        let server = MockServer::start().await;
        Mock::given(path("/search"))
            .respond_with(
                ResponseTemplate::new(status).set_body_raw(body.as_bytes().to_vec(), content_type),
            )
            .mount(&server)
            .await;
        let tool = tool(SearchProvider::Searxng, Some(&server.uri()), None);
        let e = run_search(&tool, "rust", 5).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::ExecutionError);
        assert!(!e.retryable, "{}", e.message);
        e
    }

    #[tokio::test]
    async fn an_html_page_with_200_is_a_readable_error() {
        let html = format!(
            "<!DOCTYPE html>\n<html><head><title>SearXNG</title></head><body>{}</body></html>",
            "<p>results</p>".repeat(50)
        );
        let e = garbage(200, "text/html; charset=utf-8", &html).await;
        let expected = format!(
            "searxng returned something that is not its JSON format (text/html; charset=utf-8, {} bytes): <!DOCTYPE html> <html><head>",
            html.len()
        );
        assert!(e.message.starts_with(&expected), "{}", e.message);
        assert!(e.message.ends_with('…'), "{}", e.message);
    }

    #[tokio::test]
    async fn truncated_json_is_a_readable_error() {
        let e = garbage(
            200,
            "application/json",
            r#"{"query": "rust", "results": [{"url": "#,
        )
        .await;
        assert!(
            e.message
                .starts_with("searxng returned something that is not its JSON format (application/json, 38 bytes): {\"query\""),
            "{}",
            e.message
        );
    }

    #[tokio::test]
    async fn an_empty_body_is_a_readable_error() {
        let e = garbage(200, "application/json", "").await;
        assert_eq!(
            e.message,
            "searxng returned an empty body (application/json, 0 bytes) instead of its JSON format"
        );
    }

    #[tokio::test]
    async fn json_of_the_wrong_shape_is_a_readable_error() {
        let e = garbage(200, "application/json", r#"{"error": "no such thing"}"#).await;
        assert!(
            e.message.starts_with("searxng returned JSON without the shape of its JSON format (missing field `results`"),
            "{}",
            e.message
        );
    }
}
