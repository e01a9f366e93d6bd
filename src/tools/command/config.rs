//! `[tools.command.NAME]`: the raw TOML table (serde, strict) and its validation into a
//! [`CommandToolConfig`]: the schema compiled, the argv template checked against it, the
//! program found, secrets resolved. Every error names the file, line and key.

use crate::config::table::{ConfigError, RateLimit, TableContext};
use crate::secret::Secret;
use crate::tools::sandbox::protect::Protected;
use crate::tools::{ApprovalRule, Effect};
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use toml::Spanned;

/// One `[tools.command.NAME]` table exactly as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCommandTool {
    pub description: Spanned<String>,
    pub argv: Spanned<Vec<String>>,
    #[serde(default)]
    pub parameters: Option<Spanned<toml::Value>>,
    #[serde(default)]
    pub effect: Option<Effect>,
    #[serde(default)]
    pub approval: Option<ApprovalRule>,
    #[serde(default)]
    pub enabled: Option<bool>,
    #[serde(default, with = "humantime_serde")]
    pub timeout: Option<Duration>,
    #[serde(default)]
    pub rate_limit: Option<crate::config::table::RawRateLimit>,
    #[serde(default)]
    pub output: Option<Output>,
    #[serde(default)]
    pub cwd: Option<Cwd>,
    #[serde(default)]
    pub writable: Option<Spanned<Vec<String>>>,
    #[serde(default)]
    pub network: Option<bool>,
    /// Extra read-only paths (docs/design.md §10.5): an interpreter under `~/.pyenv`, a venv.
    #[serde(default)]
    pub read: Option<Spanned<Vec<String>>>,
    #[serde(default)]
    pub env: Option<Spanned<BTreeMap<String, String>>>,
    #[serde(default)]
    pub max_output_bytes: Option<usize>,
    #[serde(default)]
    pub max_memory: Option<Spanned<u64>>,
    /// Not in docs/design.md §10.5's list: RLIMIT_NPROC is per user, so the limit is this many
    /// tasks on top of those already running (docs/tools/command.md).
    #[serde(default)]
    pub max_processes: Option<Spanned<u64>>,
    #[serde(default)]
    pub sandbox: Option<SandboxMode>,
}

/// `output`: how stdout becomes `data.stdout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Output {
    Text,
    Json,
}

/// `cwd`: where the program starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cwd {
    Vault,
    Scratch,
}

/// `sandbox`: whether a kernel without (full) Landlock may run the tool at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxMode {
    Required,
    BestEffort,
}

impl SandboxMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxMode::Required => "required",
            SandboxMode::BestEffort => "best_effort",
        }
    }
}

/// One piece of an argv element: text as written, or a parameter's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    Param(String),
}

/// An environment entry: plain text, or a secret reference resolved at start (redacted).
#[derive(Debug, Clone)]
pub enum EnvValue {
    Plain(String),
    Secret(Secret),
}

impl EnvValue {
    /// The value of variable `var` as written: a secret reference (`env:`, `file:`,
    /// `credential:`) is loaded (and redacted wherever it appears), anything else is plain
    /// text, shown as written, unless it looks like a credential (refused: docs/design.md
    /// §10.4).
    pub fn load(
        var: &str,
        value: &str,
        skip_secrets: bool,
    ) -> Result<EnvValue, crate::secret::SecretError> {
        let is_reference = ["env:", "file:", "credential:"]
            .iter()
            .any(|p| value.starts_with(p));
        if is_reference {
            Ok(EnvValue::Secret(Secret::load(value, skip_secrets)?))
        } else if crate::secret::literal_credential(var, value) {
            Err(crate::secret::SecretError::LiteralCredential(var.into()))
        } else {
            Ok(EnvValue::Plain(value.to_string()))
        }
    }

    /// How `vaultd config` shows it: a secret as its reference only.
    pub fn shown(&self) -> String {
        match self {
            EnvValue::Plain(s) => s.clone(),
            EnvValue::Secret(s) => format!("{} [redacted]", s.reference()),
        }
    }

    pub fn value(&self) -> &str {
        match self {
            EnvValue::Plain(s) => s,
            EnvValue::Secret(s) => s.expose(),
        }
    }
}

pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 1024 * 1024;
pub const DEFAULT_MAX_MEMORY: u64 = 1024 * 1024 * 1024;
pub const DEFAULT_MAX_PROCESSES: u64 = 64;
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// A command tool, validated: nothing downstream re-checks it.
#[derive(Debug, Clone)]
pub struct CommandToolConfig {
    pub name: String,
    pub description: String,
    /// The program, resolved to an absolute path at start (a missing program stops `run`).
    pub program: PathBuf,
    /// argv[1..] as templates; argv[0] is `program` as written.
    pub args: Vec<Vec<Piece>>,
    pub argv0: String,
    /// The JSON Schema of the parameters, `additionalProperties: false` added when absent.
    pub schema: Value,
    pub effect: Effect,
    pub approval: ApprovalRule,
    pub enabled: bool,
    pub timeout: Duration,
    pub rate_limit: RateLimit,
    pub output: Output,
    pub cwd: Cwd,
    /// Vault folders the program may write, besides its scratch dir: relative to the vault,
    /// opened at every call without following a symlink (`tools::sandbox::paths`).
    pub writable: Vec<PathBuf>,
    /// Absolute paths the program may read (and execute), opened the same way.
    pub read: Vec<PathBuf>,
    pub network: bool,
    pub env: BTreeMap<String, EnvValue>,
    pub max_output_bytes: usize,
    pub max_memory: u64,
    pub max_processes: u64,
    pub sandbox: SandboxMode,
}

/// Every command tool of the config, with what their sandbox needs to know.
#[derive(Debug, Clone, Default)]
pub struct CommandTools {
    pub tools: Vec<CommandToolConfig>,
    /// The vault root (read-only to every tool; `cwd = "vault"`).
    pub vault: PathBuf,
    /// Where each call's fresh scratch dir is made (`<state_dir>/scratch`).
    pub scratch_root: PathBuf,
}

/// Every secret in an `env` table, for the one redactor.
impl crate::secret::SecretHolder for CommandTools {
    fn secrets(&self) -> Vec<&Secret> {
        self.tools
            .iter()
            .flat_map(|t| t.env.values())
            .filter_map(|v| match v {
                EnvValue::Secret(s) => Some(s),
                EnvValue::Plain(_) => None,
            })
            .collect()
    }
}

/// Where in the config file an error is: the tool whose table holds the offending value.
struct At<'a> {
    cx: &'a TableContext<'a>,
    tool: &'a str,
}

impl At<'_> {
    fn err(&self, key: &str, span: std::ops::Range<usize>, message: String) -> ConfigError {
        let key = if key.is_empty() {
            format!("tools.command.{}", self.tool)
        } else {
            format!("tools.command.{}.{key}", self.tool)
        };
        self.cx.invalid_at(&key, span, message)
    }
}

/// Validates every `[tools.command.NAME]` table: paths relative to the config file's folder,
/// secrets resolved unless `cx.skip_secrets`.
pub fn validate(
    raw: BTreeMap<String, Spanned<RawCommandTool>>,
    cx: &TableContext,
) -> Result<CommandTools, ConfigError> {
    let protected = Protected {
        vault: cx.vault,
        state_dir: cx.state_dir,
        config: cx.path,
        folders: cx.folders,
    };
    let mut tools = Vec::new();
    for (name, table) in raw {
        let span = table.span();
        let at = At { cx, tool: &name };
        if !valid_tool_name(&name) {
            return Err(at.err(
                "",
                span,
                "a tool name is letters, digits, `_` and `-` (at most 64), not starting with `mcp__`".into(),
            ));
        }
        tools.push(validate_one(
            name.clone(),
            table.into_inner(),
            &at,
            &protected,
        )?);
    }
    Ok(CommandTools {
        tools,
        vault: cx.vault.to_path_buf(),
        scratch_root: cx.state_dir.join("scratch"),
    })
}

