//! `vaultd tools` (the tool list, its formats and `--all`) and `vaultd tools accept NAME`.

use super::{
    GlobalArgs, ToolFormat, escape_controls, load_lenient, mcp_registry_for, open_journal,
};
use crate::config::Config;
use crate::journal::Journal;
use crate::tools::Registry;
use crate::tools::mcp::McpSource;
use anyhow::Result;
use serde_json::{Value, json};
use std::io::Write;

/// `vaultd tools accept NAME`.
pub(super) fn accept_tool(g: &GlobalArgs, name: &str) -> Result<i32> {
    let (config, _) = load_lenient(g)?;
    let Some((server, tool)) = crate::tools::mcp::split_name(name) else {
        anyhow::bail!(
            "`{name}` is not an MCP tool name (mcp__SERVER__TOOL); only MCP tool definitions are pinned"
        );
    };
    if !config.mcp.iter().any(|s| s.name == server) {
        anyhow::bail!("no MCP server `{server}` in the config (add [mcp.{server}])");
    }
    let journal = open_journal(&config)?;
    if !journal.accept_mcp_tool(server, tool)? {
        anyhow::bail!(
            "MCP server `{server}` has not listed a tool `{tool}` (is it in mcp.{server}.allow, and has the daemon run since it appeared?)"
        );
    }
    println!("accepted the current definition of {name}; its calls run again");
    Ok(0)
}

pub(super) fn tools(
    g: &GlobalArgs,
    as_json: bool,
    format: Option<ToolFormat>,
    all: bool,
) -> Result<i32> {
    let (config, _) = load_lenient(g)?;
    let (registry, mcp, journal) = mcp_registry_for(&config)?;
    let not_usable = if all {
        super::mcp::not_usable(&config, journal.as_deref())?
    } else {
        Vec::new()
    };
    let described = describe(&registry, &mcp, journal.as_deref());
    let mut list = described.as_array().cloned().unwrap_or_default();
    if format.is_some() {
        list = only_runnable(list);
    }
    let out: Value = match format {
        Some(ToolFormat::Openai) => Value::Array(
            list.iter()
                .map(|t| json!({ "type": "function", "function": { "name": t["name"], "description": t["description"], "parameters": t["parameters"] } }))
                .collect(),
        ),
        Some(ToolFormat::Anthropic) => Value::Array(
            list.iter()
                .map(|t| json!({ "name": t["name"], "description": t["description"], "input_schema": t["parameters"] }))
                .collect(),
        ),
        None if as_json => {
            let mut all = described.as_array().cloned().unwrap_or_default();
            all.extend(not_usable);
            Value::Array(all)
        }
        None => {
            let mut out = std::io::stdout().lock();
            for t in &list {
                writeln!(
                    out,
                    "{} ({}, {}, approval: {})\n  {}",
                    t["name"].as_str().unwrap_or(""),
                    t["source"].as_str().unwrap_or(""),
                    t["effect"].as_str().unwrap_or(""),
                    t["approval"].as_str().unwrap_or(""),
                    t["description"].as_str().unwrap_or(""),
                )?;
                if let Some(m) = t.get("mcp") {
                    writeln!(out, "  definition: {}", m["pin"].as_str().unwrap_or(""))?;
                    if !m["annotations"].is_null() {
                        println!(
                            "  annotations (hints from the server, not trusted): {}",
                            m["annotations"]
                        );
                    }
                    if let Some(at) = m["catalog_refreshed_at"].as_str() {
                        println!("  listed by the server at {at}");
                    }
                    if let Some(diff) = m["diff"].as_str() {
                        println!("  {}", diff.trim_end().replace('\n', "\n  "));
                    }
                }
                writeln!(
                    out,
                    "  parameters: {}\n",
                    serde_json::to_string_pretty(&t["parameters"])?.replace('\n', "\n  ")
                )?;
                if let Some(status) = t["details"]["sandbox_status"].as_str() {
                    writeln!(out, "  sandbox: {status} (sandbox = {})\n", t["details"]["sandbox"])?;
                } else if let Some(sandbox) = t["details"]["sandbox"].as_str() {
                    // An MCP server's: one line saying how it is confined, or that it is not.
                    writeln!(out, "  sandbox: {sandbox}\n")?;
                }
                if let Some(why) = t["details"]["unusable"].as_str() {
                    writeln!(out, "  UNUSABLE: {why}\n")?;
                }
            }
            if all {
                super::mcp::print_not_usable(&mut out, &not_usable)?;
            }
            return Ok(0);
        }
    };
    writeln!(
        std::io::stdout().lock(),
        "{}",
        serde_json::to_string_pretty(&out)?
    )?;
    Ok(0)
}

/// Every registered tool as `vaultd tools --json` shows it, an MCP tool with its definition's
/// state (`mcp`).
fn describe(registry: &Registry, mcp: &McpSource, journal: Option<&Journal>) -> Value {
    let mut described = registry.describe();
    if let Some(list) = described.as_array_mut() {
        for t in list.iter_mut() {
            let name = t["name"].as_str().unwrap_or("").to_string();
            if let Some(extra) = journal.and_then(|j| mcp.describe(j, &name)) {
                t["mcp"] = extra;
            }
        }
    }
    described
}

/// The tools whose calls may run now, described: what `vaultd mcp serve` offers.
pub(super) fn runnable(config: &Config) -> Result<Vec<Value>> {
    let (registry, mcp, journal) = mcp_registry_for(config)?;
    let described = describe(&registry, &mcp, journal.as_deref());
    let list = described.as_array().cloned().unwrap_or_default();
    Ok(list.into_iter().filter(may_run).collect())
}

/// Whether a described tool's calls may run: usable, and for an MCP tool, its definition
/// accepted as it is now.
fn may_run(t: &Value) -> bool {
    let mcp = t["source"].as_str().is_some_and(|s| s.starts_with("mcp:"));
    t["details"]["unusable"].is_null() && (!mcp || t["mcp"]["may_run"] == json!(true))
}

/// The ready-to-use list for a model (`--format openai|anthropic`, docs/design.md §10.4) carries only
/// definitions whose calls may run: an MCP tool changed since accepted (or new, never
/// accepted) or any unusable tool is left out and named on stderr, so an unaccepted
/// description never reaches the model.
pub(super) fn only_runnable(list: Vec<Value>) -> Vec<Value> {
    let (runnable, left_out): (Vec<Value>, Vec<Value>) = list.into_iter().partition(may_run);
    for t in &left_out {
        let why = t["details"]["unusable"]
            .as_str()
            .map(|w| format!("unusable: {w}"))
            .or_else(|| t["mcp"]["pin"].as_str().map(str::to_owned))
            .unwrap_or_else(|| "its definition's state is unknown".to_owned());
        eprintln!(
            "left out {}: {}",
            escape_controls(t["name"].as_str().unwrap_or("")),
            escape_controls(&why)
        );
    }
    runnable
}
