"""How much a call through `vaultd mcp serve` costs over the same call written in a note, and
how the gateway holds 100 client sessions at once (BENCHMARKS.md, "The gateway").

Usage: target/mcp-python/bin/python scripts/bench-gateway.py VAULTD [--calls N] [--sessions N]

Measured from outside the process, with the Python MCP SDK (not vaultd's code) as the client:

1. note: a note with one `vault_read` call is renamed into Needs_Action/ and waited for in
   Done/ (polled every 0.1 ms), N times, one at a time, against `vaultd run`;
2. gateway (stdio): the same call through `vaultd mcp serve` as a client of that same daemon,
   N times, one at a time;
3. 100 sessions: `vaultd mcp serve --listen` (HTTP), 100 clients at once, each making 10 calls.

Prints the p50/p90/p99 of each and the gateway's overhead at p50 (2 - 1). Everything runs on one
temp vault; nothing leaves 127.0.0.1.
"""

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

CALL = {"name": "vault_read", "parameters": {"path": "Reference/Page.md"}}


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def show(label, ms):
    print(
        f"{label:<34} n={len(ms):<5} p50 {pct(ms, 50):7.2f} ms  p90 {pct(ms, 90):7.2f} ms"
        f"  p99 {pct(ms, 99):7.2f} ms  mean {statistics.mean(ms):7.2f} ms",
        flush=True,
    )


def vault(root):
    os.makedirs(os.path.join(root, "vault", "Reference"))
    with open(os.path.join(root, "vault", "Reference", "Page.md"), "w") as f:
        f.write("# Page\n\n" + "Some text to read.\n" * 20)
    config = os.path.join(root, "vaultd.toml")
    with open(config, "w") as f:
        f.write(
            f'vault = "{root}/vault"\nstate_dir = "{root}/state"\nnote_budget = 1000000\n'
            '[gateway]\ntoken = "env:BENCH_GATEWAY_TOKEN"\n'
        )
    return config


NOTES = iter(range(10**9))


def by_note(root, n):
    """Drop-to-Done of a note with the call, one at a time (each note a new name)."""
    inbox = os.path.join(root, "vault", "Needs_Action")
    done = os.path.join(root, "vault", "Done")
    body = "# bench\n\n```json\n" + json.dumps({"tool_call": CALL}) + "\n```\n"
    out = []
    for _ in range(n):
        name = f"bench note {next(NOTES)}.md"
        tmp = os.path.join(root, "vault", f".{name}.tmp")
        with open(tmp, "w") as f:
            f.write(body)
        t0 = time.perf_counter()
        os.rename(tmp, os.path.join(inbox, name))
        target = os.path.join(done, name)
        failed = os.path.join(root, "vault", "Failed", name)
        while not os.path.exists(target):
            if os.path.exists(failed):
                raise SystemExit(f"the note failed:\n{open(failed).read()}")
            time.sleep(0.0001)
        out.append((time.perf_counter() - t0) * 1000)
    return out


async def by_gateway(vaultd, config, n, env):
    # The SDK starts servers with a minimal environment: the token's variable is passed on.
    params = StdioServerParameters(
        command=vaultd, args=["--config", config, "mcp", "serve"], env=env
    )
    out = []
    async with Client(params, read_timeout_seconds=60) as client:
        for _ in range(5):
            await client.call_tool(CALL["name"], CALL["parameters"])
        for _ in range(n):
            t0 = time.perf_counter()
            r = await client.call_tool(CALL["name"], CALL["parameters"])
            out.append((time.perf_counter() - t0) * 1000)
            assert not r.is_error, r
    return out


async def sessions(url, token, clients, calls):
    out = []

    async def one(i):
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120)
        async with Client(streamable_http_client(url, http_client=http), read_timeout_seconds=120) as c:
            for _ in range(calls):
                t0 = time.perf_counter()
                r = await c.call_tool(CALL["name"], CALL["parameters"])
                out.append((time.perf_counter() - t0) * 1000)
                assert not r.is_error, r

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(clients)))
    return out, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("vaultd")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--sessions", type=int, default=100)
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="vaultd-bench-gateway-")
    token = "bench-token-0123456789"
    env = dict(os.environ, BENCH_GATEWAY_TOKEN=token, RUST_LOG="warn")
    try:
        config = vault(root)
        daemon = subprocess.Popen(
            [a.vaultd, "--config", config, "run"], env=env, stderr=subprocess.DEVNULL
        )
        time.sleep(1.0)
        by_note(root, 20)  # warm-up
        note = by_note(root, a.calls)
        gateway = asyncio.run(by_gateway(a.vaultd, config, a.calls, env))
        note2 = by_note(root, a.calls)  # again, after: the machine's drift shows
        show("note: drop to Done", note)
        show("gateway stdio: call to answer", gateway)
        show("note again: drop to Done", note2)
        base = statistics.median(note + note2)
        print(f"gateway overhead at p50: {pct(gateway, 50) - base:.2f} ms over the note's {base:.2f} ms")

        listen = subprocess.Popen(
            [a.vaultd, "--config", config, "mcp", "serve", "--listen", "127.0.0.1:0"],
            env=dict(env, RUST_LOG="info"),
            stderr=subprocess.PIPE,
            text=True,
        )
        url = None
        for line in listen.stderr:
            if "listening on http://" in line:
                url = line.split("listening on ", 1)[1].strip()
                break
        # The rest of its log is read and dropped: a full pipe would stop the gateway.
        threading.Thread(target=lambda: [None for _ in listen.stderr], daemon=True).start()
        many, wall = asyncio.run(sessions(url, token, a.sessions, 10))
        show(f"{a.sessions} HTTP sessions x 10 calls", many)
        print(f"{len(many)} calls in {wall:.2f} s: {len(many) / wall:.0f} calls/s")
        listen.terminate()
        listen.wait()
        daemon.terminate()
        daemon.wait()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
