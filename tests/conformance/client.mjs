// The client the MCP conformance suite runs for tests/conformance.rs: vaultd itself, driven
// the way a person and an agent drive it. The suite starts a scenario server and runs
// `node client.mjs URL`; this makes a temporary vault whose config has `[mcp.c] url = URL`,
// drops a note with the calls an agent would write and runs `vaultd once` (the real binary,
// VAULTD_BIN). The processed note is copied to VAULTD_CONFORMANCE_NOTE for the Rust test to
// read the results; the exit code is vaultd's.
//
// The calls come from VAULTD_CONFORMANCE_CALLS (a JSON array of [tool, arguments]), or from
// the suite's own MCP_CONFORMANCE_CONTEXT (`toolCalls`) when the scenario gives them. An
// argument written "<inputSchema of TOOL>" is what an agent reads in `vaultd tools --json`:
// then vaultd runs once first to list the server's tools, and the value is TOOL's schema as
// vaultd keeps it.
import { spawn, spawnSync } from "node:child_process";
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const url = process.argv[2];
const bin = process.env.VAULTD_BIN;
const out = process.env.VAULTD_CONFORMANCE_NOTE;
if (!url || !bin || !out) {
  console.error("usage: VAULTD_BIN=… VAULTD_CONFORMANCE_NOTE=… node client.mjs URL");
  process.exit(2);
}
const context = JSON.parse(process.env.MCP_CONFORMANCE_CONTEXT || "{}");
const scenario = process.env.MCP_CONFORMANCE_SCENARIO ?? "";
let calls = JSON.parse(process.env.VAULTD_CONFORMANCE_CALLS || "[]");
if (Array.isArray(context.toolCalls)) {
  calls = context.toolCalls.map((c) => [c.name, c.arguments ?? {}]);
}

const work = mkdtempSync(join(tmpdir(), "vaultd-conformance-"));
const vault = join(work, "vault");
mkdirSync(vault);
const config = join(work, "vaultd.toml");

function finish(code) {
  rmSync(work, { recursive: true, force: true });
  process.exit(code);
}

// Every tool may run and none waits for approval: the scenarios test the wire, not policy.
// A pre-registered client of an auth scenario (its context names it) goes in [mcp.c.oauth],
// its secret through the environment as a person would keep it.
function writeConfig(tools) {
  let text = `vault = ${JSON.stringify(vault)}\nstate_dir = ${JSON.stringify(join(work, "state"))}\n`;
  text += `[mcp.c]\nurl = ${JSON.stringify(url)}\nallow = ["*"]\nstart_timeout = "60s"\n`;
  // The client ID metadata document the suite's CIMD scenario expects vaultd to be given.
  if (scenario === "auth/basic-cimd") {
    text += `oauth = { client_metadata_url = "https://conformance-test.local/client-metadata.json" }\n`;
  }
  if (context.client_id) {
    text += `oauth = { client_id = ${JSON.stringify(context.client_id)}`;
    if (context.client_secret) text += `, client_secret = "env:CONFORMANCE_CLIENT_SECRET"`;
    text += ` }\n`;
  }
  for (const t of tools) text += `[mcp.c.tools.${JSON.stringify(t)}]\napproval = "never"\n`;
  writeFileSync(config, text);
}

function vaultd(...args) {
  const r = spawnSync(bin, ["--config", config, ...args], {
    encoding: "utf8",
    env: {
      ...process.env,
      RUST_LOG: "vaultd=debug,rmcp=info",
      CONFORMANCE_CLIENT_SECRET: context.client_secret ?? "",
      // `vaultd mcp login` opens the authorization address with this "browser".
      BROWSER: `${process.execPath} ${join(import.meta.dirname, "browser.mjs")}`,
    },
  });
  process.stderr.write(r.stderr ?? "");
  if (r.status !== 0) {
    console.error(`vaultd ${args.join(" ")} exited with ${r.status}`);
    finish(r.status ?? 1);
  }
  return r.stdout;
}

const placeholder = /^<inputSchema of (.+)>$/;
const wanted = new Set(
  calls.flatMap(([, a]) => Object.values(a).map((v) => typeof v === "string" && v.match(placeholder)?.[1]).filter(Boolean)),
);
if (wanted.size > 0) {
  writeConfig([]);
  vaultd("once");
  const listed = JSON.parse(vaultd("tools", "--json"));
  const schema = (tool) => {
    const t = listed.find((t) => t.name === `mcp__c__${tool}`);
    if (!t) {
      console.error(`vaultd tools does not list mcp__c__${tool}`);
      finish(1);
    }
    return t.parameters;
  };
  calls = calls.map(([name, a]) => [
    name,
    Object.fromEntries(
      Object.entries(a).map(([k, v]) => {
        const m = typeof v === "string" && v.match(placeholder);
        return [k, m ? schema(m[1]) : v];
      }),
    ),
  ]);
}

