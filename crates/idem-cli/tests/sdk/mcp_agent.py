"""An agent's tool calls through the gateway with the official MCP Python
SDK's client (streamable HTTP): a call, its retry in the same session
(asking for progress, so with a progress token of its own), two
concurrent calls with one key from two sessions, and a retry from a new
session after the agent restarted.

Usage: python mcp_agent.py MCP_URL
Prints one JSON line per call: {"call": name, "text": tool output,
"replayed": bool, "error": bool}.
"""

import asyncio
import datetime
import json
import sys

from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client

REPLAYED = "io.idem/replayed"


async def call(url, name, order, key):
    async with streamablehttp_client(url) as (read, write, _):
        async with ClientSession(read, write) as session:
            await session.initialize()
            return await charge(session, name, order, key)


async def on_progress(progress, total, message):
    pass


async def charge(session, name, order, key, progress=False):
    # An answer addressed to another JSON-RPC id never completes a call:
    # the timeout turns that into an error instead of a hang.
    result = await session.call_tool(
        "charge",
        {"order": order, "amount": 1250, "idempotency_key": key},
        read_timeout_seconds=datetime.timedelta(seconds=15),
        # A progress callback sends a progress token, new per request.
        progress_callback=on_progress if progress else None,
    )
    meta = result.meta or {}
    return {
        "call": name,
        "text": result.content[0].text if result.content else "",
        "replayed": bool(meta.get(REPLAYED)),
        "error": result.isError,
    }


async def main() -> None:
    url = sys.argv[1]
    results = []
    async with streamablehttp_client(url) as (read, write, _):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = await session.list_tools()
            assert [t.name for t in tools.tools] == ["charge"], tools
            results.append(await charge(session, "first", "order-1", "key-1"))
            results.append(await charge(session, "retry", "order-1", "key-1", progress=True))
    results += await asyncio.gather(
        call(url, "concurrent-a", "order-2", "key-2"),
        call(url, "concurrent-b", "order-2", "key-2"),
    )
    results.append(await call(url, "after-restart", "order-1", "key-1"))
    results.append(await call(url, "other-order", "order-3", "key-3"))
    for result in results:
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
