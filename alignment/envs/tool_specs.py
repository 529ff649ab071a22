"""Tool specs as users write them (`tools: [...]` of the tools environment): functions, Tools, built-in names,
'module:function' or 'path/file.py:function', and {"mcp": {...}} entries (every tool of that MCP server,
mcp_tools.py), resolved to {name: Tool}."""
from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Sequence, Union

from alignment.data import import_function
from alignment.envs.mcp_tools import mcp_tools
from alignment.envs.tools import Tool, as_tool


def resolve_tools(specs: Sequence[Union[str, Tool, Callable[..., Any]]],
                  builtins: Mapping[str, Tool]) -> Dict[str, Tool]:
    """{name: Tool} from functions, Tools, built-in names, 'module:function' or 'path/file.py:function', and
    {"mcp": {...}} entries: every tool of that MCP server (mcp_tools.py)."""
    tools: Dict[str, Tool] = {}
    for spec in specs:
        for tool in _resolve_entry(spec, builtins):
            if tool.name in tools:
                raise ValueError(f"tools: two tools are named {tool.name!r}")
            tools[tool.name] = tool
    return tools


def _resolve_entry(spec: Any, builtins: Mapping[str, Tool]) -> Sequence[Tool]:
    if isinstance(spec, Mapping):
        if set(spec) != {"mcp"}:
            raise ValueError(f"tools: a mapping entry is {{\"mcp\": {{...}}}} (an MCP server), got {spec!r}")
        return mcp_tools(spec["mcp"])
    return [_resolve_tool(spec, builtins)]


def _resolve_tool(spec: Union[str, Tool, Callable[..., Any]], builtins: Mapping[str, Tool]) -> Tool:
    if not isinstance(spec, str):
        return as_tool(spec)
    if spec in builtins:
        return builtins[spec]
    if ":" not in spec:
        raise ValueError(f"tools: {spec!r} is neither a built-in tool ({', '.join(sorted(builtins))}) nor "
                         f"'module:function' / 'file.py:function'")
    return as_tool(import_function(spec, "tools"))
