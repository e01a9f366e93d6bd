//! DuckDuckGo's keyless HTML endpoint (`POST {base}/html/`, form `q=…&b=&kl=wt-wt`), best
//! effort: there is no API contract, the markup is read by scanning for the classes
//! `result__a` and `result__snippet`, and a bot check is reported as such (REFERENCE §6).

use super::http::{self, Endpoint, Reply};
use super::{SearchHit, SearchRequest, decode_entities, html_to_text};
use crate::call::{CallError, ErrorCode};
use percent_encoding::percent_decode_str;
use reqwest::StatusCode;
use reqwest::header::{ACCEPT, ACCEPT_LANGUAGE, REFERER, USER_AGENT};
use std::time::{Duration, Instant};

pub(super) const DEFAULT_BASE_URL: &str = "https://html.duckduckgo.com";

/// DuckDuckGo blocks an address after a burst of searches; one search per this interval,
/// across all calls of the daemon, keeps it quiet.
const MIN_INTERVAL: Duration = Duration::from_secs(2);

/// DuckDuckGo caps queries at this many characters.
const MAX_QUERY_CHARS: usize = 499;

/// The bot blocker turns away obvious non-browsers.
const BROWSER_USER_AGENT: &str =
    "Mozilla/5.0 (X11; Linux x86_64; rv:140.0) Gecko/20100101 Firefox/140.0";

const BOT_CHECK: &str = "DuckDuckGo refused the search (bot check); configure searxng, brave \
                         or tavily for reliable search";

const ENDPOINT: Endpoint = Endpoint {
    provider: "duckduckgo",
    error_message: |_| None,
    hint: |_| None,
};

/// Spaces DuckDuckGo searches [`MIN_INTERVAL`] apart. Each search reserves the next free
/// slot under the lock, then sleeps without it, so concurrent calls queue in order.
#[derive(Debug, Default)]
pub(super) struct Pacer {
    last_slot: tokio::sync::Mutex<Option<Instant>>,
}

impl Pacer {
    pub async fn wait_for_turn(&self, deadline: Instant) -> Result<(), CallError> {
        let slot = {
            let mut last = self.last_slot.lock().await;
            let now = Instant::now();
            let slot = last.map_or(now, |l| (l + MIN_INTERVAL).max(now));
            if slot >= deadline {
                return Err(CallError::new(
                    ErrorCode::ExecutionError,
                    format!(
                        "duckduckgo searches are spaced {} s apart and other searches are \
                         queued ahead of this one past the call's deadline",
                        MIN_INTERVAL.as_secs()
                    ),
                )
                .retryable(true));
            }
            *last = Some(slot);
            slot
        };
        tokio::time::sleep_until(slot.into()).await;
        Ok(())
    }
}

pub(super) async fn search(request: &SearchRequest<'_>) -> Result<Vec<SearchHit>, CallError> {
    let query: String = request.query.chars().take(MAX_QUERY_CHARS).collect();
    let url = request.url("/html/");
    let referer = request.url("/");
    let reply = http::send(&ENDPOINT, request.deadline, || {
        request
            .http
            .post(&url)
            .header(USER_AGENT, BROWSER_USER_AGENT)
            .header(REFERER, &referer)
            .header(
                ACCEPT,
                "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
            )
            .header(ACCEPT_LANGUAGE, "en-US,en;q=0.5")
            .form(&[("q", query.as_str()), ("b", ""), ("kl", "wt-wt")])
    })
    .await?;
    if reply.status == StatusCode::ACCEPTED {
        return Err(bot_check());
    }
    read_page(&reply)
}

fn read_page(reply: &Reply) -> Result<Vec<SearchHit>, CallError> {
    let html = reply.text();
    match parse_page(&html) {
        Page::Results(hits) => Ok(hits),
        Page::NoResults => Ok(Vec::new()),
        Page::BotCheck => Err(bot_check()),
        Page::Unrecognised => Err(reply.unreadable("duckduckgo", "a DuckDuckGo results page")),
    }
}

fn bot_check() -> CallError {
    CallError::new(ErrorCode::ExecutionError, BOT_CHECK).retryable(true)
}

