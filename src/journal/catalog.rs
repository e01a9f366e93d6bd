//! The MCP tool catalog and pinned definitions: what each server listed last (so `vaultd
//! tools` and `vaultd check` work without starting servers) and the definition hash a person
//! accepted for each tool (docs/design.md §10.4). Self-contained tables, created at open.

use super::{Failure, Journal, JournalError, Tx, now_ms, rfc3339};
use rusqlite::{OptionalExtension, params};

/// Created at every open (`IF NOT EXISTS`), outside the numbered migrations.
pub(super) const TABLES: &str = "
    CREATE TABLE IF NOT EXISTS mcp_servers (
        server TEXT PRIMARY KEY,
        first_listed_ms INTEGER NOT NULL,
        listed_ms INTEGER NOT NULL
    );
    CREATE TABLE IF NOT EXISTS mcp_catalog (
        server TEXT NOT NULL,
        tool TEXT NOT NULL,
        definition TEXT NOT NULL,
        hash TEXT NOT NULL,
        PRIMARY KEY (server, tool)
    );
    CREATE TABLE IF NOT EXISTS mcp_pins (
        server TEXT NOT NULL,
        tool TEXT NOT NULL,
        definition TEXT NOT NULL,
        hash TEXT NOT NULL,
        accepted_ms INTEGER NOT NULL,
        PRIMARY KEY (server, tool)
    );
    CREATE TABLE IF NOT EXISTS mcp_not_allowed (
        server TEXT PRIMARY KEY,
        listed_ms INTEGER NOT NULL,
        tools_json TEXT NOT NULL
    );
    CREATE TABLE IF NOT EXISTS mcp_live (
        server TEXT PRIMARY KEY,
        state TEXT NOT NULL,
        since_ms INTEGER NOT NULL,
        daemon_started_ms INTEGER NOT NULL,
        starts INTEGER NOT NULL,
        about TEXT,
        last_error TEXT,
        last_error_ms INTEGER
    );
";

/// What a server's supervisor says as it goes (docs/design.md §10.4: `vaultd status` shows
/// each server's state, up since, restarts, last error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LiveEvent {
    /// The session is open; `about` names the server and the protocol it speaks.
    Up { about: String },
    /// The server exited or did not start; the supervisor tries again.
    Down { error: String },
    /// vaultd stopped it (shutdown or a reload that removed it).
    Stopped,
}

/// A server's state as its daemon last recorded it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LiveState {
    /// `up`, `down` (restarting with backoff) or `stopped`.
    pub state: String,
    /// When it entered that state (RFC 3339).
    pub since: String,
    /// Sessions opened since the daemon started, less one: how often it came back.
    pub restarts: i64,
    pub about: Option<String>,
    pub last_error: Option<String>,
    pub last_error_at: Option<String>,
}

/// One tool as a server listed it: its definition (canonical JSON) and that text's hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedTool {
    pub tool: String,
    pub definition: String,
    pub hash: String,
}

/// Where a listed tool stands against its pin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PinState {
    /// The definition is the accepted one.
    Accepted,
    /// Another definition was accepted: this one waits for `vaultd tools accept`.
    Changed { accepted_definition: String },
    /// The name appeared after the server's first listing: waits for `vaultd tools accept`.
    New,
}

/// A server's catalog, for commands that do not start servers.
#[derive(Debug, Clone)]
pub struct CatalogEntry {
    pub tool: ListedTool,
    pub pin: PinState,
}

#[derive(Debug, Clone)]
pub struct ServerCatalog {
    /// RFC 3339 time of the last listing.
    pub listed_at: String,
    pub tools: Vec<CatalogEntry>,
}

