//! The path of the in-tree MCP test server, built on first use (also included by
//! benches/load.rs, so it uses nothing else from tests/util).
//!
//! The server is a package of its own (tests/mcp-test-server/), so that `cargo install --path .`
//! installs vaultd alone. Cargo hands a package's tests the paths of that package's binaries
//! only (`CARGO_BIN_EXE_*`; artifact dependencies, which would cover another package's, are
//! unstable). So the first caller in a test process builds the server with the cargo that runs
//! the tests (`$CARGO`), with the same profile and into the same target directory as the
//! `vaultd` under test, and every caller gets that path. A no-op build when it is up to date; a
//! filtered run (`cargo test --test main mcp::`) gets a server built from the current source,
//! as the whole suite does.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// `$VAULTD_MCP_TEST_SERVER`, else the server built beside the `vaultd` under test.
pub fn mcp_test_server() -> PathBuf {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match BUILT.get_or_init(build) {
        Ok(path) => path.clone(),
        Err(why) => panic!("the MCP test server: {why}"),
    }
}

fn build() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("VAULTD_MCP_TEST_SERVER") {
        return Ok(PathBuf::from(p));
    }
    let vaultd = PathBuf::from(env!("CARGO_BIN_EXE_vaultd"));
    let profile_dir = vaultd
        .parent()
        .ok_or_else(|| format!("{} has no folder", vaultd.display()))?;
    let server = profile_dir.join("vaultd-mcp-test-server");
    let Some(cargo) = std::env::var_os("CARGO") else {
        // A test binary started by hand, not by cargo: the server must be there already.
        return if server.is_file() {
            Ok(server)
        } else {
            Err(format!(
                "{} is missing and $CARGO is unset: build it with `cargo build -p vaultd-mcp-test-server` (or set VAULTD_MCP_TEST_SERVER)",
                server.display()
            ))
        };
    };
    // target/<dir>/vaultd: the dev profile's folder is `debug`, every other is named after it.
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev",
        Some(other) => other,
    };
    let target_dir = profile_dir
        .parent()
        .ok_or_else(|| format!("{} has no target folder", profile_dir.display()))?;
    let out = Command::new(&cargo)
        .args([
            "build",
            "--quiet",
            "-p",
            "vaultd-mcp-test-server",
            "--profile",
            profile,
        ])
        .arg("--manifest-path")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", PathBuf::from(&cargo).display()))?;
    if !out.status.success() {
        return Err(format!(
            "`cargo build -p vaultd-mcp-test-server --profile {profile}` failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    if !server.is_file() {
        return Err(format!(
            "built, but {} is not there (a --target build?): set VAULTD_MCP_TEST_SERVER",
            server.display()
        ));
    }
    Ok(server)
}
