//! The decisions of one claimed note's pipeline, pure: what each pending call gets
//! ([`plan`]), whether the note is stamped before its calls run and what a run's steps came to
//! ([`execute`]), what is written back and where the note goes next ([`next_state`]). The
//! daemon (`crate::daemon`) does them: claims, runs, writes and moves.

pub mod execute;
pub mod next_state;
pub mod plan;

/// What a note task is doing with a note.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pass {
    /// Claimed from Needs_Action.
    Fresh,
    /// Claimed from Approved: the held calls run.
    Approved,
    /// Found in In_Progress at start-up; `known` when the journal has its run.
    Recover { known: bool },
}
