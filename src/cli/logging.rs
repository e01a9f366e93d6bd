//! The daemon's log on stderr: every line redacted of secrets and stripped of control
//! characters (docs/design.md §8.12).

use super::{LogFormat, escape_controls};
use crate::config::Config;
use crate::daemon;
use crate::secret::Redactor;
use std::io::Write;
use std::sync::Arc;

/// Logs go to stderr through the redactor: plain lines without colours or timestamps under
/// systemd's journal, colours on a terminal, JSON with `--log-format json`.
pub fn init_tracing(redactor: Arc<Redactor>, format: LogFormat) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    // rmcp logs every session's start at INFO with a dump of the peer's whole description;
    // vaultd says what matters in one line of its own ("MCP server is up: NAME VERSION, …").
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,rmcp=warn"));
    let under_journal = std::env::var_os("JOURNAL_STREAM").is_some();
    let ansi = std::io::stderr().is_terminal() && !under_journal;
    let writer = RedactingStderr(redactor, ansi);
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(ansi)
        .with_target(false);
    let _ = match (format, under_journal) {
        (LogFormat::Json, _) => builder.json().try_init(),
        (LogFormat::Text, true) => builder.without_time().try_init(),
        (LogFormat::Text, false) => builder.try_init(),
    };
}

/// A stderr writer that passes every log line through the redactor and escapes control
/// characters (a note named with a line break must not forge a log line). The second field
/// says whether the line carries our own colour codes (ESC is then kept).
#[derive(Clone)]
struct RedactingStderr(Arc<Redactor>, bool);

struct RedactingLine(Arc<Redactor>, bool);

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for RedactingStderr {
    type Writer = RedactingLine;
    fn make_writer(&'a self) -> RedactingLine {
        RedactingLine(self.0.clone(), self.1)
    }
}

/// One formatted log line with every control character inside it escaped; its final line
/// break stays.
pub(super) fn escape_log_line(line: &str, keep_esc: bool) -> String {
    let (body, end) = match line.strip_suffix('\n') {
        Some(b) => (b, "\n"),
        None => (line, ""),
    };
    if !body
        .chars()
        .any(|c| c.is_control() && c != '\t' && !(keep_esc && c == '\u{1b}'))
    {
        return line.to_string();
    }
    let mut out = String::with_capacity(line.len() + 8);
    for c in body.chars() {
        match c {
            '\t' => out.push(c),
            '\u{1b}' if keep_esc => out.push(c),
            c if c.is_control() => out.push_str(&escape_controls(&c.to_string())),
            c => out.push(c),
        }
    }
    out.push_str(end);
    out
}

impl Write for RedactingLine {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let line = escape_log_line(&self.0.redact(&text), self.1);
        std::io::stderr().write_all(line.as_bytes())?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// What a one-shot command logs: warnings only (a journal adopted into the vault's own state
/// folder, a runner id that could not be copied), through the config's redactor, without
/// timestamps. Before, such commands had no logger and said nothing of what they changed.
pub(super) fn init_warnings(config: &Config) {
    let writer = RedactingStderr(Arc::new(daemon::redactor_for(config)), false);
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("warn,rmcp=error"))
        .with_writer(writer)
        .with_ansi(false)
        .with_target(false)
        .without_time()
        .try_init();
}
