//! Pure: results and approval notices -> callout text, appended to a note; the four
//! frontmatter properties set without touching any other line.

use crate::call::{CallResult, HeldCall};
use std::time::SystemTime;

/// One block vaultd appends to a note.
#[derive(Debug, Clone, Copy)]
pub enum Block<'a> {
    /// `> [!success]-` / `> [!failure]-` with a `tool_result` JSON.
    Result(&'a CallResult),
    /// `> [!question]` with a `tool_approval` JSON: what will run and why it is held.
    Held(&'a HeldCall),
}

/// Appends `blocks` to `text` (DESIGN §3, §8.11) and sets `tool_status` to `status`,
/// `tool_calls`/`tool_errors` counted from the result blocks of the new text, and
/// `tool_updated` to `now`.
pub fn append_blocks(
    _text: &str,
    _blocks: &[Block<'_>],
    _status: &str,
    _now: SystemTime,
) -> String {
    todo!("render")
}