writeConfig(calls.map(([name]) => name));
// An auth scenario: the person logs in once, then vaultd runs with the kept tokens.
if (scenario === "auth/metadata-var1") {
  await loginPasting();
} else if (scenario.startsWith("auth/")) {
  vaultd("mcp", "login", "c", "--wait", "60s");
}

// `vaultd mcp login --no-browser` as on a machine without one: the person opens the printed
// address elsewhere and pastes the address the browser ended on (here: the redirects followed
// by hand up to the one for 127.0.0.1, which is not loaded).
async function loginPasting() {
  const child = spawn(bin, ["--config", config, "mcp", "login", "c", "--no-browser", "--wait", "60s"], {
    stdio: ["pipe", "inherit", "pipe"],
  });
  let err = "";
  const done = new Promise((resolve) => child.on("close", resolve));
  await new Promise((resolve) =>
    child.stderr.on("data", (d) => {
      err += d;
      if (err.includes("paste that address")) resolve();
    }),
  );
  let at = err.match(/^\s+(http\S+authorize\S+)$/m)[1];
  while (!at.startsWith("http://127.0.0.1")) {
    at = new URL((await fetch(at, { redirect: "manual" })).headers.get("location"), at).href;
  }
  child.stdin.write(at + "\n");
  const code = await done;
  process.stderr.write(err);
  if (code !== 0) {
    console.error(`vaultd mcp login --no-browser exited with ${code}`);
    finish(code ?? 1);
  }
}
if (calls.length > 0) {
  let text = "# Conformance\n";
  for (const [name, parameters] of calls) {
    text += "\n```json\n" + JSON.stringify({ tool_call: { name: `mcp__c__${name}`, parameters } }, null, 2) + "\n```\n";
  }
  mkdirSync(join(vault, "Needs_Action"), { recursive: true });
  const tmp = join(work, "note.tmp");
  writeFileSync(tmp, text);
  renameSync(tmp, join(vault, "Needs_Action", "conformance.md"));
}
vaultd("once");
// A call refused at the server's door (more scope wanted, tokens refused) names the login
// that fixes it: the person logs in again and the agent writes the call again (the note back
// in Needs_Action/).
for (let round = 0; round < 2; round++) {
  const failed = join(vault, "Failed", "conformance.md");
  const text = existsSync(failed) ? readFileSync(failed, "utf8") : "";
  const wanted = text.match(/`vaultd mcp login c( --scope (\S+?))?`/);
  if (!wanted) break;
  vaultd("mcp", "login", "c", ...(wanted[2] ? ["--scope", wanted[2]] : []), "--wait", "60s");
  let again = text;
  for (const [name, parameters] of calls) {
    again += "\n```json\n" + JSON.stringify({ tool_call: { name: `mcp__c__${name}`, parameters } }, null, 2) + "\n```\n";
  }
  writeFileSync(failed, again);
  renameSync(failed, join(vault, "Needs_Action", "conformance.md"));
  vaultd("once");
}
// A server that asks a person (an elicitation in an `input_required` round) leaves the note
// in Pending_Approval with a `tool_answer` block per question: answered as a person would,
// every field `true` (the suite asks yes/no confirmations), approved, run again.
for (let round = 0; round < 3; round++) {
  const held = join(vault, "Pending_Approval", "conformance.md");
  if (!existsSync(held)) break;
  const text = readFileSync(held, "utf8").replace(
    /```json\n(\{\n  "tool_answer"[\s\S]*?)\n```/g,
    (block, json) => {
      const doc = JSON.parse(json);
      const answer = doc.tool_answer.answer;
      for (const k of Object.keys(answer)) if (answer[k] === null) answer[k] = true;
      return "```json\n" + JSON.stringify(doc, null, 2) + "\n```";
    },
  );
  writeFileSync(held, text);
  vaultd("approve", held);
  vaultd("once");
}
for (const folder of ["Done", "Failed", "Pending_Approval", "Needs_Action", "In_Progress"]) {
  const note = join(vault, folder, "conformance.md");
  if (existsSync(note)) {
    copyFileSync(note, out);
    break;
  }
}
process.stdout.write(`${calls.length} call(s) written\n`);
finish(0);