fn valid_tool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with("mcp__")
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn validate_one(
    name: String,
    raw: RawCommandTool,
    at: &At<'_>,
    protected: &Protected<'_>,
) -> Result<CommandToolConfig, ConfigError> {
    let base = at.cx.base;
    let schema = compile_schema(raw.parameters, &raw.argv, at)?;
    let (program, argv0, args) = check_argv(raw.argv, &schema, base, at)?;

    let effect = raw.effect.unwrap_or(Effect::ExternalSideEffect);
    let writable = checked_writable(raw.writable, at, protected)?;
    let read = checked_read(raw.read, base, at, protected)?;
    let env = checked_env(raw.env, &name, at)?;
    let max_memory = match raw.max_memory {
        Some(m) if *m.get_ref() < 16 * 1024 * 1024 => {
            return Err(at.err(
                "max_memory",
                m.span(),
                "must be at least 16 MiB (16777216 bytes): a program needs room to start".into(),
            ));
        }
        Some(m) => m.into_inner(),
        None => DEFAULT_MAX_MEMORY,
    };
    let max_processes = match raw.max_processes {
        Some(n) if *n.get_ref() == 0 => {
            return Err(at.err(
                "max_processes",
                n.span(),
                "must be at least 1: the program itself is one".into(),
            ));
        }
        Some(n) => n.into_inner(),
        None => DEFAULT_MAX_PROCESSES,
    };
    let rate_limit = raw
        .rate_limit
        .map(|r| RateLimit {
            per_hour: r.per_hour,
            per_day: r.per_day,
        })
        .unwrap_or_default();
    Ok(CommandToolConfig {
        description: raw.description.into_inner(),
        program,
        argv0,
        args,
        schema,
        effect,
        approval: raw
            .approval
            .unwrap_or_else(|| ApprovalRule::default_for(effect)),
        enabled: raw.enabled.unwrap_or(true),
        timeout: raw.timeout.unwrap_or(DEFAULT_TIMEOUT),
        rate_limit,
        output: raw.output.unwrap_or(Output::Text),
        cwd: raw.cwd.unwrap_or(Cwd::Vault),
        writable,
        read,
        network: raw.network.unwrap_or(false),
        env,
        max_output_bytes: raw.max_output_bytes.unwrap_or(DEFAULT_MAX_OUTPUT_BYTES),
        max_memory,
        max_processes,
        sandbox: raw.sandbox.unwrap_or(SandboxMode::Required),
        name,
    })
}

/// validate_one's schema stage: `parameters` compiled (an empty object schema when absent,
/// its errors then pointing at `argv`).
fn compile_schema(
    parameters: Option<Spanned<toml::Value>>,
    argv: &Spanned<Vec<String>>,
    at: &At<'_>,
) -> Result<Value, ConfigError> {
    // parameters: JSON Schema written in TOML, compiled now.
    let (schema, schema_span) = match parameters {
        Some(p) => {
            let span = p.span();
            let json = serde_json::to_value(p.into_inner())
                .map_err(|e| at.err("parameters", span.clone(), e.to_string()))?;
            (json, span)
        }
        None => (
            serde_json::json!({ "type": "object", "properties": {} }),
            argv.span(),
        ),
    };
    let schema =
        normalise_schema(schema).map_err(|m| at.err("parameters", schema_span.clone(), m))?;
    jsonschema::options().build(&schema).map_err(|e| {
        at.err(
            "parameters",
            schema_span.clone(),
            format!("the JSON Schema does not compile: {e}"),
        )
    })?;
    Ok(schema)
}

/// validate_one's argv stage: the program found, and the rest parsed as templates: the
/// program's path, argv[0] as written and the templates.
fn check_argv(
    argv: Spanned<Vec<String>>,
    schema: &Value,
    base: &Path,
    at: &At<'_>,
) -> Result<(PathBuf, String, Vec<Vec<Piece>>), ConfigError> {
    // argv: a program and templates, each placeholder a scalar parameter.
    let argv_span = argv.span();
    let argv = argv.into_inner();
    let Some((argv0, rest)) = argv.split_first() else {
        return Err(at.err(
            "argv",
            argv_span,
            "argv is empty: give the program and its arguments".into(),
        ));
    };
    if !parse_template(argv0)
        .map_err(|m| at.err("argv", argv_span.clone(), m))?
        .iter()
        .all(|p| matches!(p, Piece::Text(_)))
    {
        return Err(at.err(
            "argv",
            argv_span,
            "the program (argv[0]) cannot be a parameter".into(),
        ));
    }
    let program = find_program(argv0, base)
        .ok_or_else(|| at.err("argv", argv_span.clone(), format!("program `{argv0}` not found (looked in $PATH, or as a path relative to the config file) or not executable")))?;
    let mut args = Vec::new();
    for arg in rest {
        let pieces = parse_template(arg).map_err(|m| at.err("argv", argv_span.clone(), m))?;
        for piece in &pieces {
            if let Piece::Param(p) = piece {
                check_scalar_param(schema, p).map_err(|m| at.err("argv", argv_span.clone(), m))?;
            }
        }
        args.push(pieces);
    }
    Ok((program, argv0.clone(), args))
}