/// What a DuckDuckGo HTML page turned out to be.
#[derive(Debug, PartialEq)]
enum Page {
    Results(Vec<SearchHit>),
    /// A results page that says it found nothing.
    NoResults,
    /// The CAPTCHA / "anomaly" page.
    BotCheck,
    /// Markup vaultd does not recognise (DuckDuckGo changed it, or a proxy answered).
    Unrecognised,
}

/// One `div.result` while it is being read.
#[derive(Debug, Default)]
struct Block {
    ad: bool,
    title: Option<String>,
    href: Option<String>,
    snippet: Option<String>,
}

impl Block {
    fn into_hit(self) -> Option<SearchHit> {
        if self.ad {
            return None;
        }
        let url = resolve_href(self.href.as_deref()?)?;
        let title = self
            .title
            .filter(|t| !t.is_empty())
            .unwrap_or_else(|| url.clone());
        Some(SearchHit {
            title,
            url,
            snippet: self.snippet.unwrap_or_default(),
        })
    }
}

fn parse_page(html: &str) -> Page {
    let mut hits = Vec::new();
    let mut block: Option<Block> = None;
    let mut pos = 0;
    while let Some(tag) = next_tag(html, pos) {
        pos = tag.end;
        if tag.closing {
            continue;
        }
        let classes = tag.attr("class").unwrap_or_default();
        if tag.name == "div" && has_class(&classes, "result") {
            hits.extend(block.take().and_then(Block::into_hit));
            block = Some(Block {
                ad: has_class(&classes, "result--ad"),
                ..Block::default()
            });
        } else if tag.name == "a" && has_class(&classes, "result__a") {
            let current = block.get_or_insert_with(Block::default);
            if current.title.is_none() {
                current.title = Some(html_to_text(inner_html(html, &tag)));
                current.href = tag.attr("href");
            }
        } else if has_class(&classes, "result__snippet") {
            let current = block.get_or_insert_with(Block::default);
            if current.snippet.is_none() {
                current.snippet = Some(html_to_text(inner_html(html, &tag)));
            }
        }
    }
    hits.extend(block.take().and_then(Block::into_hit));

    if !hits.is_empty() {
        return Page::Results(hits);
    }
    let lower = html.to_ascii_lowercase();
    if lower.contains("challenge-form") || lower.contains("anomaly") {
        Page::BotCheck
    } else if lower.contains("no-results") || lower.contains("no results.") {
        Page::NoResults
    } else if lower.contains("result__a") || lower.contains("id=\"links\"") {
        // A results page whose results were all ads.
        Page::NoResults
    } else {
        Page::Unrecognised
    }
}

/// A result link as the address it leads to: DuckDuckGo's redirect
/// `//duckduckgo.com/l/?uddg=<percent-encoded>&rut=…` is unwrapped; ad links
/// (`/y.js`) and anything not http(s) are dropped.
fn resolve_href(href: &str) -> Option<String> {
    let href = href.trim();
    let absolute = if href.starts_with("//") {
        format!("https:{href}")
    } else if href.starts_with('/') {
        format!("https://duckduckgo.com{href}")
    } else {
        href.to_string()
    };
    let url = reqwest::Url::parse(&absolute).ok()?;
    let on_duckduckgo = url
        .host_str()
        .is_some_and(|h| h == "duckduckgo.com" || h.ends_with(".duckduckgo.com"));
    if on_duckduckgo && url.path().starts_with("/l/") {
        let target = url
            .query()?
            .split('&')
            .find_map(|pair| pair.strip_prefix("uddg="))?;
        let target = percent_decode_str(target).decode_utf8().ok()?;
        return resolve_target(&target);
    }
    if on_duckduckgo && url.path() == "/y.js" {
        return None;
    }
    resolve_target(url.as_str())
}

fn resolve_target(target: &str) -> Option<String> {
    let url = reqwest::Url::parse(target).ok()?;
    matches!(url.scheme(), "http" | "https").then(|| target.to_string())
}

/// One HTML tag found by [`next_tag`].
#[derive(Debug)]
struct Tag<'a> {
    /// Lower-cased.
    name: String,
    closing: bool,
    /// Raw attribute text between the name and `>`.
    attributes: &'a str,
    /// Byte offset just past the `>`.
    end: usize,
}

