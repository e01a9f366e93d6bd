//! What a command tool's call would do, for a dry run (docs/design.md §12.1): the exact argv the
//! program would get, rendered by the same [`render_args`] the call runs with, and the
//! sandbox it would run in (mode, network, what it may read and write, its limits). Pure: no
//! scratch dir is made, no path is opened, nothing is started.

use super::config::{Cwd, EnvValue};
use super::{CommandTool, render_args};
use crate::tools::ToolCall;
use serde_json::{Map, Value, json};

impl CommandTool {
    /// The `would` of a preview: argv, program, working folder, environment and sandbox.
    pub(super) fn would(&self, call: ToolCall<'_>) -> Value {
        let c = &self.config;
        let argv: Vec<String> = std::iter::once(c.argv0.clone())
            .chain(render_args(&c.args, call.parameters, &c.schema))
            .collect();
        let mut description = format!(
            "would start {} with {} argument(s), without a shell, in a {} sandbox{}",
            c.program.display(),
            argv.len() - 1,
            c.sandbox.as_str(),
            if c.network { "" } else { " without network" }
        );
        if let Some(why) = &self.unusable {
            // The call would be refused when it runs (`CommandTool::run_call`).
            description = format!("nothing: the call would get POLICY_DENIED: {why}");
        }
        json!({
            "description": description,
            "argv": argv,
            "program": c.program,
            "cwd": match c.cwd {
                Cwd::Vault => "the vault (read-only unless listed in writable)",
                Cwd::Scratch => "a fresh scratch folder, removed after the call",
            },
            "env": self.env_shown(),
            "sandbox": self.sandbox_shown(),
        })
    }

    /// The environment the program gets: vaultd's few variables and the tool's `env`, secret
    /// values named, never shown.
    fn env_shown(&self) -> Value {
        let mut env = Map::new();
        for name in ["PATH", "LANG"] {
            env.insert(name.into(), json!("(from vaultd's environment)"));
        }
        env.insert("HOME".into(), json!("(the call's scratch folder)"));
        env.insert(
            "TMPDIR".into(),
            json!("(tmp/ in the call's scratch folder)"),
        );
        env.insert("VAULTD_NOTE_ID".into(), json!("(the note's tool_note)"));
        env.insert("VAULTD_CALL_ID".into(), json!("(this call's id)"));
        for (key, value) in &self.config.env {
            let shown = match value {
                EnvValue::Plain(v) => json!(v),
                EnvValue::Secret(_) => json!("(a secret, redacted)"),
            };
            env.insert(key.clone(), shown);
        }
        Value::Object(env)
    }

    /// The sandbox the call would run in (docs/design.md §10.5), as configured and as this kernel
    /// enforces it.
    fn sandbox_shown(&self) -> Value {
        let c = &self.config;
        let mut read = vec![
            "the system folders (/usr, /lib, /etc, …)".to_string(),
            format!("the vault ({})", self.vault.display()),
            c.program.display().to_string(),
        ];
        read.extend(c.read.iter().map(|p| p.display().to_string()));
        let mut writable = vec!["the call's scratch folder (HOME, TMPDIR)".to_string()];
        writable.extend(
            c.writable
                .iter()
                .map(|p| format!("{} (in the vault)", p.display())),
        );
        json!({
            "mode": c.sandbox.as_str(),
            "network": c.network,
            "read": read,
            "writable": writable,
            "limits": {
                "timeout": humantime::format_duration(c.timeout).to_string(),
                "cpu_seconds": c.timeout.as_secs() + 1,
                "max_memory": c.max_memory,
                "max_processes": c.max_processes,
                "max_output_bytes": c.max_output_bytes,
            },
            "enforced": format!("{}; {}", self.support.describe(), self.cgroups.describe()),
            "unusable": self.unusable,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::config::{self, CommandToolConfig, Output, SandboxMode};
    use super::*;
    use crate::tools::Effect;
    use crate::tools::sandbox::cgroup::Cgroups;
    use std::path::PathBuf;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    fn tool(args: &[&str], env: &[(&str, EnvValue)]) -> CommandTool {
        let schema = json!({ "type": "object", "properties": { "path": { "type": "string" }, "n": { "type": "integer" } } });
        let cfg = CommandToolConfig {
            name: "wc".into(),
            description: String::new(),
            program: PathBuf::from("/usr/bin/wc"),
            args: args
                .iter()
                .map(|a| config::parse_template(a).unwrap())
                .collect(),
            argv0: "wc".into(),
            schema: schema.clone(),
            effect: Effect::ReadOnly,
            approval: crate::tools::ApprovalRule::Never,
            enabled: true,
            timeout: Duration::from_secs(7),
            rate_limit: Default::default(),
            output: Output::Text,
            cwd: Cwd::Vault,
            writable: vec![PathBuf::from("Agent/out")],
            read: vec![PathBuf::from("/opt/tools")],
            network: false,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            max_output_bytes: 1000,
            max_memory: 2000,
            max_processes: 3,
            sandbox: SandboxMode::Required,
        };
        CommandTool {
            spec: crate::tools::ToolSpec {
                name: "wc".into(),
                description: String::new(),
                source: crate::tools::Source::Command,
                effect: Effect::ReadOnly,
                schema,
            },
            config: cfg,
            vault: PathBuf::from("/v"),
            scratch_root: PathBuf::from("/s"),
            support: Arc::new(super::super::sandbox::Support::probe()),
            cgroups: Cgroups::shared(),
            filter: None,
            unusable: None,
        }
    }

    fn would(tool: &CommandTool, params: Value) -> Value {
        let params = params.as_object().unwrap().clone();
        tool.would(ToolCall {
            call_id: "c-1",
            note: "n.md",
            note_id: "",
            parameters: &params,
            deadline: Instant::now(),
            answer: None,
        })
    }

    #[test]
    fn the_argv_is_rendered_as_the_call_would_run_it() {
        let t = tool(&["-l", "--", "{path}", "-n={n}"], &[]);
        // A hostile value stays one argument, exactly as the program would get it.
        let w = would(&t, json!({ "path": "a b; $(rm -rf ~)", "n": 2 }));
        assert_eq!(
            w["argv"],
            json!(["wc", "-l", "--", "a b; $(rm -rf ~)", "-n=2"])
        );
        assert_eq!(w["program"], "/usr/bin/wc");
        // An absent optional parameter leaves its argument out, as when it runs.
        let w = would(&t, json!({ "path": "x" }));
        assert_eq!(w["argv"], json!(["wc", "-l", "--", "x"]));
    }

    #[test]
    fn the_sandbox_names_mode_network_paths_and_limits() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "hunter2").unwrap();
        let secret = crate::secret::Secret::resolve(&format!("file:{}", file.display())).unwrap();
        let t = tool(
            &[],
            &[
                ("MODE", EnvValue::Plain("fast".into())),
                ("TOKEN", EnvValue::Secret(secret)),
            ],
        );
        let w = would(&t, json!({}));
        let s = &w["sandbox"];
        assert_eq!(s["mode"], "required");
        assert_eq!(s["network"], false);
        assert!(s["writable"].to_string().contains("Agent/out"), "{s}");
        assert!(s["read"].to_string().contains("/opt/tools"), "{s}");
        assert_eq!(s["limits"]["timeout"], "7s");
        assert_eq!(s["limits"]["max_memory"], 2000);
        assert_eq!(s["limits"]["max_processes"], 3);
        assert_eq!(s["limits"]["max_output_bytes"], 1000);
        assert_eq!(w["env"]["MODE"], "fast");
        assert!(!w.to_string().contains("hunter2"), "{w}");
    }
}
