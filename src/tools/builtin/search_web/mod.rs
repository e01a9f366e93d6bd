//! `search_web` (read_only): one query to the configured provider, mapped to
//! `{ "results": [ { "title", "url", "snippet" } ] }`.
//!
//! # Layout
//! - `config.rs`: the `[tools.search_web]` table.
//! - `mod.rs`: parameters, provider choice and configuration checks, the shared result type
//!   and the HTML text clean-up Brave and DuckDuckGo both need.
//! - `http.rs`: one request with retries bounded by the call's deadline (docs/design.md §8.4).
//! - `searxng.rs`, `brave.rs`, `tavily.rs`, `duckduckgo.rs`: one wire format each
//!   (REFERENCE §6).

mod brave;
pub mod config;
mod duckduckgo;
mod http;
mod searxng;
mod tavily;

use crate::call::{CallError, ErrorCode, ToolOutput};
use crate::secret::Redactor;
use crate::tools::{Effect, Source, Tool, ToolCall, ToolFuture, ToolSpec};
pub use config::{SearchProvider, SearchWebConfig};
use reqwest::Url;
use serde::Serialize;
use serde_json::{Value, json};
use std::borrow::Cow;
use std::time::Instant;

const DEFAULT_NUM_RESULTS: u64 = 5;
const MAX_NUM_RESULTS: u64 = 20;

pub struct SearchWeb {
    spec: ToolSpec,
    config: SearchWebConfig,
    /// Shared with the other tools so connections are reused.
    http: reqwest::Client,
    /// Scrubs the API key from every message, in case a provider echoes it in an error body.
    redactor: Redactor,
    /// DuckDuckGo blocks bursts; its searches are spaced out across all calls.
    duckduckgo_pacer: duckduckgo::Pacer,
}

impl SearchWeb {
    pub fn new(config: &SearchWebConfig, http: reqwest::Client) -> SearchWeb {
        SearchWeb {
            spec: ToolSpec {
                name: "search_web".to_string(),
                description: "Search the web and return the top results (title, url, snippet)."
                    .to_string(),
                source: Source::Builtin,
                effect: Effect::ReadOnly,
                schema: json!({
                    "type": "object",
                    "properties": {
                        "query": { "type": "string", "minLength": 1, "maxLength": 500,
                                   "description": "What to search for." },
                        "num_results": { "type": "integer", "minimum": 1, "maximum": 20, "default": 5,
                                         "description": "How many results to return (default 5)." }
                    },
                    "required": ["query"],
                    "additionalProperties": false
                }),
            },
            config: config.clone(),
            http,
            redactor: Redactor::for_holders(&[config]),
            duckduckgo_pacer: duckduckgo::Pacer::default(),
        }
    }

    /// Runs the query against the configured provider; at most `num_results` hits.
    async fn search(
        &self,
        query: &str,
        num_results: usize,
        deadline: Instant,
    ) -> Result<Vec<SearchHit>, CallError> {
        let provider = self.config.provider;
        let base = match (provider, self.config.base_url.as_deref()) {
            (_, Some(configured)) => parse_base_url(configured)?,
            (SearchProvider::Searxng, None) => {
                return Err(not_configured(
                    "set tools.search_web.base_url to your SearXNG instance \
                     (its settings.yml must list json in search.formats)",
                ));
            }
            (SearchProvider::DuckDuckGo, None) => parse_default(duckduckgo::DEFAULT_BASE_URL),
            (SearchProvider::Brave, None) => parse_default(brave::DEFAULT_BASE_URL),
            (SearchProvider::Tavily, None) => parse_default(tavily::DEFAULT_BASE_URL),
        };
        let request = SearchRequest {
            http: &self.http,
            base: base.as_str().trim_end_matches('/'),
            query,
            num_results,
            deadline,
        };
        let mut hits = match provider {
            SearchProvider::Searxng => searxng::search(&request).await?,
            SearchProvider::DuckDuckGo => {
                self.duckduckgo_pacer.wait_for_turn(deadline).await?;
                duckduckgo::search(&request).await?
            }
            SearchProvider::Brave => {
                let key = self.api_key(&base, "brave", "Brave Search")?;
                brave::search(&request, key).await?
            }
            SearchProvider::Tavily => {
                let key = self.api_key(&base, "tavily", "Tavily")?;
                tavily::search(&request, key).await?
            }
        };
        hits.truncate(num_results);
        Ok(hits)
    }

