"""An MCP tool server for rlmesh-mcp's tests, written with the `mcp` package's MCPServer.

    python tools_server.py stdio
    python tools_server.py http PORT_FILE   # Streamable HTTP on 127.0.0.1, ephemeral port written to PORT_FILE

Tools with pydantic-typed arguments (defaults, optionals, nested models, unions),
a stateful counter with hidden `reset` / `get_reward` tools, and tools that fail,
hang or kill the server, for the failure tests.
"""
import os
import socket
import sys
import time
from typing import Literal, Optional

from pydantic import BaseModel, Field

from mcp.server.mcpserver import Context, Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("rlmesh-test-tools")
# The counter's state, one per MCP session (over HTTP one server holds many).
states: dict = {}


def state(ctx: Context) -> dict:
    key = (ctx.headers or {}).get("mcp-session-id", "stdio")
    return states.setdefault(key, {"count": 0, "target": None})


class Item(BaseModel):
    name: str
    price: float = Field(description="Unit price")
    quantity: int = 1


class Circle(BaseModel):
    kind: Literal["circle"] = "circle"
    radius: float


class Square(BaseModel):
    kind: Literal["square"] = "square"
    side: float


@server.tool()
def add(a: int, b: int = 0) -> str:
    """Adds two integers."""
    return str(a + b)


@server.tool()
def greet(name: str, title: Optional[str] = None, punctuation: Literal["!", "."] = "!") -> str:
    """Greets someone."""
    return f"Hello, {title + ' ' if title else ''}{name}{punctuation}"


@server.tool()
def total(items: list[Item], discount: float | None = None) -> str:
    """Totals a list of items."""
    t = sum(i.price * i.quantity for i in items)
    return f"{t * (1 - (discount or 0)):.2f}"


@server.tool()
def area(shape: Circle | Square = Field(discriminator="kind")) -> str:
    """The area of a shape."""
    return f"{3.14159 * shape.radius ** 2:.2f}" if shape.kind == "circle" else f"{shape.side ** 2:.2f}"


@server.tool()
def fail(message: str) -> str:
    """Always fails with the message."""
    raise ToolError(message)


@server.tool()
def nap(seconds: float) -> str:
    """Sleeps, then answers (blocks the server: it is single-threaded)."""
    time.sleep(seconds)
    return "rested"


@server.tool()
def crash() -> str:
    """Kills the server mid-call."""
    os._exit(3)


@server.tool()
def pid() -> str:
    """The server's process id."""
    return str(os.getpid())


@server.tool()
def picture() -> list:
    """Text and an image."""
    return ["a red pixel", Image(data=b"\x89PNG\r\n\x1a\n", format="png")]


@server.tool()
def increment(ctx: Context, by: int = 1) -> str:
    """Adds to the counter and returns it."""
    s = state(ctx)
    s["count"] += by
    return str(s["count"])


@server.tool()
def reset(ctx: Context, start: int = 0, target: Optional[int] = None) -> str:
    """Hidden: sets the counter and the target."""
    state(ctx).update(count=start, target=target)
    return f"counter at {start}"


@server.tool()
def get_reward(ctx: Context) -> str:
    """Hidden: 1 when the counter reached the target, else 0; no grade without a target."""
    s = state(ctx)
    if s["target"] is None:
        return "no target"
    return "1.0" if s["count"] == s["target"] else "0.0"


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        import anyio
        import uvicorn

        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        with open(sys.argv[2] + ".tmp", "w") as f:
            f.write(str(sock.getsockname()[1]))
        os.rename(sys.argv[2] + ".tmp", sys.argv[2])
        config = uvicorn.Config(server.streamable_http_app(), log_level="warning")
        anyio.run(lambda: uvicorn.Server(config).serve(sockets=[sock]))
    else:
        server.run("stdio")