impl Journal {
    /// Records a server's complete listing: the catalog is replaced by its allowed `tools`,
    /// and at the server's first listing every tool it offers (`tools` and the not allowed
    /// `others`, which a later `allow` may name) is pinned as seen. Returns the state of each
    /// of `tools`.
    pub fn record_mcp_listing(
        &self,
        server: &str,
        tools: &[ListedTool],
        others: &[ListedTool],
    ) -> Result<Vec<PinState>, JournalError> {
        let (server, tools, others) = (server.to_owned(), tools.to_vec(), others.to_vec());
        self.write(move |tx| {
            let (server, tools, others) = (server.as_str(), &tools, &others);
            let now = now_ms();
            let first: bool = tx
                .query_row(
                    "SELECT 1 FROM mcp_servers WHERE server = ?1",
                    params![server],
                    |_| Ok(()),
                )
                .optional()?
                .is_none();
            tx.execute(
                "INSERT INTO mcp_servers (server, first_listed_ms, listed_ms) VALUES (?1, ?2, ?2)
                 ON CONFLICT(server) DO UPDATE SET listed_ms = excluded.listed_ms",
                params![server, now],
            )?;
            tx.execute("DELETE FROM mcp_catalog WHERE server = ?1", params![server])?;
            // What `allow` leaves out, for `vaultd tools --all`: names and descriptions only.
            let not_allowed: Vec<serde_json::Value> = others.iter().map(offered).collect();
            tx.execute(
                "INSERT INTO mcp_not_allowed (server, listed_ms, tools_json) VALUES (?1, ?2, ?3)
                 ON CONFLICT(server) DO UPDATE SET listed_ms = excluded.listed_ms,
                     tools_json = excluded.tools_json",
                params![server, now, serde_json::Value::Array(not_allowed).to_string()],
            )?;
            if first {
                for t in others {
                    pin(tx, server, t, now)?;
                }
            }
            let mut states = Vec::with_capacity(tools.len());
            for t in tools {
                tx.execute(
                    "INSERT INTO mcp_catalog (server, tool, definition, hash) VALUES (?1, ?2, ?3, ?4)",
                    params![server, t.tool, t.definition, t.hash],
                )?;
                if first {
                    pin(tx, server, t, now)?;
                }
                states.push(pin_state(tx, server, t)?);
            }
            Ok(states)
        })
    }

    /// Pins the catalog's current definition of `server`'s `tool` (`vaultd tools accept`).
    /// Returns false when the catalog does not hold that tool.
    pub fn accept_mcp_tool(&self, server: &str, tool: &str) -> Result<bool, JournalError> {
        let (server, tool) = (server.to_owned(), tool.to_owned());
        self.write(move |tx| {
            let (server, tool) = (server.as_str(), tool.as_str());
            let listed: Option<(String, String)> = tx
                .query_row(
                    "SELECT definition, hash FROM mcp_catalog WHERE server = ?1 AND tool = ?2",
                    params![server, tool],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            let Some((definition, hash)) = listed else {
                return Ok(false);
            };
            let t = ListedTool {
                tool: tool.to_string(),
                definition,
                hash,
            };
            pin(tx, server, &t, now_ms())?;
            Ok(true)
        })
    }

    /// The pin state of one definition, read at call time (a `vaultd tools accept` made while
    /// the daemon runs counts at once).
    pub fn mcp_pin_state(
        &self,
        server: &str,
        listed: &ListedTool,
    ) -> Result<PinState, JournalError> {
        self.read(|tx| pin_state(tx, server, listed))
    }

    /// What `server` listed last, or None if it was never listed.
    pub fn mcp_catalog(&self, server: &str) -> Result<Option<ServerCatalog>, JournalError> {
        self.read(|tx| {
            let listed: Option<i64> = tx
                .query_row(
                    "SELECT listed_ms FROM mcp_servers WHERE server = ?1",
                    params![server],
                    |r| r.get(0),
                )
                .optional()?;
            let Some(listed_ms) = listed else {
                return Ok(None);
            };
            let mut stmt = tx.prepare(
                "SELECT tool, definition, hash FROM mcp_catalog WHERE server = ?1 ORDER BY tool",
            )?;
            let rows = stmt.query_map(params![server], |r| {
                Ok(ListedTool {
                    tool: r.get(0)?,
                    definition: r.get(1)?,
                    hash: r.get(2)?,
                })
            })?;
            let listed: Vec<ListedTool> = rows.collect::<Result<_, _>>()?;
            let mut tools = Vec::with_capacity(listed.len());
            for t in listed {
                let pin = pin_state(tx, server, &t)?;
                tools.push(CatalogEntry { tool: t, pin });
            }
            Ok(Some(ServerCatalog {
                listed_at: rfc3339(listed_ms),
                tools,
            }))
        })
    }
}

/// A tool `allow` leaves out, as `vaultd tools --all` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OfferedTool {
    pub tool: String,
    /// The server's description (untrusted text: shown escaped, never given to a model).
    pub description: String,
}

