"""Where the `openenv` adapter finds an environment by id, and its MCP tools (openenv 0.10).

By id: a local environment directory (the layout `openenv init` makes: `openenv.yaml` beside the package's
`server/`), or an installed environment package (an importable package holding `openenv.yaml`, as the
`openenv-<name>` distributions are). The manifest's `app` (default `server.app:app`) names the server module;
the environment class is the one concrete `openenv.core.Environment` subclass that module holds (it hands it to
`create_app`), run in-process as an `env` class is. The Hub and Docker routes of `AutoEnv` are not taken: they
install or start code this process does not see.

MCP tools: an `MCPEnvironment` (in-process) or a server with MCP tools (`"tools": true`) lists its tools with a
`list_tools` action and runs each with a `call_tool` action, as its `/ws` session does.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.resources
import importlib.util
import inspect
import os
import sys
import types
from typing import Any, Dict, List, Mapping

import yaml

from alignment.envs.adapters.common import as_text

_MANIFEST = "openenv.yaml"


def environment_class(env_id: str, base: type) -> type:
    """The Environment subclass of the local directory or installed package `env_id`; ValueError naming it."""
    if os.path.isdir(env_id):
        root = os.path.abspath(env_id)
        package = _directory_package(root)
        manifest_path = os.path.join(root, _MANIFEST)
        if not os.path.isfile(manifest_path):
            raise ValueError(f"environment 'openenv' id {env_id!r}: the directory has no {_MANIFEST}")
        with open(manifest_path, encoding="utf-8") as f:
            manifest = yaml.safe_load(f) or {}
    else:
        package, manifest = _installed_package(env_id)
    app = str(manifest.get("app") or "server.app:app").split(":")[0]
    try:
        module = importlib.import_module(f"{package}.{app}")
    except Exception as err:  # noqa: BLE001 - the environment's own code: one line naming it
        raise ValueError(f"environment 'openenv' id {env_id!r}: importing its server module {app!r} failed: "
                         f"{type(err).__name__}: {err}") from None
    found = {value for value in vars(module).values()
             if isinstance(value, type) and issubclass(value, base) and not inspect.isabstract(value)}
    if len(found) != 1:
        names = ", ".join(sorted(cls.__name__ for cls in found)) or "none"
        raise ValueError(f"environment 'openenv' id {env_id!r}: its server module {app!r} holds {len(found)} "
                         f"environment classes ({names}), not one; name it with 'env' ('module:Class')")
    return found.pop()


def _directory_package(root: str) -> str:
    """The directory imported as a package of its own name (relative imports inside it work), once."""
    name = "openenv_dir_" + "".join(c if c.isalnum() else "_" for c in os.path.basename(root)) + "_" + \
        hashlib.sha1(root.encode("utf-8")).hexdigest()[:10]
    if name not in sys.modules:
        init = os.path.join(root, "__init__.py")
        if os.path.isfile(init):
            spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[root])
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        else:
            module = types.ModuleType(name)
            module.__path__ = [root]
            sys.modules[name] = module
    return name


def _installed_package(env_id: str):
    tried = list(dict.fromkeys(name for name in (env_id.replace("-", "_"), env_id.replace("-", "_") + "_env")))
    for name in tried:
        if importlib.util.find_spec(name) is None:
            continue
        manifest = importlib.resources.files(name) / _MANIFEST
        if manifest.is_file():
            return name, yaml.safe_load(manifest.read_text(encoding="utf-8")) or {}
    raise ValueError(f"environment 'openenv' id {env_id!r}: neither a directory nor an installed environment "
                     f"package (looked for an importable {' or '.join(map(repr, tried))} holding {_MANIFEST})")


def tool_schemas(observation: Any) -> List[Dict[str, Any]]:
    """A list_tools observation's tools as OpenAI function-calling schemas (their input schema passed through)."""
    tools = _field(observation, "tools") or []
    schemas = []
    for tool in tools:
        data = tool.model_dump() if hasattr(tool, "model_dump") else dict(tool)
        parameters = data.get("input_schema", data.get("inputSchema")) or {"type": "object", "properties": {}}
        schemas.append({"type": "function", "function": {"name": data["name"],
                                                         "description": data.get("description") or "",
                                                         "parameters": parameters}})
    return schemas


def tool_text(observation: Any) -> str:
    """What a call_tool observation tells the policy: its error as an error text, else the result's text."""
    error = _field(observation, "error")
    if error:
        message = _field(error, "message") or as_text(error)
        return f"Error: {message}"
    result = _field(observation, "result")
    content = _field(result, "content")
    if content:
        texts = [_field(part, "text") for part in content if _field(part, "type") == "text"]
        text = "\n".join(t for t in texts if t is not None)
        return f"Error: {text}" if (_field(result, "is_error") or _field(result, "isError")) else text
    data = _field(result, "data")
    return as_text(result if data is None else data)


def _field(value: Any, name: str) -> Any:
    if isinstance(value, Mapping):
        return value.get(name)
    return getattr(value, name, None)