    /// The configured key, refusing to send it in clear text to another machine (§8.12).
    fn api_key(&self, base: &Url, provider: &str, product: &str) -> Result<&str, CallError> {
        let Some(key) = &self.config.api_key else {
            return Err(not_configured(format!(
                "search provider {provider} needs an API key: set tools.search_web.api_key \
                 to a reference to your {product} key, e.g. \"env:{}_API_KEY\"",
                provider.to_ascii_uppercase()
            )));
        };
        if base.scheme() != "https" && !is_loopback(base) {
            return Err(not_configured(format!(
                "refusing to send the {provider} API key over plain {} to a non-loopback \
                 host: use an https tools.search_web.base_url",
                base.scheme()
            )));
        }
        Ok(key.expose())
    }
}

impl Tool for SearchWeb {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn preview(&self, call: ToolCall<'_>) -> Value {
        let query = call.parameters.get("query").and_then(Value::as_str);
        let num_results = call
            .parameters
            .get("num_results")
            .and_then(Value::as_u64)
            .unwrap_or(DEFAULT_NUM_RESULTS);
        let provider = self.config.provider;
        let base = match (provider, self.config.base_url.as_deref()) {
            (_, Some(configured)) => Some(configured.to_string()),
            (SearchProvider::Searxng, None) => None,
            (SearchProvider::DuckDuckGo, None) => Some(duckduckgo::DEFAULT_BASE_URL.to_string()),
            (SearchProvider::Brave, None) => Some(brave::DEFAULT_BASE_URL.to_string()),
            (SearchProvider::Tavily, None) => Some(tavily::DEFAULT_BASE_URL.to_string()),
        };
        json!({
            "description": match &base {
                Some(base) => format!(
                    "would ask {} at {base} for {num_results} results; read-only, nothing is changed",
                    provider.as_str()
                ),
                None => "would fail: tools.search_web.base_url is not set for searxng".to_string(),
            },
            "provider": provider.as_str(),
            "base_url": base,
            "query": query,
            "num_results": num_results,
            "api_key": self.config.api_key.as_ref().map(|k| format!("{} [redacted]", k.reference())),
        })
    }

    fn run<'a>(&'a self, call: ToolCall<'a>) -> ToolFuture<'a> {
        Box::pin(async move {
            // The schema has validated both; the fallbacks only keep this total.
            let query = call
                .parameters
                .get("query")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let num_results = call
                .parameters
                .get("num_results")
                .and_then(Value::as_u64)
                .unwrap_or(DEFAULT_NUM_RESULTS)
                .clamp(1, MAX_NUM_RESULTS) as usize;
            match self.search(query, num_results, call.deadline).await {
                Ok(hits) => Ok(output(hits)),
                Err(mut e) => {
                    e.message = self.redactor.redact(&e.message);
                    Err(e)
                }
            }
        })
    }
}

impl crate::tools::builtin::BuiltinTool for SearchWeb {
    type Raw = config::RawSearchWeb;
    type Config = SearchWebConfig;

    fn config(
        raw: Self::Raw,
        cx: &crate::config::table::TableContext,
    ) -> Result<SearchWebConfig, crate::config::table::ConfigError> {
        SearchWebConfig::from_raw(raw, cx)
    }

    fn describe(config: &SearchWebConfig) -> Value {
        config.describe()
    }

    fn policy(config: &SearchWebConfig) -> crate::tools::Policy {
        crate::tools::Policy {
            enabled: config.enabled,
            timeout: config.timeout,
            rate_limit: config.rate_limit,
            approval: None,
        }
    }

    fn build(
        config: &SearchWebConfig,
        http: reqwest::Client,
    ) -> Result<SearchWeb, crate::tools::RegistryError> {
        Ok(SearchWeb::new(config, http))
    }
}

