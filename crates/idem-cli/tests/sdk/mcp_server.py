"""An MCP server built with the official Python SDK (FastMCP, streamable
HTTP, answers in event streams as the SDK does by default) whose tool
`charge` has an effect: each run appends a line to a file.

Usage: python mcp_server.py PORT RUNS_FILE
"""

import sys
import time

from mcp.server.fastmcp import FastMCP


def main() -> None:
    port, runs_file = int(sys.argv[1]), sys.argv[2]
    server = FastMCP("payments", host="127.0.0.1", port=port, log_level="WARNING")

    @server.tool()
    def charge(order: str, amount: int, idempotency_key: str) -> str:
        """Charges an order, once per idempotency key."""
        with open(runs_file, "a", encoding="utf-8") as runs:
            runs.write(f"{idempotency_key} {order}\n")
        count = sum(1 for _ in open(runs_file, encoding="utf-8"))
        # Slow enough that a concurrent retry arrives while it runs.
        time.sleep(0.5)
        return f"charged {amount} for {order} (charge {count})"

    server.run(transport="streamable-http")


if __name__ == "__main__":
    main()