impl Tag<'_> {
    /// The attribute's value with entities decoded; `Some("")` for a bare attribute.
    fn attr(&self, wanted: &str) -> Option<String> {
        let mut rest = self.attributes;
        loop {
            rest = rest.trim_start_matches(|c: char| c.is_ascii_whitespace() || c == '/');
            if rest.is_empty() {
                return None;
            }
            let name_len = rest
                .find(|c: char| c.is_ascii_whitespace() || c == '=' || c == '/')
                .unwrap_or(rest.len());
            let name = &rest[..name_len];
            rest = rest[name_len..].trim_start();
            let mut value = "";
            if let Some(after_eq) = rest.strip_prefix('=') {
                let after_eq = after_eq.trim_start();
                let (v, remaining) = match after_eq.chars().next() {
                    Some(q @ ('"' | '\'')) => {
                        let body = &after_eq[1..];
                        match body.find(q) {
                            Some(close) => (&body[..close], &body[close + 1..]),
                            None => (body, ""),
                        }
                    }
                    _ => {
                        let len = after_eq
                            .find(|c: char| c.is_ascii_whitespace())
                            .unwrap_or(after_eq.len());
                        (&after_eq[..len], &after_eq[len..])
                    }
                };
                value = v;
                rest = remaining;
            }
            if name.eq_ignore_ascii_case(wanted) {
                return Some(decode_entities(value).into_owned());
            }
        }
    }
}

/// The next tag at or after byte `from`, skipping comments, doctype and the contents of
/// `<script>` and `<style>`. Quoted attribute values may contain `>`.
fn next_tag(html: &str, from: usize) -> Option<Tag<'_>> {
    let bytes = html.as_bytes();
    let mut pos = from;
    loop {
        let open = pos + html.get(pos..)?.find('<')?;
        let rest = &html[open..];
        if let Some(comment) = rest.strip_prefix("<!--") {
            pos = open + 4 + comment.find("-->").map_or(comment.len(), |i| i + 3);
            continue;
        }
        if rest.starts_with("<!") || rest.starts_with("<?") {
            pos = open + rest.find('>').map_or(rest.len(), |i| i + 1);
            continue;
        }
        let closing = rest.as_bytes().get(1) == Some(&b'/');
        let name_start = open + if closing { 2 } else { 1 };
        let name_len = bytes[name_start..]
            .iter()
            .take_while(|b| b.is_ascii_alphanumeric() || **b == b'-')
            .count();
        if name_len == 0 || !bytes[name_start].is_ascii_alphabetic() {
            // A stray `<` in text.
            pos = open + 1;
            continue;
        }
        let name = html[name_start..name_start + name_len].to_ascii_lowercase();
        let attributes_start = name_start + name_len;
        let gt = find_tag_end(bytes, attributes_start)?;
        let mut end = gt + 1;
        if !closing && (name == "script" || name == "style") {
            let close = format!("</{name}");
            end = find_ignore_case(html, &close, end).unwrap_or(html.len());
        }
        return Some(Tag {
            name,
            closing,
            attributes: &html[attributes_start..gt],
            end,
        });
    }
}

/// The `>` ending a tag, skipping any inside quoted attribute values.
fn find_tag_end(bytes: &[u8], from: usize) -> Option<usize> {
    let mut quote: Option<u8> = None;
    for (i, &b) in bytes.iter().enumerate().skip(from) {
        match quote {
            Some(q) if b == q => quote = None,
            Some(_) => {}
            None if b == b'"' || b == b'\'' => quote = Some(b),
            None if b == b'>' => return Some(i),
            None => {}
        }
    }
    None
}

/// The markup between `tag` and the next closing tag of the same name.
fn inner_html<'a>(html: &'a str, tag: &Tag<'_>) -> &'a str {
    let close = format!("</{}", tag.name);
    let end = find_ignore_case(html, &close, tag.end).unwrap_or(html.len());
    &html[tag.end..end]
}

fn find_ignore_case(haystack: &str, needle: &str, from: usize) -> Option<usize> {
    let needle = needle.as_bytes();
    haystack
        .as_bytes()
        .get(from..)?
        .windows(needle.len())
        .position(|w| w.eq_ignore_ascii_case(needle))
        .map(|i| from + i)
}

