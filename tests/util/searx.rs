//! A SearXNG-format search server on 127.0.0.1 that speaks the real JSON API
//! (`GET /search?q=…&format=json&pageno=N`), with a configurable delay, and counts what it
//! sees: requests, queries, and the most requests in flight at once.
//! Shared by the integration tests and the load generator.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

#[derive(Default)]
struct Counters {
    requests: AtomicUsize,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    queries: Mutex<Vec<String>>,
    /// Summed time from a request's last header line to its response written, in µs.
    busy_us: std::sync::atomic::AtomicU64,
    /// When the first request was read and the last response written.
    span: Mutex<Option<(Instant, Instant)>>,
}

/// What the server answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Three results per page, titles derived from the query.
    Results,
    /// HTTP 500 every time.
    ServerError,
    /// 200 with an HTML page instead of JSON.
    Garbage,
}

pub struct SearxServer {
    pub addr: SocketAddr,
    counters: Arc<Counters>,
    delay: Arc<Mutex<Duration>>,
    answer: Arc<Mutex<Answer>>,
    _task: tokio::task::JoinHandle<()>,
}

impl SearxServer {
    pub async fn start(delay: Duration) -> SearxServer {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1");
        let addr = listener.local_addr().expect("local addr");
        let counters = Arc::new(Counters::default());
        let delay = Arc::new(Mutex::new(delay));
        let answer = Arc::new(Mutex::new(Answer::Results));
        let (c, d, a) = (counters.clone(), delay.clone(), answer.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (c, d, a) = (c.clone(), d.clone(), a.clone());
                tokio::spawn(async move {
                    let _ = serve_connection(stream, c, d, a).await;
                });
            }
        });
        SearxServer {
            addr,
            counters,
            delay,
            answer,
            _task: task,
        }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set_answer(&self, answer: Answer) {
        *self.answer.lock().unwrap() = answer;
    }

    pub fn set_delay(&self, delay: Duration) {
        *self.delay.lock().unwrap() = delay;
    }

    pub fn requests(&self) -> usize {
        self.counters.requests.load(Ordering::SeqCst)
    }

    pub fn max_in_flight(&self) -> usize {
        self.counters.max_in_flight.load(Ordering::SeqCst)
    }

    /// The server's own time on the requests so far (delay included), summed.
    pub fn busy(&self) -> Duration {
        Duration::from_micros(self.counters.busy_us.load(Ordering::SeqCst))
    }

    /// When the first request arrived and the last response was written (None before any).
    pub fn span(&self) -> Option<(Instant, Instant)> {
        *self.counters.span.lock().unwrap()
    }

    pub fn queries(&self) -> Vec<String> {
        self.counters.queries.lock().unwrap().clone()
    }
}

async fn serve_connection(
    stream: tokio::net::TcpStream,
    c: Arc<Counters>,
    delay: Arc<Mutex<Duration>>,
    answer: Arc<Mutex<Answer>>,
) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).await? == 0 {
            return Ok(());
        }
        let mut content_length = 0usize;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).await? == 0 {
                return Ok(());
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some(v) = l.to_ascii_lowercase().strip_prefix("content-length:") {
                content_length = v.trim().parse().unwrap_or(0);
            }
        }
        if content_length > 0 {
            let mut body = vec![0u8; content_length];
            tokio::io::AsyncReadExt::read_exact(&mut reader, &mut body).await?;
        }
        let target = request_line
            .split_whitespace()
            .nth(1)
            .unwrap_or("/")
            .to_string();
        let query = param(&target, "q").unwrap_or_default();
        let page: usize = param(&target, "pageno")
            .and_then(|p| p.parse().ok())
            .unwrap_or(1);

        let received = Instant::now();
        c.requests.fetch_add(1, Ordering::SeqCst);
        c.queries.lock().unwrap().push(query.clone());
        let now = c.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        c.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let d = *delay.lock().unwrap();
        if !d.is_zero() {
            precise_sleep(received + d).await;
        }
        c.in_flight.fetch_sub(1, Ordering::SeqCst);

        let a = *answer.lock().unwrap();
        let (status, ctype, body) = match a {
            Answer::Results => ("200 OK", "application/json", results_json(&query, page)),
            Answer::ServerError => (
                "500 Internal Server Error",
                "text/plain",
                "boom".to_string(),
            ),
            Answer::Garbage => (
                "200 OK",
                "text/html",
                "<html><body>Rate limited</body></html>".to_string(),
            ),
        };
        let response = format!(
            "HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        write.write_all(response.as_bytes()).await?;
        let done = Instant::now();
        c.busy_us
            .fetch_add((done - received).as_micros() as u64, Ordering::SeqCst);
        let mut span = c.span.lock().unwrap();
        *span = Some(span.map_or((received, done), |(first, last)| {
            (first.min(received), last.max(done))
        }));
    }
}

/// Sleeps until `until`, to within ~0.1 ms: tokio's timer wakes at the next whole millisecond
/// or later (a 100 ms `sleep` took ~101.1 ms here, which the cap bench counted against vaultd),
/// so it sleeps to 2 ms short and a blocking thread sleeps the rest.
async fn precise_sleep(until: Instant) {
    let coarse = until.checked_sub(Duration::from_millis(2));
    if let Some(coarse) = coarse.filter(|c| *c > Instant::now()) {
        tokio::time::sleep_until(coarse.into()).await;
    }
    let rest = until.saturating_duration_since(Instant::now());
    if !rest.is_zero() {
        let _ = tokio::task::spawn_blocking(move || std::thread::sleep(rest)).await;
    }
}

fn param(target: &str, key: &str) -> Option<String> {
    let query = target.split_once('?')?.1;
    for pair in query.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k == key {
            let v = v.replace('+', " ");
            return Some(
                percent_encoding::percent_decode_str(&v)
                    .decode_utf8_lossy()
                    .into_owned(),
            );
        }
    }
    None
}

fn results_json(query: &str, page: usize) -> String {
    let results: Vec<serde_json::Value> = (1..=3)
        .map(|i| {
            let n = (page - 1) * 3 + i;
            serde_json::json!({
                "url": format!("https://example.org/{n}"),
                "title": format!("{query} result {n}"),
                "content": format!("snippet {n} about {query}"),
                "engine": "brave",
                "engines": ["brave", "google"],
                "score": 1.0,
                "category": "general",
                "template": "default.html",
                "positions": [n],
                "publishedDate": null
            })
        })
        .collect();
    serde_json::json!({
        "query": query,
        "number_of_results": 0,
        "results": results,
        "answers": [],
        "corrections": [],
        "infoboxes": [],
        "suggestions": [],
        "unresponsive_engines": []
    })
    .to_string()
}