/// One search result as the note shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct SearchHit {
    pub title: String,
    pub url: String,
    pub snippet: String,
}

/// Everything a provider needs for one search.
pub(crate) struct SearchRequest<'a> {
    pub http: &'a reqwest::Client,
    /// The provider's base URL without a trailing slash (it may carry a path prefix).
    pub base: &'a str,
    pub query: &'a str,
    pub num_results: usize,
    /// Retries and paging stop before it.
    pub deadline: Instant,
}

impl SearchRequest<'_> {
    /// `{base}{path}`; `path` starts with `/`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

fn output(hits: Vec<SearchHit>) -> ToolOutput {
    let summary = match hits.len() {
        1 => "1 result".to_string(),
        n => format!("{n} results"),
    };
    ToolOutput {
        data: json!({ "results": hits }),
        summary,
        undo: None,
    }
}

fn not_configured(message: impl Into<String>) -> CallError {
    CallError::new(ErrorCode::NotConfigured, message).retryable(false)
}

/// A configured base URL must be an absolute http(s) URL. The URL itself is not quoted: it
/// may carry credentials (`https://user:pass@host`).
fn parse_base_url(configured: &str) -> Result<Url, CallError> {
    match Url::parse(configured.trim()) {
        Ok(url) if matches!(url.scheme(), "http" | "https") && url.has_host() => Ok(url),
        Ok(_) => Err(not_configured(
            "tools.search_web.base_url must be an http:// or https:// URL",
        )),
        Err(e) => Err(not_configured(format!(
            "tools.search_web.base_url is not a valid URL ({e})"
        ))),
    }
}

fn parse_default(url: &str) -> Url {
    Url::parse(url).expect("built-in default base URLs are valid")
}

fn is_loopback(url: &Url) -> bool {
    url.host_str()
        .is_some_and(crate::tools::http::is_loopback_host)
}

/// Markup-free text of an HTML fragment: tags removed (`<br>`, `<p>` and `<div>` become a
/// space), entities decoded, whitespace collapsed.
pub(crate) fn html_to_text(fragment: &str) -> String {
    let mut text = String::with_capacity(fragment.len());
    let mut rest = fragment;
    while let Some(open) = rest.find('<') {
        text.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let is_tag = after
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '/' || c == '!');
        match after.find('>').filter(|_| is_tag) {
            Some(close) => {
                let name: String = after
                    .trim_start_matches('/')
                    .chars()
                    .take_while(char::is_ascii_alphanumeric)
                    .collect::<String>()
                    .to_ascii_lowercase();
                if matches!(name.as_str(), "br" | "p" | "div" | "li" | "td") {
                    text.push(' ');
                }
                rest = &after[close + 1..];
            }
            None => {
                text.push('<');
                rest = after;
            }
        }
    }
    text.push_str(rest);
    collapse_whitespace(&decode_entities(&text))
}