/// validate_one's `writable` stage: each folder checked, relative to the vault.
fn checked_writable(
    writable: Option<Spanned<Vec<String>>>,
    at: &At<'_>,
    protected: &Protected<'_>,
) -> Result<Vec<PathBuf>, ConfigError> {
    let mut checked = Vec::new();
    if let Some(w) = writable {
        let span = w.span();
        for folder in w.into_inner() {
            let rel = protected
                .check_writable(&folder)
                .map_err(|m| at.err("writable", span.clone(), m))?;
            checked.push(rel);
        }
    }
    Ok(checked)
}

/// validate_one's `read` stage: each entry checked, made absolute.
fn checked_read(
    read: Option<Spanned<Vec<String>>>,
    base: &Path,
    at: &At<'_>,
    protected: &Protected<'_>,
) -> Result<Vec<PathBuf>, ConfigError> {
    let mut checked = Vec::new();
    if let Some(r) = read {
        let span = r.span();
        for entry in r.into_inner() {
            let abs = protected
                .check_read(&entry, base)
                .map_err(|m| at.err("read", span.clone(), m))?;
            checked.push(abs);
        }
    }
    Ok(checked)
}

/// validate_one's `env` stage: each name checked, each value loaded (a secret resolved).
fn checked_env(
    env: Option<Spanned<BTreeMap<String, String>>>,
    name: &str,
    at: &At<'_>,
) -> Result<BTreeMap<String, EnvValue>, ConfigError> {
    let mut checked = BTreeMap::new();
    if let Some(e) = env {
        let span = e.span();
        for (key, value) in e.into_inner() {
            if key.is_empty() || key.contains('=') || key.contains('\0') {
                return Err(at.err("env", span, format!("`{key}` is not a variable name")));
            }
            if matches!(
                key.as_str(),
                "PATH" | "HOME" | "LANG" | "TMPDIR" | "VAULTD_NOTE_ID" | "VAULTD_CALL_ID"
            ) {
                return Err(at.err(
                    "env",
                    span,
                    format!("`{key}` is set by vaultd and cannot be overridden"),
                ));
            }
            let v = EnvValue::load(&key, &value, at.cx.skip_secrets).map_err(|source| {
                ConfigError::Secret {
                    path: at.cx.path.to_path_buf(),
                    key: format!("tools.command.{name}.env.{key}"),
                    source,
                }
            })?;
            checked.insert(key, v);
        }
    }
    Ok(checked)
}

/// The schema must describe an object; misspelt parameters are errors, so
/// `additionalProperties: false` is added when the config does not say.
fn normalise_schema(mut schema: Value) -> Result<Value, String> {
    let Some(obj) = schema.as_object_mut() else {
        return Err("must be a table (a JSON Schema of `type = \"object\"`)".into());
    };
    match obj.get("type") {
        None => {
            obj.insert("type".into(), Value::String("object".into()));
        }
        Some(Value::String(t)) if t == "object" => {}
        Some(other) => return Err(format!("type must be \"object\", not {other}")),
    }
    obj.entry("properties")
        .or_insert_with(|| Value::Object(Default::default()));
    obj.entry("additionalProperties")
        .or_insert(Value::Bool(false));
    Ok(schema)
}