/// What the journal knows of one server, for `vaultd status`.
#[derive(Debug, Clone, Default)]
pub struct ServerRecord {
    /// RFC 3339 times of its first and latest complete tool listing (each start and each
    /// `notifications/tools/list_changed` lists again).
    pub first_listed_at: Option<String>,
    pub listed_at: Option<String>,
    /// Its allowed tools at the latest listing, with their pin states.
    pub tools: Vec<CatalogEntry>,
    /// The tools `allow` left out at the latest listing; None when the listing was recorded
    /// by a vaultd that did not keep them.
    pub not_allowed: Option<Vec<OfferedTool>>,
    /// The latest call of one of its tools that did not end ok.
    pub last_failure: Option<super::LogEntry>,
    /// When one of its tools last ended a call, whatever the outcome.
    pub last_call_at: Option<String>,
    /// Up, down or stopped, as the daemon that ran it last recorded (None: never started).
    pub live: Option<LiveState>,
}

impl Journal {
    /// The tools of `server` that `allow` left out at its latest listing (None: never listed,
    /// or listed by a vaultd that did not keep them).
    pub fn mcp_not_allowed(&self, server: &str) -> Result<Option<Vec<OfferedTool>>, JournalError> {
        self.read(|tx| not_allowed(tx, server))
    }

    /// Records a supervisor's step for `vaultd status`: queued, never waited for (a server
    /// coming up must not wait for a disk), and counted per daemon run: `daemon_started_ms`
    /// tells a restart of this daemon's server from the first start of the next daemon.
    pub fn record_mcp_live(
        &self,
        server: &str,
        daemon_started_ms: i64,
        event: LiveEvent,
    ) -> Result<(), JournalError> {
        let server = server.to_owned();
        self.write_queued("recording an MCP server's state", move |tx| {
            let now = now_ms();
            let (state, about, error) = match &event {
                LiveEvent::Up { about } => ("up", Some(about.as_str()), None),
                LiveEvent::Down { error } => ("down", None, Some(error.as_str())),
                LiveEvent::Stopped => ("stopped", None, None),
            };
            let up = i64::from(state == "up");
            tx.execute(
                "INSERT INTO mcp_live (server, state, since_ms, daemon_started_ms, starts, about,
                                       last_error, last_error_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, CASE WHEN ?7 IS NULL THEN NULL ELSE ?3 END)
                 ON CONFLICT(server) DO UPDATE SET
                     state = excluded.state,
                     since_ms = CASE WHEN mcp_live.state = excluded.state
                                     AND mcp_live.daemon_started_ms = excluded.daemon_started_ms
                                THEN mcp_live.since_ms ELSE excluded.since_ms END,
                     starts = CASE WHEN mcp_live.daemon_started_ms = excluded.daemon_started_ms
                                   THEN mcp_live.starts + excluded.starts
                                   ELSE excluded.starts END,
                     daemon_started_ms = excluded.daemon_started_ms,
                     about = coalesce(excluded.about, mcp_live.about),
                     last_error = coalesce(excluded.last_error, mcp_live.last_error),
                     last_error_ms = coalesce(excluded.last_error_ms, mcp_live.last_error_ms)",
                params![server, state, now, daemon_started_ms, up, about, error],
            )?;
            Ok(())
        })
    }

    /// Everything the journal records about `server` (docs/design.md §10.4, `vaultd status`).
    pub fn mcp_server_record(&self, server: &str) -> Result<ServerRecord, JournalError> {
        let catalog = self.mcp_catalog(server)?;
        self.read(|tx| {
            let first: Option<i64> = tx
                .query_row(
                    "SELECT first_listed_ms FROM mcp_servers WHERE server = ?1",
                    params![server],
                    |r| r.get(0),
                )
                .optional()?;
            // `mcp__SERVER__…` compared as a prefix (LIKE would read `_` as a wildcard).
            let prefix = format!("mcp__{server}__");
            let last_failure = tx
                .query_row(
                    "SELECT e.at_ms, e.event, e.note, e.call_id, e.tool, e.outcome, e.duration_ms,
                            e.detail
                     FROM events e
                     WHERE e.event = 'call_end' AND coalesce(e.outcome, '') NOT IN ('ok', 'NEEDS_ANSWER')
                       AND substr(e.tool, 1, length(?1)) = ?1
                     ORDER BY e.id DESC LIMIT 1",
                    params![prefix],
                    super::events::log_entry,
                )
                .optional()?;
            let last_call: Option<i64> = tx
                .query_row(
                    "SELECT max(at_ms) FROM events
                     WHERE event = 'call_end' AND substr(tool, 1, length(?1)) = ?1",
                    params![prefix],
                    |r| r.get(0),
                )
                .optional()?
                .flatten();
            let live = tx
                .query_row(
                    "SELECT state, since_ms, starts, about, last_error, last_error_ms
                     FROM mcp_live WHERE server = ?1",
                    params![server],
                    |r| {
                        Ok(LiveState {
                            state: r.get(0)?,
                            since: rfc3339(r.get(1)?),
                            restarts: (r.get::<_, i64>(2)? - 1).max(0),
                            about: r.get(3)?,
                            last_error: r.get(4)?,
                            last_error_at: r.get::<_, Option<i64>>(5)?.map(rfc3339),
                        })
                    },
                )
                .optional()?;
            Ok(ServerRecord {
                live,
                first_listed_at: first.map(rfc3339),
                listed_at: catalog.as_ref().map(|c| c.listed_at.clone()),
                tools: catalog.map(|c| c.tools).unwrap_or_default(),
                not_allowed: not_allowed(tx, server)?,
                last_failure,
                last_call_at: last_call.map(rfc3339),
            })
        })
    }
}