/// Decodes `&amp; &lt; &gt; &quot; &apos; &nbsp;`, a few typographic names and numeric
/// references in one pass (so
/// `&amp;lt;` stays `&lt;`); anything else is kept as written.
pub(crate) fn decode_entities(s: &str) -> Cow<'_, str> {
    if !s.contains('&') {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        let after = &rest[amp + 1..];
        let decoded = after
            .find(';')
            .filter(|&semi| semi <= 10)
            .and_then(|semi| entity(&after[..semi]).map(|c| (c, semi)));
        match decoded {
            Some((c, semi)) => {
                out.push(c);
                rest = &after[semi + 1..];
            }
            None => {
                out.push('&');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    Cow::Owned(out)
}

fn entity(name: &str) -> Option<char> {
    match name {
        "amp" => Some('&'),
        "lt" => Some('<'),
        "gt" => Some('>'),
        "quot" => Some('"'),
        "apos" => Some('\''),
        "nbsp" => Some(' '),
        // Common in titles and snippets; the full HTML table is not worth carrying.
        "mdash" => Some('—'),
        "ndash" => Some('–'),
        "hellip" => Some('…'),
        "lsquo" => Some('‘'),
        "rsquo" => Some('’'),
        "ldquo" => Some('“'),
        "rdquo" => Some('”'),
        "laquo" => Some('«'),
        "raquo" => Some('»'),
        "middot" => Some('·'),
        "copy" => Some('©'),
        "reg" => Some('®'),
        "trade" => Some('™'),
        _ => {
            let number = name.strip_prefix('#')?;
            let code = match number.strip_prefix(['x', 'X']) {
                Some(hex) => u32::from_str_radix(hex, 16).ok()?,
                None => number.parse().ok()?,
            };
            char::from_u32(code).filter(|c| *c != '\0')
        }
    }
}

pub(crate) fn collapse_whitespace(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
pub(crate) mod test_support {
    //! Short builders for the provider tests: a config, a client, and one call.

    use super::*;
    use crate::config::table::RateLimit;
    use crate::secret::Secret;
    use std::time::Duration;

    pub const KEY: &str = "test-key-0123456789";

    pub fn config(
        provider: SearchProvider,
        base_url: Option<&str>,
        api_key: Option<&str>,
    ) -> SearchWebConfig {
        SearchWebConfig {
            enabled: true,
            provider,
            base_url: base_url.map(str::to_string),
            api_key: api_key.map(|k| Secret::literal("env:SEARCH_KEY", k)),
            timeout: Duration::from_secs(30),
            rate_limit: RateLimit {
                per_hour: None,
                per_day: None,
            },
        }
    }

    pub fn tool(provider: SearchProvider, base_url: Option<&str>, key: Option<&str>) -> SearchWeb {
        let http = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("a plain client builds");
        SearchWeb::new(&config(provider, base_url, key), http)
    }

    /// Runs one call with `parameters` and a deadline `within` from now.
    pub async fn run(
        tool: &SearchWeb,
        parameters: Value,
        within: Duration,
    ) -> Result<ToolOutput, CallError> {
        let parameters = parameters
            .as_object()
            .expect("test parameters are an object")
            .clone();
        tool.run(ToolCall {
            note: "Needs_Action/test.md",
            note_id: "n-000000000001",
            call_id: "c-test",
            parameters: &parameters,
            deadline: Instant::now() + within,
            answer: None,
        })
        .await
    }

    /// Runs `{"query": query, "num_results": n}` with a 10 s deadline.
    pub async fn run_search(
        tool: &SearchWeb,
        query: &str,
        n: u64,
    ) -> Result<ToolOutput, CallError> {
        run(
            tool,
            json!({ "query": query, "num_results": n }),
            Duration::from_secs(10),
        )
        .await
    }

    /// The `(title, url, snippet)` triples of an output, for compact assertions.
    pub fn hits(output: &ToolOutput) -> Vec<(String, String, String)> {
        output.data["results"]
            .as_array()
            .expect("results is an array")
            .iter()
            .map(|r| {
                (
                    r["title"].as_str().expect("title").to_string(),
                    r["url"].as_str().expect("url").to_string(),
                    r["snippet"].as_str().expect("snippet").to_string(),
                )
            })
            .collect()
    }

    /// A loopback port nothing listens on.
    pub fn closed_port() -> u16 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
        listener.local_addr().expect("bound address").port()
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;
    use std::time::Duration;

    #[test]
    fn decodes_the_basic_entities_once() {
        assert_eq!(
            decode_entities("a &amp; b &lt;c&gt; &quot;d&quot; &#39;e&#39; &apos;"),
            "a & b <c> \"d\" 'e' '"
        );
        assert_eq!(decode_entities("&amp;lt;"), "&lt;");
        assert_eq!(decode_entities("&#x2014;&#8212;&nbsp;x"), "—— x");
    }

    #[test]
    fn keeps_what_is_not_an_entity() {
        assert_eq!(decode_entities("AT&T; a & b"), "AT&T; a & b");
        assert_eq!(
            decode_entities("&bogus; &#xZZ; &#0; &"),
            "&bogus; &#xZZ; &#0; &"
        );
        assert_eq!(decode_entities("Fish &amp"), "Fish &amp");
    }

    #[test]
    fn html_to_text_strips_tags_and_collapses_whitespace() {
        assert_eq!(
            html_to_text("  A <b>bold</b>\n and <a href=\"x?a=1&amp;b\">linked</a>  claim "),
            "A bold and linked claim"
        );
        assert_eq!(html_to_text("one<br>two<br/>three"), "one two three");
        assert_eq!(html_to_text("x &lt;b&gt; y"), "x <b> y");
        assert_eq!(html_to_text("1 < 2 and 3 > 2"), "1 < 2 and 3 > 2");
        assert_eq!(html_to_text("unclosed <b"), "unclosed <b");
    }

    #[tokio::test]
    async fn searxng_needs_a_base_url() {
        let tool = tool(SearchProvider::Searxng, None, None);
        let e = run_search(&tool, "rust", 5).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::NotConfigured);
        assert!(!e.retryable);
        assert!(
            e.message
                .contains("set tools.search_web.base_url to your SearXNG instance"),
            "{}",
            e.message
        );
    }

    #[tokio::test]
    async fn brave_and_tavily_need_a_key() {
        for (provider, name) in [
            (SearchProvider::Brave, "brave"),
            (SearchProvider::Tavily, "tavily"),
        ] {
            let tool = tool(provider, Some("http://127.0.0.1:9"), None);
            let e = run_search(&tool, "rust", 5).await.unwrap_err();
            assert_eq!(e.code, ErrorCode::NotConfigured, "{name}");
            assert!(
                e.message.contains("tools.search_web.api_key"),
                "{}",
                e.message
            );
            assert!(e.message.contains(name), "{}", e.message);
        }
    }

    #[tokio::test]
    async fn keys_are_never_sent_in_clear_text_to_another_host() {
        let tool = tool(
            SearchProvider::Brave,
            Some("http://search.example.org"),
            Some(KEY),
        );
        let e = run_search(&tool, "rust", 5).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::NotConfigured);
        assert!(e.message.contains("plain http"), "{}", e.message);
        assert!(!e.message.contains(KEY));
    }

    #[tokio::test]
    async fn a_malformed_base_url_is_not_configured_and_not_quoted() {
        for bad in [
            "not a url",
            "ftp://user:hunter2@host/",
            "mailto:x@example.org",
        ] {
            let tool = tool(SearchProvider::Searxng, Some(bad), None);
            let e = run_search(&tool, "rust", 5).await.unwrap_err();
            assert_eq!(e.code, ErrorCode::NotConfigured, "{bad}");
            assert!(!e.message.contains("hunter2"), "{}", e.message);
        }
    }

    #[tokio::test]
    async fn a_closed_port_is_a_retryable_execution_error() {
        // Attempts at 0, 0.2, 0.6 and 1.4 s; the next would start at 3 s, past the deadline, so
        // the call gives up at about 1.4 s with the last error: 1.5 s of slack on a loaded
        // machine (with 2 s, one slow attempt made it a TIMEOUT).
        const DEADLINE: Duration = Duration::from_millis(2900);
        let base = format!("http://127.0.0.1:{}", closed_port());
        let tool = tool(SearchProvider::Searxng, Some(&base), None);
        let started = Instant::now();
        let e = run(&tool, json!({ "query": "rust" }), DEADLINE)
            .await
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::ExecutionError, "{}", e.message);
        assert!(e.retryable);
        assert!(e.message.contains("could not be reached"), "{}", e.message);
        assert!(started.elapsed() < DEADLINE);
    }

    #[test]
    fn summary_counts_results() {
        let hit = SearchHit {
            title: "t".into(),
            url: "https://example.org/".into(),
            snippet: String::new(),
        };
        assert_eq!(output(vec![]).summary, "0 results");
        assert_eq!(output(vec![hit.clone()]).summary, "1 result");
        let out = output(vec![hit.clone(), hit]);
        assert_eq!(out.summary, "2 results");
        assert_eq!(out.data["results"][0]["url"], "https://example.org/");
    }
}
