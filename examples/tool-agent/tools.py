"""The shop's tools, an MCP server written with the `mcp` package (2.x).

rlmesh starts it over stdio (`[[tool_server]]` in recipe.toml); any MCP
client can use it the same way:

    python3 tools.py
"""
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from catalogue import CATALOGUE

server = MCPServer("shop")


def _item(item: str) -> dict:
    key = item.strip().lower().rstrip("s") if item.strip().lower() not in CATALOGUE else item.strip().lower()
    if key not in CATALOGUE:
        raise ToolError(f"unknown item {item!r}; the shop sells: {', '.join(sorted(CATALOGUE))}")
    return CATALOGUE[key]


@server.tool()
def price(item: str) -> str:
    """The unit price of an item in the shop, in dollars."""
    return f"{_item(item)['price']:.2f}"


@server.tool()
def stock(item: str) -> str:
    """How many units of an item the shop has in stock."""
    return str(_item(item)["stock"])


if __name__ == "__main__":
    server.run("stdio")