fn offered(t: &ListedTool) -> serde_json::Value {
    let description = serde_json::from_str::<serde_json::Value>(&t.definition)
        .ok()
        .and_then(|d| {
            d.get("description")
                .and_then(|v| v.as_str())
                .map(str::to_owned)
        })
        .unwrap_or_default();
    serde_json::json!({ "tool": t.tool, "description": description })
}

fn not_allowed(tx: &Tx<'_>, server: &str) -> Result<Option<Vec<OfferedTool>>, Failure> {
    let row: Option<String> = tx
        .query_row(
            "SELECT tools_json FROM mcp_not_allowed WHERE server = ?1",
            params![server],
            |r| r.get(0),
        )
        .optional()?;
    Ok(row.map(|json| {
        serde_json::from_str::<Vec<serde_json::Value>>(&json)
            .unwrap_or_default()
            .iter()
            .map(|v| OfferedTool {
                tool: v["tool"].as_str().unwrap_or("").to_string(),
                description: v["description"].as_str().unwrap_or("").to_string(),
            })
            .collect()
    }))
}

fn pin(tx: &Tx<'_>, server: &str, t: &ListedTool, now: i64) -> Result<(), Failure> {
    tx.execute(
        "INSERT INTO mcp_pins (server, tool, definition, hash, accepted_ms) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT(server, tool) DO UPDATE SET definition = excluded.definition,
             hash = excluded.hash, accepted_ms = excluded.accepted_ms",
        params![server, t.tool, t.definition, t.hash, now],
    )?;
    Ok(())
}

