//! The claim: a note with pending calls is renamed into In_Progress, given its identity
//! (`tool_note`, docs/design.md §9.2) and what the journal knows of its calls (§9.3, §9.6), then run.

use super::Daemon;
use crate::daemon::{DaemonError, Identity, NoteRun, Pass, StaleCopy};
use crate::journal::{Claim, JournalCall, RunId};
use crate::note::{self, ParsedNote, parse_note};
use crate::vault::{FileKey, LeftBehind, LinkError, State, VaultError};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::Poll;
use std::time::{Duration, SystemTime};

/// The paths a sync client's duplicate name of the note at `path` leads back to, in its
/// folder (`x 2.md`, `x (1).md`, `x-HOST.md`, …: [`crate::synced::duplicate_originals`]).
fn duplicate_paths(path: &Path) -> Vec<PathBuf> {
    let (Some(stem), Some(parent)) = (
        path.file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".md")),
        path.parent(),
    ) else {
        return Vec::new();
    };
    crate::synced::duplicate_originals(stem)
        .into_iter()
        .map(|original| parent.join(format!("{original}.md")))
        .collect()
}

/// A note as it was read and parsed before its claim: the claim reuses the parse when the
/// text it then reads is the same.
pub(crate) struct Looked {
    pub(crate) text: String,
    pub(crate) parsed: ParsedNote,
}

/// A claimed note's text as read at its claim, and the note as looked at before it.
pub(crate) struct Reads {
    pub(crate) claimed: Claimed,
    pub(crate) looked: Looked,
}

impl Daemon {
    /// Claims a note (rename into In_Progress) if it has pending calls, then runs it.
    pub(crate) async fn claim_and_run(
        self: &Arc<Self>,
        path: &Path,
        pass: Pass,
    ) -> Result<(), DaemonError> {
        loop {
            if self.arrivals.is_left_behind(path) {
                tracing::debug!(note = %self.vault.relative(path), "the name a claim left behind: not a new note");
                return Ok(()); // the first name of a note claimed by link, about to go
            }
            let Some((text, busy)) = self.read_note_noting_writer(path) else {
                tracing::debug!(note = %self.vault.relative(path), "gone, or not readable as a note");
                return Ok(());
            };
            let parsed = parse_note(&text);
            if parsed.nothing_pending() {
                self.explain_once(path, note::NOTHING_PENDING); // a finished note moved back
            }
            if parsed.pending_calls().next().is_none()
                || self.stopping.load(Ordering::SeqCst)
                || self.runners.is_paused()
            {
                return Ok(()); // waiting for the agent, not for us: left exactly as it is
            }
            if self.still_being_written(path, &text, &parsed, busy).await {
                return Ok(());
            }
            if pass == Pass::Approved
                && self.approval_via_cli()
                && !self.cli_approved_any(&parsed).await?
            {
                return Ok(()); // moved into Approved/ by hand: only `vaultd approve` counts
            }
            let mut ident = self.identify(path, &text, &parsed).await?;
            if let Some(of) = ident.wait_for.take() {
                if self.wait_for_original(path, &of, &parsed).await? {
                    continue;
                }
                return Ok(());
            }
            // A note whose calls still run here (it was moved back by hand mid-run, or is an
            // editor's copy of a note being claimed) waits for them: their outcomes are then
            // in the journal and are written, not run again (§9.3, §9.6).
            let copy_of = ident
                .stale
                .as_ref()
                .filter(|s| s.within_grace)
                .map(|s| s.of.note_id.clone());
            if let Some(busy) = copy_of.filter(|id| self.is_active(id)) {
                self.wait_inactive(&busy).await;
                continue;
            }
            if !self.activate(&ident.note_id) {
                self.wait_inactive(&ident.note_id).await;
                continue;
            }
            let note_id = ident.note_id.clone();
            let looked = Looked { text, parsed };
            let outcome = self.claim_identified(path, pass, &mut ident, looked).await;
            self.deactivate(&note_id);
            return outcome;
        }
    }