/// A placeholder must name a property whose type is a scalar (string, number, integer,
/// boolean): only those have one obvious spelling as one argument.
fn check_scalar_param(schema: &Value, name: &str) -> Result<(), String> {
    let Some(prop) = schema.get("properties").and_then(|p| p.get(name)) else {
        return Err(format!(
            "`{{{name}}}` names no parameter: `{name}` is not in parameters.properties"
        ));
    };
    let scalar = |t: &str| matches!(t, "string" | "number" | "integer" | "boolean");
    let ok = match prop.get("type") {
        Some(Value::String(t)) => scalar(t),
        Some(Value::Array(ts)) => {
            !ts.is_empty() && ts.iter().all(|t| t.as_str().is_some_and(scalar))
        }
        _ => prop
            .get("enum")
            .and_then(Value::as_array)
            .is_some_and(|vs| {
                vs.iter()
                    .all(|v| !v.is_object() && !v.is_array() && !v.is_null())
            }),
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{{{name}}}` is used in argv, so parameter `{name}` must have a scalar type (string, number, integer or boolean)"
        ))
    }
}

/// Splits one argv element into text and `{param}` placeholders. `{{` and `}}` stand for
/// literal braces; a brace pair around anything but a name (`{print $1}`) is text.
pub fn parse_template(arg: &str) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut rest = arg;
    while let Some(c) = rest.chars().next() {
        if let Some(after) = rest.strip_prefix("{{") {
            text.push('{');
            rest = after;
            continue;
        }
        if let Some(after) = rest.strip_prefix("}}") {
            text.push('}');
            rest = after;
            continue;
        }
        if c == '{'
            && let Some(end) = rest.find('}')
        {
            let name = &rest[1..end];
            if is_param_name(name) {
                if !text.is_empty() {
                    pieces.push(Piece::Text(std::mem::take(&mut text)));
                }
                pieces.push(Piece::Param(name.to_string()));
                rest = &rest[end + 1..];
                continue;
            }
        }
        text.push(c);
        rest = &rest[c.len_utf8()..];
    }
    if !text.is_empty() || pieces.is_empty() {
        pieces.push(Piece::Text(text));
    }
    Ok(pieces)
}

fn is_param_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// The program as an absolute path: a name is looked up in `$PATH`, a path with a `/` is
/// taken relative to the config file's folder.
fn find_program(program: &str, base: &Path) -> Option<PathBuf> {
    let executable = |p: &Path| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p)
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    if program.is_empty() {
        return None;
    }
    if program.contains('/') {
        let p = crate::home::expand_tilde(program);
        let p = if p.is_relative() { base.join(p) } else { p };
        return executable(&p).then(|| std::path::absolute(&p).unwrap_or(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| DEFAULT_PATH.into());
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_absolute() && executable(p))
}

/// `PATH` for the program when vaultd itself has none.
pub const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_names_in_braces_and_the_rest_is_text() {
        assert_eq!(
            parse_template("--file={path}.md").unwrap(),
            vec![
                Piece::Text("--file=".into()),
                Piece::Param("path".into()),
                Piece::Text(".md".into())
            ]
        );
        assert_eq!(
            parse_template("{print $1}").unwrap(),
            vec![Piece::Text("{print $1}".into())]
        );
        assert_eq!(
            parse_template("{{x}}").unwrap(),
            vec![Piece::Text("{x}".into())]
        );
        assert_eq!(parse_template("").unwrap(), vec![Piece::Text("".into())]);
        assert_eq!(
            parse_template("{a}{b}").unwrap(),
            vec![Piece::Param("a".into()), Piece::Param("b".into())]
        );
    }

    #[test]
    fn only_scalar_parameters_may_be_placeholders() {
        let schema = serde_json::json!({ "properties": {
            "s": { "type": "string" }, "n": { "type": ["integer", "string"] },
            "list": { "type": "array" }, "untyped": {}, "e": { "enum": ["a", "b"] } } });
        assert!(check_scalar_param(&schema, "s").is_ok());
        assert!(check_scalar_param(&schema, "n").is_ok());
        assert!(check_scalar_param(&schema, "e").is_ok());
        assert!(check_scalar_param(&schema, "list").is_err());
        assert!(check_scalar_param(&schema, "untyped").is_err());
        assert!(
            check_scalar_param(&schema, "missing")
                .unwrap_err()
                .contains("names no parameter")
        );
    }

    #[test]
    fn a_schema_gets_object_type_and_no_extra_properties() {
        let s = normalise_schema(serde_json::json!({ "properties": {} })).unwrap();
        assert_eq!(s["type"], "object");
        assert_eq!(s["additionalProperties"], false);
        assert!(normalise_schema(serde_json::json!({ "type": "string" })).is_err());
    }
}
