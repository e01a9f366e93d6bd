//! The `approvals` table: `vaultd approve`/`reject` decisions, bound to the call id and the
//! hash of the exact parameters shown, each counting once.

use super::events::{EventFields, event};
use super::{Failure, Journal, JournalError, Tx, exec, now_ms, query_one};
use rusqlite::{OptionalExtension, params};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Approved,
    Rejected,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Approved => "approved",
            Decision::Rejected => "rejected",
        }
    }

    fn parse(s: &str) -> Option<Decision> {
        match s {
            "approved" => Some(Decision::Approved),
            "rejected" => Some(Decision::Rejected),
            _ => None,
        }
    }
}

impl Journal {
    /// Records a person's decision on the held call `call_id` with exactly the parameters
    /// hashed to `params_hash`. The latest decision wins.
    pub fn record_approval(
        &self,
        note: &str,
        call_id: &str,
        params_hash: &str,
        decision: Decision,
    ) -> Result<(), JournalError> {
        let (note, call_id, params_hash) =
            (note.to_owned(), call_id.to_owned(), params_hash.to_owned());
        self.write(move |tx| {
            let (note, call_id, params_hash) =
                (note.as_str(), call_id.as_str(), params_hash.as_str());
            let now = now_ms();
            exec(
                tx,
                "INSERT INTO approvals (call_id, params_hash, note, decision, at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (call_id, params_hash) DO UPDATE SET
                    note = excluded.note, decision = excluded.decision,
                    at_ms = excluded.at_ms, consumed_at_ms = NULL",
                params![call_id, params_hash, note, decision.as_str(), now],
            )?;
            let fields = EventFields {
                call_id: Some(call_id),
                outcome: Some(decision.as_str()),
                detail: Some(params_hash),
                ..EventFields::default()
            };
            event(tx, now, "approval", None, note, &fields)
        })
    }

    /// The latest unconsumed decision on `call_id` with these exact parameters.
    pub fn approval(
        &self,
        call_id: &str,
        params_hash: &str,
    ) -> Result<Option<Decision>, JournalError> {
        self.read(|tx| lookup_approval(tx, call_id, params_hash))
    }

    /// Whether `call_id` has an unconsumed `Approved` decision, whatever parameters it is bound
    /// to: the daemon then looks at the note even if the call was edited since (to ask again).
    pub fn approved_any(&self, call_id: &str) -> Result<bool, JournalError> {
        self.read(|tx| {
            Ok(tx
                .query_row(
                    "SELECT 1 FROM approvals
                     WHERE call_id = ?1 AND decision = 'approved' AND consumed_at_ms IS NULL
                     LIMIT 1",
                    params![call_id],
                    |_| Ok(()),
                )
                .optional()?
                .is_some())
        })
    }

    /// Takes the decision on `call_id` with these parameters, so it counts once: call it when
    /// the held call starts (or gets its REJECTED result). A call run again later (its result
    /// block deleted) needs a new decision.
    pub fn consume_approval(
        &self,
        call_id: &str,
        params_hash: &str,
    ) -> Result<Option<Decision>, JournalError> {
        let (call_id, params_hash) = (call_id.to_owned(), params_hash.to_owned());
        self.write(move |tx| {
            let (call_id, params_hash) = (call_id.as_str(), params_hash.as_str());
            let decision = lookup_approval(tx, call_id, params_hash)?;
            if decision.is_some() {
                spend_approval(tx, call_id, params_hash, now_ms())?;
            }
            Ok(decision)
        })
    }
}

/// Marks the unspent decision on `call_id` with these parameters spent, if there is one: in
/// the transaction of whatever acts on it (a call's start record, `consume_approval`).
pub(super) fn spend_approval(
    tx: &Tx<'_>,
    call_id: &str,
    params_hash: &str,
    now_ms: i64,
) -> rusqlite::Result<()> {
    exec(
        tx,
        "UPDATE approvals SET consumed_at_ms = ?1
         WHERE call_id = ?2 AND params_hash = ?3 AND consumed_at_ms IS NULL",
        params![now_ms, call_id, params_hash],
    )
    .map(|_| ())
}

fn lookup_approval(
    tx: &Tx<'_>,
    call_id: &str,
    params_hash: &str,
) -> Result<Option<Decision>, Failure> {
    let decision: Option<String> = query_one(
        tx,
        "SELECT decision FROM approvals
             WHERE call_id = ?1 AND params_hash = ?2 AND consumed_at_ms IS NULL",
        params![call_id, params_hash],
        |r| r.get(0),
    )
    .optional()?;
    decision
        .map(|d| {
            Decision::parse(&d).ok_or_else(|| Failure::Other(format!("unknown decision {d:?}")))
        })
        .transpose()
}

#[cfg(test)]
mod tests {
    use crate::journal::testing::*;
    use crate::journal::*;

    #[test]
    fn approvals_latest_wins_and_are_bound_to_the_params_hash() {
        let (_dir, journal) = fresh_journal();
        let note = "Pending_Approval/a.md";
        assert_eq!(journal.approval("c-1", "hash-a").unwrap(), None);
        journal
            .record_approval(note, "c-1", "hash-a", Decision::Approved)
            .unwrap();
        assert_eq!(
            journal.approval("c-1", "hash-a").unwrap(),
            Some(Decision::Approved)
        );
        // Changed parameters need approving again; another call is another call.
        assert_eq!(journal.approval("c-1", "hash-b").unwrap(), None);
        assert_eq!(journal.approval("c-2", "hash-a").unwrap(), None);

        journal
            .record_approval(note, "c-1", "hash-a", Decision::Rejected)
            .unwrap();
        assert_eq!(
            journal.approval("c-1", "hash-a").unwrap(),
            Some(Decision::Rejected)
        );
        journal
            .record_approval(note, "c-1", "hash-a", Decision::Approved)
            .unwrap();
        assert_eq!(
            journal.approval("c-1", "hash-a").unwrap(),
            Some(Decision::Approved)
        );

        let events: Vec<_> = journal
            .log(&LogFilter::default())
            .unwrap()
            .into_iter()
            .map(|e| (e.event, e.call_id, e.outcome))
            .collect();
        assert_eq!(events.len(), 3);
        assert_eq!(
            events[1],
            (
                "approval".to_string(),
                Some("c-1".to_string()),
                Some("rejected".to_string())
            )
        );
    }

    #[test]
    fn an_approval_counts_once() {
        let (_dir, journal) = fresh_journal();
        journal
            .record_approval("Pending_Approval/a.md", "c-1", "h", Decision::Approved)
            .unwrap();
        assert_eq!(
            journal.consume_approval("c-1", "h").unwrap(),
            Some(Decision::Approved)
        );
        assert_eq!(journal.approval("c-1", "h").unwrap(), None);
        assert_eq!(journal.consume_approval("c-1", "h").unwrap(), None);
        assert!(!journal.approved_any("c-1").unwrap());
        // A new decision is usable again.
        journal
            .record_approval("Pending_Approval/a.md", "c-1", "h", Decision::Approved)
            .unwrap();
        assert_eq!(
            journal.approval("c-1", "h").unwrap(),
            Some(Decision::Approved)
        );
    }
}