    /// THE claim: moves the note at `path` into In_Progress and returns where it is now. None
    /// when it is gone (moved away meanwhile) or cannot be moved (a read-only folder, say:
    /// reported once, the note stays where it is). Every claim of a note goes through here.
    /// The claim's move: by hard link for a note renamed in within the grace, else a rename.
    async fn move_or_link(
        self: &Arc<Self>,
        path: &Path,
    ) -> Result<(PathBuf, Option<LeftBehind>, Claimed), VaultError> {
        if let Some(keep) = self.arrivals.keep_first_name_for(path) {
            let (vault, p) = (self.vault.clone(), path.to_path_buf());
            let linked = self
                .on_this_thread(move || {
                    let (claimed, left) = vault.link_to(&p, State::InProgress)?;
                    // The link's folder mark among them: what the first name's drop waits for.
                    let marks = crate::files::folder_marks();
                    let read = note::read_settled(&claimed);
                    Ok((claimed, left, marks, read))
                })
                .await;
            match linked {
                Ok((claimed, left, marks, read)) => {
                    self.arrivals.hold(&left);
                    let (me, l) = (self.clone(), left.clone());
                    tokio::spawn(async move {
                        tokio::time::sleep(keep).await;
                        let _ = tokio::task::spawn_blocking(move || {
                            me.arrivals.drop_one_after(&me.vault, &l, marks)
                        })
                        .await;
                    });
                    return Ok((claimed, Some(left), read));
                }
                Err(LinkError::Unsupported) => tokio::time::sleep(keep).await,
                Err(LinkError::Vault(e)) => return Err(e),
            }
        }
        // Off the async workers: a vault on a hung network or FUSE mount must not block them
        // (and with them the shutdown, docs/design.md §9.15).
        let (vault, p) = (self.vault.clone(), path.to_path_buf());
        self.on_this_thread(move || {
            let claimed = vault.move_soon(&p, State::InProgress)?;
            let read = note::read_settled(&claimed);
            Ok((claimed, None, read))
        })
        .await
    }

