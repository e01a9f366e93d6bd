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
import { spawnSync } from "node:child_process";
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
function writeConfig(tools) {
  let text = `vault = ${JSON.stringify(vault)}\nstate_dir = ${JSON.stringify(join(work, "state"))}\n`;
  text += `[mcp.c]\nurl = ${JSON.stringify(url)}\nallow = ["*"]\nstart_timeout = "60s"\n`;
  for (const t of tools) text += `[mcp.c.tools.${JSON.stringify(t)}]\napproval = "never"\n`;
  writeFileSync(config, text);
}

function vaultd(...args) {
  const r = spawnSync(bin, ["--config", config, ...args], {
    encoding: "utf8",
    env: { ...process.env, RUST_LOG: "vaultd=debug,rmcp=info" },
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
