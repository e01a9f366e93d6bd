"""A real MCP client (the Python MCP SDK from PyPI) driving `vaultd mcp serve` over stdio.

Usage: client.py VAULTD VAULT SCRIPT_JSON [EXTRA_ARG...]
       client.py - URL SCRIPT_JSON        (streamable HTTP; sends $VAULTD_TOKEN as a bearer token)
       client.py - unix:PATH SCRIPT_JSON  (streamable HTTP over a unix socket, endpoint /mcp)

SCRIPT_JSON is a list of steps, run in order:
  ["list"]                      -> {"step": "list", "tools": [{name, annotations, inputSchema}]}
  ["call", NAME, ARGS]          -> {"step": "call", "isError", "content", "structuredContent",
                                    "progress": [messages]}
  ["watch"]                     -> {"step": "watch", "protocol"}: from now on, notice
                                   `notifications/tools/list_changed` (2026-07-28: through a
                                   `subscriptions/listen` stream; before: on the session)
  ["changed", SECONDS]          -> {"step": "changed", "changed": bool}: whether one came
                                   within SECONDS (since the watch or the last "changed")
$VAULTD_CLIENT_MODE=legacy makes the client use the 2025 `initialize` handshake.
One JSON line per step on stdout; the server's stderr is passed through.
"""

import asyncio
import json
import sys

import os

import httpx2
from mcp import Client, types
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client


async def main() -> None:
    vaultd, where, script = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    if where.startswith(("http", "unix:")):
        headers = {}
        if os.environ.get("VAULTD_TOKEN"):
            headers["Authorization"] = "Bearer " + os.environ["VAULTD_TOKEN"]
        transport = None
        if where.startswith("unix:"):
            transport = httpx2.AsyncHTTPTransport(uds=where[len("unix:"):])
            where = "http://localhost/mcp"
        http = httpx2.AsyncClient(headers=headers, transport=transport)
        server = streamable_http_client(where, http_client=http)
    else:
        server = StdioServerParameters(
            command=vaultd, args=["mcp", "serve", "--vault", where, *sys.argv[4:]]
        )
    changed = asyncio.Event()

    async def on_message(message) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    mode = os.environ.get("VAULTD_CLIENT_MODE", "auto")
    listening = None
    async with Client(server, read_timeout_seconds=120, message_handler=on_message, mode=mode) as client:
        for step in script:
            if step[0] == "list":
                tools = await client.list_tools()
                out = {
                    "step": "list",
                    "tools": [
                        {
                            "name": t.name,
                            "inputSchema": t.input_schema,
                            "annotations": t.annotations.model_dump(by_alias=True, exclude_none=True)
                            if t.annotations
                            else None,
                        }
                        for t in tools.tools
                    ],
                }
            elif step[0] == "call":
                progress = []

                async def on_progress(done, total, message):
                    progress.append(message)

                r = await client.call_tool(step[1], step[2], progress_callback=on_progress)
                out = {
                    "step": "call",
                    "isError": bool(r.is_error),
                    "content": [c.model_dump(by_alias=True, exclude_none=True) for c in r.content],
                    "structuredContent": r.structured_content,
                    "progress": progress,
                }
            elif step[0] == "watch":
                if client.protocol_version >= "2026-07-28":
                    ready = asyncio.Event()

                    async def listen() -> None:
                        async with client.listen(tools_list_changed=True) as sub:
                            ready.set()
                            async for _event in sub:
                                changed.set()

                    listening = asyncio.create_task(listen())
                    await asyncio.wait_for(ready.wait(), 60)
                out = {"step": "watch", "protocol": client.protocol_version}
            elif step[0] == "changed":
                try:
                    await asyncio.wait_for(changed.wait(), step[1])
                    out = {"step": "changed", "changed": True}
                except TimeoutError:
                    out = {"step": "changed", "changed": False}
                changed.clear()
            else:
                raise SystemExit(f"unknown step {step[0]!r}")
            print(json.dumps(out), flush=True)
        if listening is not None:
            listening.cancel()


asyncio.run(main())
