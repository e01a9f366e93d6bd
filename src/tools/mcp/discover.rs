//! Which lifecycle a stdio MCP server speaks, asked before rmcp takes the connection
//! (docs/design.md §10.4): vaultd sends `server/discover` (2026-07-28) itself, waits for the
//! answer to that one request, and only then hands the pipes to rmcp with the lifecycle the
//! answer calls for.
//!
//! Why not rmcp's `ClientLifecycleMode::Auto` over stdio: Auto waits a fixed 10 s for the
//! discovery answer, then sends `initialize` on the same pipe. A server that is merely slow to
//! start (node or Python beside builds, six servers starting at once on two cores: 10.5 s was
//! measured) answers discovery after that, and rmcp takes the late answer as the answer to
//! `initialize`: the TypeScript SDK servers' `-32601 Method not found` (id 0) became
//! "uncorrelated error response: expected id 1, error response carried 0", the Python SDK
//! servers' discovery result (they speak 2026-07-28) "conflict initialized response id". Run
//! by hand, all of them answer `server/discover` at once and correlated: nothing there needs a
//! guess, only enough patience. So here the wait is not a guess about the era:
//!
//! - a discovery result (`supportedVersions`) or a 2026-era refusal (-32020/-32021/-32022):
//!   the server speaks discovery; rmcp opens the session with `server/discover` (one more
//!   round trip, at once, as the server is running) and reports any version mismatch;
//! - any other JSON-RPC error, with our id or none (JSON-RPC lets a server that could not read
//!   the id answer `null`): a 2025-era server that does not know the method, which leaves it
//!   in its state from before the handshake; rmcp sends `initialize` at 2025-11-25 on the same
//!   pipe, and no answer to discovery is left outstanding to be mistaken for it;
//! - a result that is not a discovery result (some servers answer every method they do not
//!   know with `{}`), or no answer at all within [`probe_wait`] (a server that drops requests
//!   it does not know before `initialize`): the process is stopped and a fresh one gets
//!   `initialize` only, so no late answer can cross the handshake.

use rmcp::model::{
    ClientConfig, ClientJsonRpcMessage, ClientRequest, DiscoverRequest, DiscoverRequestParams,
    ErrorCode, ProtocolVersion, RequestId, RequestMetaObject,
};
use serde_json::Value;
use std::time::Duration;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The id of the probe: a string, so that no id rmcp numbers its own requests with (0, 1, …)
/// is used twice in the session (MCP forbids reusing a request id).
const PROBE_ID: &str = "vaultd-discover";
/// The longest line read while waiting for the answer (a server cannot make vaultd buffer
/// without end).
const MAX_LINE: u64 = 16 * 1024 * 1024;

/// What the answer to the probe says about the server.
#[derive(Debug, PartialEq, Eq)]
pub enum Era {
    /// It speaks `server/discover`: open the session with discovery, on this connection.
    Discover,
    /// A 2025-era server that refused the unknown method: `initialize`, on this connection.
    /// The error's code and message, for the log.
    Initialize(i64, String),
    /// Start a fresh process and use `initialize` only; why, for the log.
    Fresh(String),
}

/// How long to wait for the answer to discovery before taking the server for one that drops
/// methods it does not know: half its start_timeout, so a fresh start with `initialize` has
/// the other half. A server slow to answer anything is slow to answer discovery too; it gets
/// as long as the budget allows rather than a fixed guess.
pub fn probe_wait(start_timeout: Duration) -> Duration {
    start_timeout / 2
}

/// Sends `server/discover` and reads until its answer (lines that are not it, such as a log
/// notification or a ping, are passed over: nothing is answered before the handshake).
/// `Err` when the pipe fails or the server closes it.
pub async fn probe<R, W>(
    reader: &mut R,
    writer: &mut W,
    info: &ClientConfig,
    version: ProtocolVersion,
    wait: Duration,
) -> Result<Era, String>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let meta = RequestMetaObject::with_client_context(
        version,
        info.client_info.clone(),
        info.capabilities.clone(),
    );
    let mut discover = DiscoverRequest::new(DiscoverRequestParams {});
    discover.extensions.insert(meta);
    let request = ClientJsonRpcMessage::request(
        ClientRequest::DiscoverRequest(discover),
        RequestId::String(PROBE_ID.into()),
    );
    let mut line = serde_json::to_vec(&request).expect("a request serializes");
    line.push(b'\n');
    writer
        .write_all(&line)
        .await
        .map_err(|e| format!("cannot write server/discover to the server: {e}"))?;
    writer
        .flush()
        .await
        .map_err(|e| format!("cannot write server/discover to the server: {e}"))?;
    match tokio::time::timeout(wait, answer(reader)).await {
        Ok(answer) => answer.map(classify),
        Err(_) => Ok(Era::Fresh(format!(
            "no answer to server/discover within {} (some servers drop requests they do not know before initialize)",
            humantime::format_duration(wait)
        ))),
    }
}

