//! `vaultd mcp login NAME` and `vaultd mcp logout NAME`: OAuth for a streamable-HTTP server
//! (docs/design.md §10.4; the protocol is in `tools::mcp::oauth`).

use super::{GlobalArgs, escape_controls, read_only};
use crate::config;
use crate::tools::mcp::config::{McpServerConfig, Transport};
use crate::tools::mcp::oauth::{self, LOGIN_WAIT};
use anyhow::{Context, Result, bail};
use clap::Args;

#[derive(Debug, Args)]
pub struct LoginArgs {
    /// The server, as named in `[mcp.NAME]` (a `url` server).
    name: String,
    /// A scope to ask for (repeat for more); default: `[mcp.NAME.oauth] scopes`, else what the
    /// server asks for.
    #[arg(long = "scope", value_name = "SCOPE")]
    scopes: Vec<String>,
    /// Print the address to open instead of opening a browser ($BROWSER, else xdg-open), and
    /// also take the address the browser ended on, pasted (a browser on another machine).
    #[arg(long)]
    no_browser: bool,
    /// How long to wait for the browser to come back.
    #[arg(long, value_name = "DURATION", default_value = "5m")]
    wait: humantime::Duration,
}

#[derive(Debug, Args)]
pub struct LogoutArgs {
    /// The server, as named in `[mcp.NAME]`.
    name: String,
}

/// The `[mcp.NAME]` of a `url` server, with its token file and OAuth client.
fn http_server(g: &GlobalArgs, name: &str) -> Result<(config::Config, McpServerConfig)> {
    let config = config::load(&read_only(g))?;
    let Some(server) = config.mcp.iter().find(|s| s.name == name).cloned() else {
        let names: Vec<&str> = config.mcp.iter().map(|s| s.name.as_str()).collect();
        bail!(
            "no MCP server `{}` in the config (configured: {})",
            escape_controls(name),
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            }
        );
    };
    if !matches!(server.transport, Transport::Http { .. }) {
        bail!(
            "`{name}` is a stdio server: it runs here and takes its credentials in `env`; only a `url` server logs in with OAuth"
        );
    }
    Ok((config, server))
}

pub(super) fn login(g: &GlobalArgs, args: LoginArgs) -> Result<i32> {
    let (_, server) = http_server(g, &args.name)?;
    let Transport::Http { url, oauth, .. } = &server.transport else {
        unreachable!("checked by http_server")
    };
    let (tokens, client) = oauth.as_ref();
    let mut client = client.clone();
    if let Some(secret) = &client.client_secret
        && let Some(why) = secret.why_unresolved()
    {
        bail!(
            "mcp.{}.oauth.client_secret ({}) cannot be read here: {why}",
            args.name,
            secret.reference()
        );
    }
    if !args.scopes.is_empty() {
        client.scopes = args.scopes.clone();
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let http = reqwest::Client::builder()
        .build()
        .context("cannot build an HTTP client")?;
    let no_browser = args.no_browser;
    let logged_in = runtime.block_on(oauth::login(
        url,
        tokens.clone(),
        &client,
        &http,
        |address| {
            if no_browser {
                eprintln!("Open this address in a browser to log in:\n\n  {address}\n");
            } else {
                oauth::open_browser(address);
            }
        },
        std::time::Duration::from(args.wait).min(LOGIN_WAIT * 12),
        no_browser,
    ));
    // A read of the pasted address may still wait on stdin: not waited for.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    let logged_in =
        logged_in.map_err(|e| anyhow::anyhow!("login to `{}` failed: {e}", args.name))?;
    println!(
        "logged in to {} ({}); scopes: {}; tokens kept in {} (the daemon sends and refreshes them)",
        args.name,
        url,
        if logged_in.scopes.is_empty() {
            "none named".to_string()
        } else {
            logged_in.scopes.join(" ")
        },
        logged_in.path.display()
    );
    Ok(0)
}

pub(super) fn logout(g: &GlobalArgs, args: LogoutArgs) -> Result<i32> {
    let (_, server) = http_server(g, &args.name)?;
    let Transport::Http { oauth, .. } = &server.transport else {
        unreachable!("checked by http_server")
    };
    let tokens = &oauth.0;
    if tokens.remove().map_err(anyhow::Error::msg)? {
        println!(
            "logged out of {}: {} removed",
            args.name,
            tokens.path().display()
        );
    } else {
        println!("{} had no login", args.name);
    }
    Ok(0)
}