    /// Moves a note into In_Progress. A note renamed in within `moved_in_grace` is claimed by
    /// hard link instead, its first name dropped when the grace is over (`arrivals.rs`); on a
    /// file system without hard links it waits out the grace, then is renamed.
    ///
    /// One file is claimed once, whatever names it has (docs/design.md §9.10): the file is marked
    /// before its move, and a claim of a file already marked (the name a link claim left
    /// behind, renamed since) is no claim. The mark stays while a link claim's first name
    /// does; a renamed note's is given up at once.
    pub(crate) async fn claim_note(
        self: &Arc<Self>,
        path: &Path,
    ) -> Option<(PathBuf, Option<LeftBehind>, Claimed)> {
        let key = path.symlink_metadata().ok().map(|m| FileKey::of(&m))?;
        if !self.arrivals.begin_claim(path, key) {
            tracing::info!(
                note = %self.vault.relative(path),
                "the name a claim left behind, renamed: the claimed note, not run again"
            );
            return None;
        }
        // Noted before the link or rename, so that its event finds it noted (`on_hint`).
        let target = self.vault.target(path, State::InProgress);
        if let Some(target) = &target {
            self.runners.wrote(target);
        }
        let moved = self.move_or_link(path).await;
        if let Some(target) = target
            && !matches!(&moved, Ok((claimed, _, _)) if *claimed == target)
        {
            self.look_again(target).await;
        }
        if !matches!(&moved, Ok((_, Some(_), _))) {
            self.arrivals.release(path, key);
        }
        match moved {
            Ok(p) => Some(p),
            Err(VaultError::Move { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                tracing::debug!(note = %self.vault.relative(path), "gone before its claim");
                None
            }
            Err(e) if self.pause_if_symlinked(&e) => None, // §9.13: the note stays where it is
            Err(e) => {
                self.problem_now(path, format!("cannot claim the note: {e}"));
                None
            }
        }
    }

    pub(crate) async fn claim_identified(
        self: &Arc<Self>,
        path: &Path,
        pass: Pass,
        ident: &mut Identity,
        looked: Looked,
    ) -> Result<(), DaemonError> {
        let Some((claimed, left, read)) = self.claim_note(path).await else {
            return Ok(());
        };
        self.runners.wrote(&claimed);
        // Marked before the run is recorded, so a rescan never resumes it as stranded.
        self.mark_inflight(&claimed);
        let _unwinding = super::intake::ForgetOnPanic::new(&self.inflight, &claimed);
        let from = self.vault.relative(path);
        let outcome = self
            .begin_and_execute(
                &claimed,
                &from,
                pass,
                ident,
                left.as_ref(),
                Reads {
                    claimed: read,
                    looked,
                },
            )
            .await;
        self.inflight
            .lock()
            .expect("inflight lock poisoned")
            .remove(&claimed);
        outcome
    }

    pub(crate) async fn begin_and_execute(
        self: &Arc<Self>,
        claimed: &Path,
        from: &str,
        pass: Pass,
        ident: &mut Identity,
        left: Option<&LeftBehind>,
        reads: Reads,
    ) -> Result<(), DaemonError> {
        let Reads {
            claimed: read,
            looked,
        } = reads;
        let note = self.vault.relative(claimed);
        let (id, from) = (ident.note_id.clone(), from.to_string());
        let copy_of = ident
            .stale
            .as_ref()
            .map(|s| (s.of.note_id.clone(), s.within_grace));
        let left_key = left.map(|l| l.file.encode());
        let copy_of = copy_of.as_ref().map(|(id, grace)| (id.as_str(), *grace));
        // The text as claimed, so a sync client's duplicate of it is known (§9.10).
        let sha = read
            .as_ref()
            .ok()
            .map(|bytes| crate::tools::vault::sha256_hex(bytes));
        // A note whose stamp is likely (a call that is not a known read_only tool's) has its
        // text kept with the claim record, in the same commit ("The stamp"), durable with the
        // next durable write (its first side effect's start, most often).
        let live = self.live();
        let text = read
            .as_ref()
            .ok()
            .and_then(|bytes| std::str::from_utf8(bytes).ok());
        // Parsed when it was looked at, unless it changed before its claim.
        let parsed = text.map(|text| match looked {
            Looked { text: seen, parsed } if seen == text => parsed,
            _ => parse_note(text),
        });
        let keep = text.filter(|_| {
            parsed.as_ref().is_some_and(|parsed| {
                crate::pipeline::execute::may_stamp_at_claim(parsed, &live.runner.registry)
            })
        });
        // A note alone commits what nobody waits to be durable without an fsync (its call's
        // outcome, say), however soon after another commit: none of the fsyncs that gather
        // the writes of many notes in one commit on its way to Done.
        self.journal.set_one_note(self.note_slots.one_note());
        // A note with only `read_only` calls may start them before its claim record has run
        // (`execute_while_claiming`): their starts name its run by this ticket.
        let ticket = keep.is_none().then(|| self.journal.claim_ticket());
        let (began, prepared) = {
            let mut began = std::pin::pin!(self.journal.begin_claim_async(
                &note,
                &id,
                &from,
                copy_of,
                left_key.as_deref(),
                sha.as_deref(),
                keep,
                ticket,
            ));
            // Polled once, the record is on its way to the journal's writer; the run's facts
            // and plan are made meanwhile (nothing of them is recorded under the run), and the
            // record is waited for before anything that is. Not for a record that keeps the
            // text (`keep`), waited for until it committed: its commit makes every write
            // queued before it readable, which the facts' count of the note's started calls
            // (§12.2) then includes.
            let sent = match keep {
                None => std::future::poll_fn(|cx| Poll::Ready(began.as_mut().poll(cx))).await,
                Some(_) => Poll::Ready(began.as_mut().await),
            };
            let prepared = text
                .zip(parsed)
                .map(|(text, parsed)| self.prepare(ident, pass, &live, text.to_owned(), parsed));
            match (sent, prepared, ticket) {
                (Poll::Ready(began), prepared, _) => (began, prepared),
                (Poll::Pending, Some(Ok(prepared)), Some(ticket))
                    if Daemon::starts_before_claim(&prepared, pass, &ident.note_id) =>
                {
                    return self
                        .execute_while_claiming(
                            claimed, &from, left, pass, ident, live, prepared, ticket, began,
                        )
                        .await;
                }
                (Poll::Pending, prepared, _) => (began.await, prepared),
            }
        };
        let text_kept = keep.is_some();
        let run = match began {
            Ok(run) => run,
            Err(e) => {
                // Nothing of the note started: it goes back to where it was claimed from, and
                // is claimed again once the journal takes writes (docs/design.md §9.12).
                self.unclaim(claimed, &from, left).await;
                return Err(e.into());
            }
        };
        tracing::debug!(note = %self.vault.relative(claimed), note_id = %ident.note_id, "claimed");
        let run = NoteRun {
            run,
            path: claimed.to_path_buf(),
            pass,
            ident: std::mem::take(ident),
            live,
            text_kept,
        };
        match prepared {
            Some(prepared) => self.execute_prepared(run, prepared?).await,
            None => self.execute(run, Some(read)).await, // not UTF-8: said so by `read_claimed`
        }
    }

    /// Undoes a claim the journal could not record (§9.12). A link claim's first name still
    /// holds the note: the In_Progress name goes, and the first name is kept (not dropped when
    /// the grace ends); a renamed note is moved back into the folder it came from.
    pub(crate) async fn unclaim(&self, claimed: &Path, from: &str, left: Option<&LeftBehind>) {
        if let Some(l) = left {
            self.arrivals.leave_first_name(l);
        }
        let vault = self.vault.clone();
        let (claimed_path, left) = (claimed.to_path_buf(), left.cloned());
        let back_to = self
            .vault
            .locate(&self.vault.root().join(from))
            .map_or(State::NeedsAction, |(state, _)| state);
        let back = tokio::task::spawn_blocking(move || match left {
            // Only while the first name still names the note: once the grace has dropped it,
            // the In_Progress name is the note's only name and is moved back instead.
            Some(l)
                if l.path
                    .symlink_metadata()
                    .is_ok_and(|m| FileKey::of(&m) == l.file) =>
            {
                vault
                    .drop_left_behind(&LeftBehind {
                        path: claimed_path,
                        file: l.file,
                    })
                    .map(|_| l.path)
            }
            _ => vault
                .move_to(&claimed_path, back_to)
                .map_err(|e| std::io::Error::other(e.to_string())),
        })
        .await
        .expect("unclaim task does not panic");
        match back {
            Ok(to) => tracing::warn!(
                note = %self.vault.relative(&to),
                "the journal cannot record the claim: the note is back where it was and waits"
            ),
            Err(e) => tracing::error!(
                note = %self.vault.relative(claimed),
                "the journal cannot record the claim and the note cannot go back ({e}); it waits in In_Progress"
            ),
        }
    }

    /// Stamps a claimed note with `tool_note` (docs/design.md §9.2), `tool_runner` and `tool_updated`
    /// (§9.9, `tool_updated` being `at`), before any of its side effects runs. `Gone` when the
    /// note is gone (the caller abandons the run, or its calls do not run). Any other failure
    /// is logged: the results write adds them later. A note whose calls are all fresh
    /// `read_only` runs is not stamped here: its results write adds the three properties (see
    /// `stamp_at_claim` in `pipeline/execute.rs`).
    ///
    /// With `stamp` other than [`Stamp::Durable`], the stamp is written without an fsync of
    /// its own once the note's text as claimed is durable with the run (kept now, made durable
    /// now with the claim record, or already): recovery puts the text back if a crash leaves
    /// the note damaged (`journal/mod.rs`, "The stamp").
    pub(crate) async fn write_identity(
        &self,
        run: RunId,
        path: &Path,
        note_id: &str,
        stamp: Stamp<'_>,
        at: SystemTime,
    ) -> Result<IdentityWrite, DaemonError> {
        let (p, id) = (path.to_path_buf(), note_id.to_string());
        let runner = self.runners.me.to_string();
        let root = self.vault.root().to_path_buf();
        let journal = self.journal.clone();
        // What the journal does first (keep the claimed text, or make the claim record that
        // kept it durable), and the text the stamp is written on unless the note changed
        // since (`note::update_note_unsynced`).
        let (first, last_seen) = match stamp {
            Stamp::KeepThenUnsynced(text) => (Some(Some(text.to_owned())), Some(text.to_owned())),
            Stamp::FlushThenUnsynced(text) => (Some(None), Some(text.to_owned())),
            Stamp::Unsynced(text) => (None, Some(text.to_owned())),
            Stamp::Durable => (None, None),
        };
        #[cfg(test)]
        before_stamp::call(path);
        // Noted before the write's rename, so that its event finds it noted (`on_hint`).
        self.runners.wrote(path);
        // The journal's write and the note's in one trip to the blocking pool.
        let written = tokio::task::spawn_blocking(move || {
            let stamp = |current: &str| note::stamp_claim(current, &id, &runner, at);
            match first {
                Some(Some(text)) => journal.keep_claimed_text(run, &text)?,
                Some(None) => journal.flush()?,
                None => {}
            }
            Ok::<_, crate::journal::JournalError>(match last_seen {
                Some(text) => note::update_note_unsynced(&root, &p, stamp, Some(&text)),
                None => note::update_note_beneath(&root, &p, stamp),
            })
        })
        .await
        .expect("write task does not panic");
        let written = match written {
            Ok(written) => written,
            // Nothing of the note ran yet: kept from running by a journal that cannot
            // record it (§9.12), or by a run a failed commit lost, it goes back to be
            // claimed again, not left in In_Progress unknown to the journal.
            Err(e) if e.is_run_lost() || self.storage_paused() => {
                return Ok(IdentityWrite::NotKept(e));
            }
            Err(e) => return Err(e.into()),
        };
        match written {
            Ok(text) => Ok(IdentityWrite::Written(text)),
            Err(note::WriteError::Gone(_)) => Ok(IdentityWrite::Gone),
            Err(e) => {
                tracing::warn!(note = %self.vault.relative(path), "cannot add tool_note yet: {e}");
                Ok(IdentityWrite::NotYet)
            }
        }
    }

    /// Decides a note's identity at its claim (docs/design.md §9.2, §9.6, §9.10): the `tool_note` it
    /// carries unless another note in the vault carries it too (a copy gets a new id, but
    /// keeps the outcomes of the calls the carried id started), else a new one. A note
    /// without one is a stale copy of a note claimed within `stale_copy_window` from its path,
    /// or from the path a sync client's duplicate name leads back to when its text is that
    /// note's text as claimed.
    pub(crate) async fn identify(
        &self,
        path: &Path,
        text: &str,
        parsed: &ParsedNote,
    ) -> Result<Identity, DaemonError> {
        let rel = self.vault.relative(path);
        if let Some(id) =
            note::frontmatter_property(text, "tool_note").filter(|id| valid_note_id(id))
        {
            return self
                .identify_by_tool_note(&rel, id.to_string(), parsed)
                .await;
        }
        self.identify_without_tool_note(path, rel, text, parsed)
            .await
    }

    /// identify's stage for a note that carries a `tool_note`: that id, unless another note
    /// in the vault carries it too. A copy gets a new id, or, while that note has not yet run
    /// calls they share, keeps the id and waits for it (`wait_for`).
    async fn identify_by_tool_note(
        &self,
        rel: &str,
        id: String,
        parsed: &ParsedNote,
    ) -> Result<Identity, DaemonError> {
        // What the journal holds for the id first, then where its note is: the note's
        // "written and moved" record may commit between the two reads (a copy waiting
        // for the note it copies re-reads just as that note's run ends). Read in the
        // other order, a copy could see the calls written but the note still at its
        // In_Progress path, gone from there: it would take itself for that note, whose
        // written results it lacks, which means "run again" (§2): a send sent twice.
        // In this order a record seen by the first read is seen by the second.
        let (mut prior, mut stale) = self.prior_for(&id).await?;
        let q = id.clone();
        let mut last = self.read_journal(|j| j.note_path(&q))?;
        let holds_id = |p: &String| {
            let t = crate::vault::read_regular_text(&self.vault.root().join(p)).ok()?;
            (note::frontmatter_property(&t, "tool_note") == Some(&id)).then_some(t)
        };
        // Where the journal last saw the note, it is gone: its last records (a run's
        // "written and moved" is not waited for) may not have committed yet. Once every
        // write made so far is in, both are read again; a note a person moved stays
        // unknown to the journal all the same.
        if last
            .as_ref()
            .is_some_and(|p| *p != rel && holds_id(p).is_none())
        {
            self.blocking(|j| j.flush()).await?;
            (prior, stale) = self.prior_for(&id).await?;
            let q = id.clone();
            last = self.read_journal(|j| j.note_path(&q))?;
        }
        let original = last
            .filter(|p| *p != rel)
            .and_then(|p| holds_id(&p).map(|t| (p, t)));
        let Some((original, original_text)) = original else {
            return Ok(Identity {
                note_id: id,
                prior,
                stale,
                ..Identity::default()
            });
        };
        tracing::info!(note = %rel, copy_of = %id, "a copy of another note: it gets its own tool_note");
        let mut ident = Identity {
            note_id: new_note_id(),
            ..Identity::default()
        };
        // §9.10: the calls the carried id started get their recorded outcome (or
        // UNKNOWN_OUTCOME), as that note would: the copy is that note for them.
        let still_running = self.is_active(&id);
        if !still_running && shares_unstarted_pending(parsed, &original_text, &prior) {
            // §9.10: those calls belong to that note; it has not run them yet (it waits
            // to be claimed, recovered or approved). Run here now, they would run twice.
            return Ok(Identity {
                note_id: id.clone(),
                wait_for: Some(id),
                ..Identity::default()
            });
        }
        if shares_started_call(parsed, &prior) || still_running {
            tracing::warn!(
                note = %rel,
                copy_of = %original,
                "a copy of {original} (same tool_note): its calls that already ran there are not run again"
            );
            ident.prior = prior;
            ident.stale = Some(StaleCopy {
                of: Claim {
                    note_id: id,
                    claimed_at: SystemTime::now(),
                    note: original,
                    text_sha256: None,
                },
                within_grace: true,
            });
        }
        Ok(ident)
    }

    /// identify's stage for a note without a `tool_note`: a new id, and whether it is a
    /// stale copy of a note claimed from its path or from the path a sync client's
    /// duplicate name leads back to.
    async fn identify_without_tool_note(
        &self,
        path: &Path,
        rel: String,
        text: &str,
        parsed: &ParsedNote,
    ) -> Result<Identity, DaemonError> {
        let mut ident = Identity {
            note_id: new_note_id(),
            ..Identity::default()
        };
        // The last claims from this path and from the paths a sync client's duplicate name
        // leads back to, in one read.
        let originals = duplicate_paths(path);
        let mut froms = vec![rel.clone()];
        froms.extend(originals.iter().map(|p| self.vault.relative(p)));
        let mut claims = self.read_journal(|j| j.last_claims_from(&froms))?;
        let duplicates: Vec<_> = froms.drain(1..).zip(claims.drain(1..)).collect();
        if let Some(Some(claim)) = claims.pop()
            && let Some((prior, stale)) = self.stale_copy_of(parsed, claim).await?
        {
            tracing::warn!(
                note = %rel,
                copy_of = %stale.of.note,
                within_grace = stale.within_grace,
                "a note without tool_note where {} was claimed from: a stale copy; its calls that already ran are not run again",
                stale.of.note
            );
            ident.prior = prior;
            ident.stale = Some(stale);
            return Ok(ident);
        }
        if let Some((original, prior, stale)) = self.duplicate_of(duplicates, text, parsed).await? {
            tracing::warn!(
                note = %rel,
                copy_of = %stale.of.note,
                within_grace = stale.within_grace,
                "a sync client's duplicate of {original} with the text it was claimed with: a stale copy; its calls that already ran are not run again"
            );
            ident.prior = prior;
            ident.stale = Some(stale);
        }
        Ok(ident)
    }

    /// Whether a note without `tool_note` is a stale copy of the note `claim` claimed (§9.6):
    /// claimed within `stale_copy_window`, and sharing a started call with it (or that note
    /// still runs here, within the grace). Returns what the journal holds for it and the copy.
    async fn stale_copy_of(
        &self,
        parsed: &ParsedNote,
        claim: Claim,
    ) -> Result<Option<(HashMap<String, JournalCall>, StaleCopy)>, DaemonError> {
        let age = SystemTime::now()
            .duration_since(claim.claimed_at)
            .unwrap_or_default();
        if age > self.live().config.stale_copy_window {
            return Ok(None);
        }
        // A copy of a copy stands for the first note: the chain is followed to it.
        let (prior, root) = self.prior_for(&claim.note_id).await?;
        let claim = match root {
            Some(root) => Claim {
                note_id: root.of.note_id,
                note: root.of.note,
                ..claim
            },
            None => claim,
        };
        let within_grace = age <= self.live().config.stale_copy_grace;
        // That note may not have started its calls yet: while it runs here, the copy waits
        // for it (and is judged again after).
        let still_running = within_grace && self.is_active(&claim.note_id);
        if !shares_started_call(parsed, &prior) && !still_running {
            return Ok(None); // shares no started call with that note: a note of its own
        }
        Ok(Some((
            prior,
            StaleCopy {
                of: claim,
                within_grace,
            },
        )))
    }

    /// A note without `tool_note` whose name is a sync client's duplicate name of a note
    /// claimed from the same folder ([`duplicate_paths`]; `claimed_from` holds their last
    /// claims) and whose text equals that note's text as claimed (docs/design.md §9.10): the
    /// stale copy it is, as if it were at that path, with the original's path.
    async fn duplicate_of(
        &self,
        claimed_from: Vec<(String, Option<Claim>)>,
        text: &str,
        parsed: &ParsedNote,
    ) -> Result<Option<(String, HashMap<String, JournalCall>, StaleCopy)>, DaemonError> {
        if claimed_from.iter().all(|(_, claim)| claim.is_none()) {
            return Ok(None);
        }
        let sha = crate::tools::vault::sha256_hex(text.as_bytes());
        for (from, claim) in claimed_from {
            let Some(claim) = claim else {
                continue;
            };
            if claim.text_sha256.as_deref() != Some(sha.as_str()) {
                continue;
            }
            if let Some((prior, stale)) = self.stale_copy_of(parsed, claim).await? {
                return Ok(Some((from, prior, stale)));
            }
        }
        Ok(None)
    }

    /// What the journal holds for the calls of `note_id` (§9.3); for a stale copy (§9.6) the
    /// calls of the note it stands for too, its own records first.
    pub(crate) async fn prior_for(
        &self,
        note_id: &str,
    ) -> Result<(HashMap<String, JournalCall>, Option<StaleCopy>), DaemonError> {
        let q = note_id.to_string();
        let own = by_call_id(self.read_journal(|j| j.note_calls(&q))?);
        let q = note_id.to_string();
        let Some((of, within_grace)) = self.read_journal(|j| j.copy_of(&q))? else {
            return Ok((own, None));
        };
        let q = of.clone();
        let mut prior = by_call_id(self.read_journal(|j| j.note_calls(&q))?);
        let q = of.clone();
        let note = self.read_journal(|j| j.note_path(&q))?.unwrap_or_default();
        prior.extend(own);
        let stale = StaleCopy {
            of: Claim {
                note_id: of,
                claimed_at: SystemTime::now(),
                note,
                text_sha256: None,
            },
            within_grace,
        };
        Ok((prior, Some(stale)))
    }

    pub(crate) fn is_active(&self, note_id: &str) -> bool {
        self.active
            .lock()
            .expect("active lock poisoned")
            .contains_key(note_id)
    }

    /// Marks `note_id` as having a run here; false when it already has one.
    pub(crate) fn activate(&self, note_id: &str) -> bool {
        let mut active = self.active.lock().expect("active lock poisoned");
        if active.contains_key(note_id) {
            return false;
        }
        active.insert(note_id.to_string(), Arc::new(tokio::sync::Notify::new()));
        true
    }

    pub(crate) fn deactivate(&self, note_id: &str) {
        if let Some(n) = self
            .active
            .lock()
            .expect("active lock poisoned")
            .remove(note_id)
        {
            n.notify_waiters();
        }
        let copies = self
            .waiting_copies
            .lock()
            .expect("waiting copies lock poisoned")
            .remove(note_id);
        for path in copies.into_iter().flatten() {
            self.dispatch(path);
        }
    }

    /// Leaves the copy at `path` where it is until the note `of` has run the calls they share
    /// (§9.10): it is looked at again when a run of that note here ends, or at a rescan. True
    /// when that note's records show those calls started meanwhile (a run that ended before
    /// the copy was registered): the copy is judged again at once.
    async fn wait_for_original(
        &self,
        path: &Path,
        of: &str,
        parsed: &ParsedNote,
    ) -> Result<bool, DaemonError> {
        self.waiting_copies
            .lock()
            .expect("waiting copies lock poisoned")
            .entry(of.to_string())
            .or_default()
            .insert(path.to_path_buf());
        let (prior, _) = self.prior_for(of).await?;
        if shares_started_call(parsed, &prior) {
            return Ok(true);
        }
        self.explain_once(
            path,
            &format!(
                "a copy of note {of} whose calls are still pending there: it waits until they ran there, then gets their outcomes"
            ),
        );
        Ok(false)
    }

    /// Waits until `note_id` has no run here.
    pub(crate) async fn wait_inactive(&self, note_id: &str) {
        tracing::info!(
            note_id,
            "the note's calls are still running: waiting for them"
        );
        loop {
            let notify = self
                .active
                .lock()
                .expect("active lock poisoned")
                .get(note_id)
                .cloned();
            let Some(notify) = notify else { return };
            // Re-checked every so often: a wake-up between the check and the wait is not lost.
            let _ = tokio::time::timeout(Duration::from_millis(200), notify.notified()).await;
        }
    }

    /// CLI mode: whether `vaultd approve` approved any held call of the note (not consumed),
    /// with any parameters: a call edited after its approval is then asked about again.
    pub(crate) async fn cli_approved_any(&self, parsed: &ParsedNote) -> Result<bool, DaemonError> {
        for call in parsed.pending_calls() {
            if !parsed.is_held(&call.call_id) {
                continue;
            }
            let id = call.call_id.clone();
            if self.read_journal(|j| j.approved_any(&id))? {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

/// The claimed note as read right after its claim, in the same trip to the blocking pool
/// ([`note::read_settled`]).
pub(crate) type Claimed = Result<Vec<u8>, note::WriteError>;

/// What tests do just before [`Daemon::write_identity`] writes a note's stamp: look at the
/// journal and the note then, or take the note away.
#[cfg(test)]
pub(crate) mod before_stamp {
    use crate::test_hooks::OnceHooks;
    use std::path::Path;

    type Hook = Box<dyn FnOnce(&Path) + Send>;

    static HOOKS: OnceHooks<Hook> = OnceHooks::new();

    pub(crate) fn set(file_name: &str, hook: impl FnOnce(&Path) + Send + 'static) {
        HOOKS.set(file_name, Box::new(hook));
    }

    pub(super) fn call(path: &Path) {
        if let Some(hook) = HOOKS.take(path) {
            hook(path);
        }
    }
}

/// How [`Daemon::write_identity`] makes the stamp durable.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stamp<'a> {
    /// A full durable write (recovery's stamp: no claimed text in the journal).
    Durable,
    /// Keep this text (the note as claimed) durable with the run, then write unsynced.
    KeepThenUnsynced(&'a str),
    /// The claim record kept the text (the note as claimed) and committed: make that commit
    /// durable, then write unsynced.
    FlushThenUnsynced(&'a str),
    /// The text (the note as claimed) is durable with the run already: write unsynced.
    Unsynced(&'a str),
}

/// What [`Daemon::write_identity`] came to.
pub(crate) enum IdentityWrite {
    /// The note as written, stamped.
    Written(String),
    /// The note is gone (the caller abandons its run).
    Gone,
    /// Not written now (logged): the results write adds the properties.
    NotYet,
    /// The journal could not keep the claimed text first (a failed commit lost the run, or
    /// the storage refuses writes): nothing was written, and nothing of the note ran.
    NotKept(crate::journal::JournalError),
}

/// `n-` + 12 random hex digits (docs/design.md §9.2).
pub(crate) fn new_note_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded from the OS's randomness once per process, then stepped; mixed
    // with the time and a counter, two ids never repeat within or across processes.
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u128(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    h.write_u32(std::process::id());
    format!("n-{:012x}", h.finish() & 0xffff_ffff_ffff)
}

/// What vaultd writes as `tool_note`: `n-` and 1–64 of `[A-Za-z0-9_-]` (a person may pick one).
pub(crate) fn valid_note_id(id: &str) -> bool {
    id.strip_prefix("n-").is_some_and(|rest| {
        !rest.is_empty()
            && rest.len() <= 64
            && rest
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    })
}

/// Whether a pending call of `parsed` was started (or has an outcome) in `prior`.
/// Whether a pending call of `parsed` is pending in `original` too (no result there) and not
/// started by that note: the copy must wait for it to run there.
fn shares_unstarted_pending(
    parsed: &ParsedNote,
    original: &str,
    prior: &HashMap<String, JournalCall>,
) -> bool {
    let there = parse_note(original);
    let pending_there: std::collections::HashSet<&str> =
        there.pending_calls().map(|c| c.call_id.as_str()).collect();
    parsed.pending_calls().any(|c| {
        pending_there.contains(c.call_id.as_str())
            && !prior
                .get(&c.call_id)
                .is_some_and(|r| r.started_at.is_some() || r.recorded.is_some())
    })
}

fn shares_started_call(parsed: &ParsedNote, prior: &HashMap<String, JournalCall>) -> bool {
    parsed.pending_calls().any(|c| {
        prior
            .get(&c.call_id)
            .is_some_and(|r| r.started_at.is_some() || r.recorded.is_some())
    })
}

pub(crate) fn by_call_id(calls: Vec<JournalCall>) -> HashMap<String, JournalCall> {
    calls.into_iter().map(|c| (c.call_id.clone(), c)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn note_ids_are_n_and_12_hex_digits_and_do_not_repeat() {
        let ids: HashSet<String> = (0..1000).map(|_| new_note_id()).collect();
        assert_eq!(ids.len(), 1000);
        for id in &ids {
            assert!(valid_note_id(id), "{id}");
            assert_eq!(id.len(), 14, "{id}");
        }
        assert!(!valid_note_id("x-1"));
        assert!(!valid_note_id("n-"));
        assert!(!valid_note_id("n-a b"));
    }
}
