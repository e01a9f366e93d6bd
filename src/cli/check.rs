//! `vaultd check NOTE…`: what each call in a note would do, without running it.

use super::preview::report_unreadable;
use super::{
    GlobalArgs, decision_of, escape_controls, load_lenient, mcp_registry_for, print_catalog_ages,
    resolve_note,
};
use crate::note::parse_note;
use crate::pipeline::plan::{self, Facts, Rules, Step};
use crate::tools::Registry;
use anyhow::Result;
use serde_json::{Value, json};
use std::io::Write;
use std::path::PathBuf;

pub(super) fn check(g: &GlobalArgs, notes: &[PathBuf], as_json: bool) -> Result<i32> {
    use crate::vault::State;
    let (config, _) = load_lenient(g)?;
    let (registry, _mcp, journal) = mcp_registry_for(&config)?;
    let mut any_invalid = false;
    // MCP servers whose tools the checked calls use: their catalog's age is shown at the end.
    let mut mcp_servers = std::collections::BTreeSet::new();
    let mut out = std::io::stdout().lock();
    for arg in notes {
        let path = match resolve_note(&config, arg, &State::ALL) {
            Ok(p) => p,
            Err(e) => {
                any_invalid = true;
                report_unreadable(&mut out, arg, &format!("{e:#}"), as_json)?;
                continue;
            }
        };
        let path = path.as_path();
        let text = match std::fs::read(path) {
            Ok(b) => match String::from_utf8(b) {
                Ok(s) => s,
                Err(_) => {
                    any_invalid = true;
                    report_unreadable(&mut out, path, "note is not UTF-8", as_json)?;
                    continue;
                }
            },
            Err(e) => {
                any_invalid = true;
                report_unreadable(&mut out, path, &format!("cannot read: {e}"), as_json)?;
                continue;
            }
        };
        let parsed = parse_note(&text);
        for call in &parsed.calls {
            if let Some((server, _)) = call.name.as_deref().and_then(crate::tools::mcp::split_name)
                && config.mcp.iter().any(|s| s.name == server)
            {
                mcp_servers.insert(server.to_string());
            }
        }
        let calls = checked_calls(&parsed, &registry);
        any_invalid |= calls.iter().any(|c| c["status"] == "invalid");
        let shown = escape_controls(&path.display().to_string());
        if as_json {
            let mut line = json!({ "path": path.display().to_string(), "calls": calls });
            if !calls.is_empty() && calls.iter().all(|c| c["status"] == "done") {
                line["message"] = json!(crate::note::NOTHING_PENDING);
            }
            writeln!(out, "{line}")?;
        } else {
            print_checked(&mut out, &shown, &calls)?;
        }
    }
    if let (false, Some(journal)) = (as_json, &journal) {
        print_catalog_ages(&mut out, journal, &mcp_servers)?;
    }
    Ok(if any_invalid { 1 } else { 0 })
}

/// `vaultd check`'s entry for every call of a note: done, or what the daemon's plan decides.
pub(super) fn checked_calls(parsed: &crate::note::ParsedNote, registry: &Registry) -> Vec<Value> {
    let plan = plan::plan(parsed, registry, &Rules::check(), &Facts::default());
    let steps: std::collections::HashMap<&str, &Step> =
        plan.steps.iter().map(|(id, s)| (id.as_str(), s)).collect();
    let mut calls = Vec::new();
    for call in &parsed.calls {
        let mut entry = json!({
            "call_id": call.call_id,
            "name": call.name,
            "line": call.line,
        });
        if let Some(step) = steps.get(call.call_id.as_str()) {
            let (status, decision, error) = decision_of(step);
            entry["status"] = json!(status);
            entry["decision"] = decision;
            if let Some(e) = error {
                entry["error"] = json!({ "code": e.code.as_str(), "message": e.message });
            }
        } else {
            // Its result is in the note: it does not run again until that result is deleted.
            entry["status"] = json!("done");
            if let Some(r) = parsed.results.iter().find(|r| r.call_id == call.call_id) {
                entry["result"] = match &r.error {
                    Some((code, message)) => {
                        json!({ "ok": false, "code": code, "message": message })
                    }
                    None => json!({ "ok": r.ok }),
                };
            }
        }
        calls.push(entry);
    }
    calls
}

pub(super) fn print_checked(out: &mut impl Write, shown: &str, calls: &[Value]) -> Result<()> {
    writeln!(out, "{shown}: {} call(s)", calls.len())?;
    if !calls.is_empty() && calls.iter().all(|c| c["status"] == "done") {
        writeln!(out, "  {}", crate::note::NOTHING_PENDING)?;
    }
    for c in calls {
        write!(
            out,
            "  line {:>4}  {:<10} {} {}",
            c["line"],
            c["status"].as_str().unwrap_or(""),
            c["call_id"].as_str().unwrap_or(""),
            c["name"].as_str().unwrap_or("?")
        )?;
        if let Some(e) = c.get("error") {
            write!(
                out,
                "  {}: {}",
                e["code"].as_str().unwrap_or(""),
                e["message"].as_str().unwrap_or("")
            )?;
        }
        match c["decision"]["action"].as_str() {
            Some("run") => write!(out, "\n        -> runs")?,
            Some("held") => write!(
                out,
                "\n        -> held for approval: {}",
                c["decision"]["reason"].as_str().unwrap_or("")
            )?,
            Some("denied") => write!(
                out,
                "\n        -> denied: {}",
                c["decision"]["reason"].as_str().unwrap_or("")
            )?,
            Some(_) => write!(out, "\n        -> not run: the call is invalid")?,
            None => match c["result"]["ok"].as_bool() {
                Some(true) => write!(out, "\n        -> has its result: ok")?,
                Some(false) => write!(
                    out,
                    "\n        -> has its result: failed {}: {}",
                    c["result"]["code"].as_str().unwrap_or("?"),
                    c["result"]["message"].as_str().unwrap_or("")
                )?,
                None => {}
            },
        }
        writeln!(out)?;
    }
    Ok(())
}