/// Reads lines until the answer to the probe.
async fn answer<R: AsyncBufRead + Unpin>(reader: &mut R) -> Result<Value, String> {
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let n = (&mut *reader)
            .take(MAX_LINE)
            .read_until(b'\n', &mut buf)
            .await
            .map_err(|e| format!("cannot read the server's answer to server/discover: {e}"))?;
        if n == 0 {
            return Err("the server closed its stdout before it answered server/discover".into());
        }
        if buf.len() as u64 >= MAX_LINE && buf.last() != Some(&b'\n') {
            return Err(format!(
                "the server's answer to server/discover is longer than {MAX_LINE} bytes"
            ));
        }
        let Ok(message) = serde_json::from_slice::<Value>(&buf) else {
            tracing::debug!("MCP server wrote a line that is not JSON before the handshake");
            continue;
        };
        let is_answer = message.get("result").is_some() || message.get("error").is_some();
        let id = message.get("id").unwrap_or(&Value::Null);
        let ours = id.as_str() == Some(PROBE_ID)
            // JSON-RPC: an error about a request whose id could not be read carries null;
            // ours is the only request outstanding.
            || (id.is_null() && message.get("error").is_some());
        if is_answer && ours {
            return Ok(message);
        }
        tracing::debug!("MCP server sent something other than the answer to server/discover");
    }
}

fn classify(message: Value) -> Era {
    if let Some(result) = message.get("result") {
        if result.get("supportedVersions").is_some_and(Value::is_array) {
            return Era::Discover;
        }
        return Era::Fresh(
            "it answered server/discover with a result that is not a discovery result (some servers answer every method they do not know with {})".into(),
        );
    }
    let error = message.get("error").unwrap_or(&Value::Null);
    let code = error.get("code").and_then(Value::as_i64).unwrap_or(0);
    let modern = [
        ErrorCode::UNSUPPORTED_PROTOCOL_VERSION,
        ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY,
        ErrorCode::HEADER_MISMATCH,
    ];
    if modern.iter().any(|c| i64::from(c.0) == code) {
        // A 2026-era refusal: rmcp's discovery negotiates the version or reports the error.
        return Era::Discover;
    }
    let text = error
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("")
        .chars()
        .take(200)
        .collect();
    Era::Initialize(code, text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn answers_are_classified_by_what_they_say_about_the_server() {
        let r = classify;
        assert_eq!(
            r(json!({"jsonrpc":"2.0","id":0,"result":{"supportedVersions":["2026-07-28"]}})),
            Era::Discover
        );
        assert_eq!(
            r(json!({"jsonrpc":"2.0","id":0,"error":{"code":-32022,"message":"no"}})),
            Era::Discover
        );
        assert_eq!(
            r(json!({"jsonrpc":"2.0","id":0,"error":{"code":-32601,"message":"Method not found"}})),
            Era::Initialize(-32601, "Method not found".into())
        );
        assert!(matches!(
            r(json!({"jsonrpc":"2.0","id":0,"result":{}})),
            Era::Fresh(_)
        ));
    }

    #[tokio::test]
    async fn the_answer_is_found_past_other_lines_and_a_null_id_error_counts() {
        let info = ClientConfig::default();
        let input = b"banner\n{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{}}\n{\"jsonrpc\":\"2.0\",\"id\":0,\"result\":{}}\n{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32600,\"message\":\"Invalid Request\"}}\n";
        let mut reader = &input[..];
        let mut sent = Vec::new();
        let era = probe(
            &mut reader,
            &mut sent,
            &info,
            ProtocolVersion::V_2026_07_28,
            Duration::from_secs(5),
        )
        .await
        .expect("answered");
        assert_eq!(era, Era::Initialize(-32600, "Invalid Request".into()));
        let sent: Value = serde_json::from_slice(&sent).expect("one JSON line");
        assert_eq!(sent["method"], "server/discover");
        assert_eq!(sent["id"], PROBE_ID);
        assert_eq!(
            sent["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"],
            "2026-07-28"
        );
        let mut closed = &b""[..];
        let err = probe(
            &mut closed,
            &mut Vec::new(),
            &info,
            ProtocolVersion::V_2026_07_28,
            Duration::from_secs(5),
        )
        .await
        .expect_err("closed");
        assert!(err.contains("closed its stdout"), "{err}");
    }
}
