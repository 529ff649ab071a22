"""An MCP server with two arithmetic tools, for the `tools` environment's MCP entries (docs/agentic/tools.md):
`python examples/mcp_arith_server.py` speaks MCP over stdio (the environment starts it), `--http PORT` serves
streamable HTTP at http://127.0.0.1:PORT/mcp. Written with the `mcp` package's own server (1.x or 2.x)."""
import argparse

try:
    from mcp.server.mcpserver import MCPServer as Server  # mcp 2.x
except ImportError:
    from mcp.server.fastmcp import FastMCP as Server  # mcp 1.x

server = Server("arith")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


def serve(argv=None) -> None:
    """stdio, or streamable HTTP with `--http PORT` (a server that adds tools of its own can call this too)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP on 127.0.0.1:PORT")
    port = parser.parse_args(argv).http
    if port is None:
        server.run()
    else:
        import uvicorn
        uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    serve()