fn pin_state(tx: &Tx<'_>, server: &str, t: &ListedTool) -> Result<PinState, Failure> {
    let pinned: Option<(String, String)> = tx
        .query_row(
            "SELECT hash, definition FROM mcp_pins WHERE server = ?1 AND tool = ?2",
            params![server, t.tool],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    Ok(match pinned {
        None => PinState::New,
        Some((hash, _)) if hash == t.hash => PinState::Accepted,
        Some((_, definition)) => PinState::Changed {
            accepted_definition: definition,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(tool: &str, def: &str) -> ListedTool {
        ListedTool {
            tool: tool.into(),
            definition: def.into(),
            hash: format!("h({def})"),
        }
    }

    #[test]
    fn live_state_counts_restarts_per_daemon_and_keeps_the_last_error() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path()).unwrap();
        let live = |j: &Journal| j.mcp_server_record("s").unwrap().live;
        assert_eq!(live(&j), None);
        let up = || LiveEvent::Up {
            about: "srv 1.0, MCP protocol 2025-11-25".into(),
        };
        let down = |e: &str| LiveEvent::Down { error: e.into() };
        j.record_mcp_live("s", 100, down("it did not start: no such file"))
            .unwrap();
        j.record_mcp_live("s", 100, up()).unwrap();
        // Queued writes are read once a later durable write returned.
        j.record_mcp_listing("s", &[], &[]).unwrap();
        let first = live(&j).unwrap();
        assert_eq!((first.state.as_str(), first.restarts), ("up", 0));
        assert_eq!(
            first.about.as_deref(),
            Some("srv 1.0, MCP protocol 2025-11-25")
        );
        assert_eq!(
            first.last_error.as_deref(),
            Some("it did not start: no such file")
        );

        j.record_mcp_live("s", 100, down("the server exited"))
            .unwrap();
        j.record_mcp_live("s", 100, up()).unwrap();
        j.record_mcp_live("s", 100, up()).unwrap();
        j.record_mcp_listing("s", &[], &[]).unwrap();
        let again = live(&j).unwrap();
        assert_eq!((again.state.as_str(), again.restarts), ("up", 2));
        assert_eq!(again.last_error.as_deref(), Some("the server exited"));

        j.record_mcp_live("s", 100, LiveEvent::Stopped).unwrap();
        j.record_mcp_listing("s", &[], &[]).unwrap();
        assert_eq!(live(&j).unwrap().state, "stopped");
        // The next daemon counts from its own start.
        j.record_mcp_live("s", 200, up()).unwrap();
        j.record_mcp_listing("s", &[], &[]).unwrap();
        let next = live(&j).unwrap();
        assert_eq!((next.state.as_str(), next.restarts), ("up", 0));
        assert_eq!(next.last_error.as_deref(), Some("the server exited"));
    }

    #[test]
    fn first_listing_pins_later_changes_wait_for_accept() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path()).unwrap();
        assert!(j.mcp_catalog("s").unwrap().is_none());
        let states = j
            .record_mcp_listing("s", &[listed("a", "{1}")], &[listed("c", "{1}")])
            .unwrap();
        assert_eq!(states, vec![PinState::Accepted]);
        // What `allow` left out is kept for `vaultd tools --all`, replaced at each listing.
        assert_eq!(j.mcp_not_allowed("never").unwrap(), None);
        let left_out = j.mcp_not_allowed("s").unwrap().unwrap();
        assert_eq!(left_out.len(), 1);
        assert_eq!(left_out[0].tool, "c");
        let record = j.mcp_server_record("s").unwrap();
        assert_eq!(record.tools.len(), 1);
        assert!(record.listed_at.is_some() && record.first_listed_at.is_some());
        assert!(record.last_failure.is_none() && record.last_call_at.is_none());

        // Changed definition, and a name that was not there at the first listing.
        let states = j
            .record_mcp_listing("s", &[listed("a", "{2}"), listed("b", "{1}")], &[])
            .unwrap();
        assert_eq!(
            states,
            vec![
                PinState::Changed {
                    accepted_definition: "{1}".into()
                },
                PinState::New
            ]
        );
        let catalog = j.mcp_catalog("s").unwrap().unwrap();
        assert_eq!(catalog.tools.len(), 2);

        assert!(j.accept_mcp_tool("s", "a").unwrap());
        assert!(j.accept_mcp_tool("s", "b").unwrap());
        assert!(!j.accept_mcp_tool("s", "zzz").unwrap());
        // Not allowed at the first listing, allowed later with the definition seen then.
        assert_eq!(
            j.mcp_pin_state("s", &listed("c", "{1}")).unwrap(),
            PinState::Accepted
        );
        assert_eq!(
            j.mcp_pin_state("s", &listed("a", "{2}")).unwrap(),
            PinState::Accepted
        );
        assert_eq!(
            j.mcp_pin_state("s", &listed("b", "{1}")).unwrap(),
            PinState::Accepted
        );
    }
}
