//! Everything about one markdown note: finding its tool calls and results (`parse`), reading
//! and editing its frontmatter properties (`frontmatter`, the only place that does),
//! rendering result callouts and vaultd's own properties (`render`), and the one atomic write
//! (`write`). `parse`, `frontmatter` and `render` are pure: `&str` in, values out.

pub mod frontmatter;
pub mod parse;
pub mod render;
pub mod text;
pub mod write;

#[cfg(test)]
mod proptests;

pub use frontmatter::frontmatter_property;
pub use parse::{
    CallBlock, CallBody, HeldRef, LineEnding, NOTHING_PENDING, ParsedNote, json_block_contents,
    params_hash, parse_note, question_hash,
};
pub use render::{Block, append_and_set, append_blocks, set_note_id, set_runner, stamp_claim};
pub use write::{
    TempFile, WriteError, read_settled, restore_note, update_note, update_note_beneath,
    update_note_settling, update_note_unsynced, update_note_when_ready,
};