fn has_class(classes: &str, wanted: &str) -> bool {
    classes.split_ascii_whitespace().any(|c| c == wanted)
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use crate::tools::builtin::search_web::SearchProvider;
    use serde_json::json;
    use wiremock::matchers::{header, method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    /// The shape of html.duckduckgo.com/html/ as of 2026: one ad, two organic results
    /// (one through the uddg redirect, one direct), entities and `<b>` highlighting.
    const RESULTS_PAGE: &str = r#"<!DOCTYPE html PUBLIC "-//W3C//DTD HTML 4.01 Transitional//EN">
<html>
<head>
  <meta http-equiv="content-type" content="text/html; charset=UTF-8">
  <title>rust &amp; tokio at DuckDuckGo</title>
  <script type="text/javascript">var x = '<div class="result"><a class="result__a" href="https://evil.example/">not a result</a></div>';</script>
</head>
<body>
<div id="links" class="results">
  <!-- <div class="result"><a class="result__a" href="https://commented.example/">commented out</a></div> -->
  <div class="result results_links results_links_deep result--ad ">
    <div class="links_main links_deep result__body">
      <h2 class="result__title">
        <a rel="nofollow" class="result__a" href="https://duckduckgo.com/y.js?ad_domain=ads.example&amp;ad_provider=bingv7aa&amp;u3=x">Buy Rust Now</a>
      </h2>
      <a class="result__snippet" href="https://duckduckgo.com/y.js?ad_domain=ads.example">Cheap rust, ad.</a>
    </div>
  </div>
  <div class="result results_links results_links_deep web-result ">
    <div class="links_main links_deep result__body">
      <h2 class="result__title">
        <a rel="nofollow" class="result__a" href="//duckduckgo.com/l/?uddg=https%3A%2F%2Ftokio.rs%2Ftokio%2Ftutorial%3Fa%3D1%26b%3D2&amp;rut=7f3c0e5b1a">Tokio &amp; <b>Rust</b> &mdash; Tutorial</a>
      </h2>
      <div class="result__extras">
        <div class="result__extras__url">
          <a class="result__url" href="//duckduckgo.com/l/?uddg=https%3A%2F%2Ftokio.rs%2F">tokio.rs/tokio/tutorial</a>
        </div>
      </div>
      <a class="result__snippet" href="//duckduckgo.com/l/?uddg=https%3A%2F%2Ftokio.rs%2F">Tokio is an &quot;asynchronous&quot;
        runtime for the <b>Rust</b> programming language &#39;&lt;3&#39;.</a>
      <div class="clear"></div>
    </div>
  </div>
  <div class="result results_links results_links_deep web-result ">
    <div class="links_main links_deep result__body">
      <h2 class="result__title">
        <a rel="nofollow" class="result__a" data-title='a > b' href="https://rust-lang.github.io/async-book/">Asynchronous Programming in Rust</a>
      </h2>
      <a class="result__snippet" href="https://rust-lang.github.io/async-book/">The <b>async</b> book.</a>
    </div>
  </div>
</div>
</body>
</html>
"#;

    const CAPTCHA_PAGE: &str = r#"<!DOCTYPE html><html><head><title>DuckDuckGo</title></head>
<body><div class="anomaly-modal__modal" data-testid="anomaly-modal">
<div class="anomaly-modal__title">Unfortunately, bots use DuckDuckGo too.</div>
<form id="challenge-form" action="/anomaly.js?sv=html&amp;cc=botnet" method="POST">
<input type="hidden" name="challenge" value="abc"></form></div></body></html>"#;

    const NO_RESULTS_PAGE: &str = r#"<html><body><div id="links" class="results">
<div class="no-results">No results.</div></div></body></html>"#;

    fn expected_hits() -> Vec<(String, String, String)> {
        vec![
            (
                "Tokio & Rust — Tutorial".into(),
                "https://tokio.rs/tokio/tutorial?a=1&b=2".into(),
                "Tokio is an \"asynchronous\" runtime for the Rust programming language '<3'."
                    .into(),
            ),
            (
                "Asynchronous Programming in Rust".into(),
                "https://rust-lang.github.io/async-book/".into(),
                "The async book.".into(),
            ),
        ]
    }

    #[test]
    fn parses_results_skipping_ads_scripts_and_comments() {
        let Page::Results(found) = parse_page(RESULTS_PAGE) else {
            panic!("no results parsed");
        };
        let found: Vec<_> = found
            .into_iter()
            .map(|h| (h.title, h.url, h.snippet))
            .collect();
        assert_eq!(found, expected_hits());
    }

    #[test]
    fn recognises_the_bot_check_no_results_and_foreign_pages() {
        assert_eq!(parse_page(CAPTCHA_PAGE), Page::BotCheck);
        assert_eq!(parse_page(NO_RESULTS_PAGE), Page::NoResults);
        assert_eq!(
            parse_page("<html><body><h1>502 Bad Gateway</h1></body></html>"),
            Page::Unrecognised
        );
        assert_eq!(parse_page(""), Page::Unrecognised);
    }

    #[test]
    fn a_result_about_anomalies_is_still_a_result() {
        let page = r#"<div class="result"><a class="result__a" href="https://example.org/a">Anomaly detection</a>
<a class="result__snippet">Finding the anomaly.</a></div>"#;
        assert!(matches!(parse_page(page), Page::Results(h) if h.len() == 1));
    }

    #[test]
    fn survives_broken_markup() {
        for html in [
            "<div class=\"result\"><a class=\"result__a\" href=\"https://example.org/",
            "<div class=\"result\"><a class=\"result__a\" href=https://example.org/x>Unquoted",
            "<<<>>> < a <!-- never closed",
            "<div class='result'><a class='result__a' href='//duckduckgo.com/l/?uddg=%FF%FE'>bad utf8</a></div>",
            "<a class=\"result__a\" href=\"javascript:alert(1)\">js</a>",
            "<script>never closed <div class=\"result\">",
            "é<ü<😀>",
        ] {
            let _ = parse_page(html);
        }
        let Page::Results(h) = parse_page(
            "<div class=\"result\"><a class=\"result__a\" href=https://example.org/x>Unquoted",
        ) else {
            panic!("unquoted href not read");
        };
        assert_eq!(h[0].url, "https://example.org/x");
        assert_eq!(h[0].title, "Unquoted");
    }

    #[test]
    fn resolves_hrefs() {
        assert_eq!(
            resolve_href("//duckduckgo.com/l/?uddg=https%3A%2F%2Fexample.org%2Fa%20b%2Bc&rut=1")
                .as_deref(),
            Some("https://example.org/a b+c")
        );
        assert_eq!(
            resolve_href("/l/?kh=-1&uddg=http%3A%2F%2Fexample.org%2F").as_deref(),
            Some("http://example.org/")
        );
        assert_eq!(
            resolve_href("https://example.org/direct").as_deref(),
            Some("https://example.org/direct")
        );
        assert_eq!(
            resolve_href("https://duckduckgo.com/y.js?ad_domain=x"),
            None
        );
        assert_eq!(resolve_href("//duckduckgo.com/l/?rut=1"), None);
        assert_eq!(resolve_href("javascript:alert(1)"), None);
        assert_eq!(
            resolve_href("//duckduckgo.com/l/?uddg=javascript%3Aalert(1)"),
            None
        );
    }

    #[tokio::test]
    async fn sends_the_documented_request_and_maps_results() {
        let server = MockServer::start().await;
        let base = server.uri();
        Mock::given(method("POST"))
            .and(path("/html/"))
            .and(header("referer", format!("{base}/").as_str()))
            .and(header("content-type", "application/x-www-form-urlencoded"))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_raw(RESULTS_PAGE.as_bytes().to_vec(), "text/html; charset=UTF-8"),
            )
            .expect(1)
            .mount(&server)
            .await;
        let tool = tool(SearchProvider::DuckDuckGo, Some(&base), None);
        let out = run_search(&tool, "rust & tokio", 5).await.unwrap();
        assert_eq!(hits(&out), expected_hits());
        assert_eq!(out.summary, "2 results");

        let requests = server.received_requests().await.unwrap();
        let request = &requests[0];
        let agent = request.headers.get("user-agent").unwrap().to_str().unwrap();
        assert!(agent.starts_with("Mozilla/5.0"), "{agent}");
        let body = String::from_utf8(request.body.clone()).unwrap();
        let form: Vec<(String, String)> = reqwest::Url::parse(&format!("http://x/?{body}"))
            .unwrap()
            .query_pairs()
            .into_owned()
            .collect();
        assert_eq!(
            form,
            vec![
                ("q".into(), "rust & tokio".into()),
                ("b".into(), String::new()),
                ("kl".into(), "wt-wt".into()),
            ]
        );
    }

    #[tokio::test]
    async fn truncates_to_num_results() {
        let server = MockServer::start().await;
        Mock::given(path("/html/"))
            .respond_with(ResponseTemplate::new(200).set_body_raw(RESULTS_PAGE, "text/html"))
            .mount(&server)
            .await;
        let tool = tool(SearchProvider::DuckDuckGo, Some(&server.uri()), None);
        let out = run_search(&tool, "rust", 1).await.unwrap();
        assert_eq!(hits(&out), expected_hits()[..1].to_vec());
    }

    #[tokio::test]
    async fn a_captcha_page_is_a_retryable_bot_check() {
        let server = MockServer::start().await;
        Mock::given(path("/html/"))
            .respond_with(ResponseTemplate::new(200).set_body_raw(CAPTCHA_PAGE, "text/html"))
            .expect(1)
            .mount(&server)
            .await;
        let tool = tool(SearchProvider::DuckDuckGo, Some(&server.uri()), None);
        let e = run_search(&tool, "rust", 5).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::ExecutionError);
        assert!(e.retryable);
        assert_eq!(e.message, BOT_CHECK);
    }

    #[tokio::test]
    async fn a_202_is_a_retryable_bot_check() {
        let server = MockServer::start().await;
        Mock::given(path("/html/"))
            .respond_with(ResponseTemplate::new(202).set_body_raw(RESULTS_PAGE, "text/html"))
            .expect(1)
            .mount(&server)
            .await;
        let tool = tool(SearchProvider::DuckDuckGo, Some(&server.uri()), None);
        let e = run_search(&tool, "rust", 5).await.unwrap_err();
        assert_eq!(e.message, BOT_CHECK);
        assert!(e.retryable);
    }

    #[tokio::test]
    async fn no_results_is_an_empty_answer() {
        let server = MockServer::start().await;
        Mock::given(path("/html/"))
            .respond_with(ResponseTemplate::new(200).set_body_raw(NO_RESULTS_PAGE, "text/html"))
            .mount(&server)
            .await;
        let tool = tool(SearchProvider::DuckDuckGo, Some(&server.uri()), None);
        let out = run_search(&tool, "zzqxv", 5).await.unwrap();
        assert_eq!(out.data, json!({"results": []}));
    }

    #[tokio::test]
    async fn an_unknown_page_is_a_readable_error() {
        let server = MockServer::start().await;
        Mock::given(path("/html/"))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_raw("<html><body>Welcome to nginx!</body></html>", "text/html"),
            )
            .mount(&server)
            .await;
        let tool = tool(SearchProvider::DuckDuckGo, Some(&server.uri()), None);
        let e = run_search(&tool, "rust", 5).await.unwrap_err();
        assert!(!e.retryable);
        assert_eq!(
            e.message,
            "duckduckgo returned something that is not a DuckDuckGo results page \
             (text/html, 43 bytes): <html><body>Welcome to nginx!</body></html>"
        );
    }

    #[tokio::test]
    async fn searches_are_paced() {
        let pacer = Pacer::default();
        let deadline = Instant::now() + Duration::from_secs(10);
        let started = Instant::now();
        pacer.wait_for_turn(deadline).await.unwrap();
        // The first search does not wait (well under the interval, even on a loaded machine).
        assert!(started.elapsed() < MIN_INTERVAL / 2);
        pacer.wait_for_turn(deadline).await.unwrap();
        assert!(started.elapsed() >= MIN_INTERVAL);
        let e = pacer
            .wait_for_turn(Instant::now() + Duration::from_millis(100))
            .await
            .unwrap_err();
        assert!(e.retryable);
    }
}
