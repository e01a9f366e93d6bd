//! Pure: note text -> the tool calls it holds (with ids, lines, byte spans), the results and
//! approval notices already written, and the frontmatter span. Parsed with pulldown-cmark.

use crate::call::CallError;
use serde_json::{Map, Value};
use std::ops::Range;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineEnding {
    Lf,
    CrLf,
}

impl LineEnding {
    pub fn as_str(self) -> &'static str {
        match self {
            LineEnding::Lf => "\n",
            LineEnding::CrLf => "\r\n",
        }
    }
}

/// One `json` fenced block that is (or tried to be) a tool call.
#[derive(Debug, Clone, PartialEq)]
pub struct CallBlock {
    /// Explicit `id`, or `c-` + 12 hex of SHA-256 of the canonical JSON; `-n` for the n-th duplicate.
    pub call_id: String,
    /// The tool name when one could be read (for broken blocks: None).
    pub name: Option<String>,
    /// 1-based line of the opening fence in the file (frontmatter included).
    pub line: usize,
    /// Byte span of the block in the text (opening fence to end of closing fence).
    pub span: Range<usize>,
    pub body: CallBody,
}

#[derive(Debug, Clone, PartialEq)]
pub enum CallBody {
    /// Well-formed: name and parameters (absent parameters = `{}`). Not yet schema-checked.
    Call {
        name: String,
        parameters: Map<String, Value>,
    },
    /// INVALID_JSON or INVALID_CALL, ready to be written as the result.
    Broken(CallError),
}

/// A `tool_result` already in the note.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultRef {
    pub call_id: String,
    pub ok: bool,
}

/// The parse of one note.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedNote {
    /// The text starts with a UTF-8 BOM (kept on write).
    pub bom: bool,
    /// The note's line ending (of its first line break; LF when it has none).
    pub line_ending: LineEnding,
    /// Byte span of the YAML frontmatter, from the opening `---` to the end of the closing
    /// `---` line including its line break; None when the note has none.
    pub frontmatter: Option<Range<usize>>,
    /// Every call block outside blockquotes, in document order.
    pub calls: Vec<CallBlock>,
    /// Every `tool_result` block (inside callouts), in document order.
    pub results: Vec<ResultRef>,
    /// Call ids with a `[!question]` approval notice (`tool_approval` block) in the note.
    pub held: Vec<String>,
}

impl ParsedNote {
    /// Calls with no result block: the ones to run.
    pub fn pending_calls(&self) -> impl Iterator<Item = &CallBlock> {
        self.calls
            .iter()
            .filter(|c| !self.results.iter().any(|r| r.call_id == c.call_id))
    }

    pub fn has_result(&self, call_id: &str) -> bool {
        self.results.iter().any(|r| r.call_id == call_id)
    }

    pub fn is_held(&self, call_id: &str) -> bool {
        self.held.iter().any(|h| h == call_id)
    }
}

/// Parses a note. Never fails: broken calls are `CallBody::Broken`.
pub fn parse_note(_text: &str) -> ParsedNote {
    todo!("parser")
}

/// `c-` + the first 12 hex digits of SHA-256 over `bytes`.
pub fn hash_id(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(bytes);
    let mut s = String::with_capacity(14);
    s.push_str("c-");
    for b in &digest[..6] {
        s.push_str(&format!("{b:02x}"));
    }
    s
}
