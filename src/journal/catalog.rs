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
";

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
    fn first_listing_pins_later_changes_wait_for_accept() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path()).unwrap();
        assert!(j.mcp_catalog("s").unwrap().is_none());
        let states = j
            .record_mcp_listing("s", &[listed("a", "{1}")], &[listed("c", "{1}")])
            .unwrap();
        assert_eq!(states, vec![PinState::Accepted]);

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
