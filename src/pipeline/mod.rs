//! The pipeline of one claimed note: decide what each pending call gets ([`plan`], pure),
//! run what may run ([`execute`]), write the results back and move the note on ([`next_state`]). A note in
//! Dry_Run/ gets previews instead ([`preview`]).

pub mod execute;
pub mod next_state;
pub mod plan;
pub mod preview;
