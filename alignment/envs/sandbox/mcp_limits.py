"""Start an MCP server under resource limits: `python -I mcp_limits.py '{"memory_bytes": ...}' command args...`
sets the rlimits (address space, file size, CPU seconds when given; no core files) and executes the command in
its place, so the server and what it starts inherit them. Run by mcp_tools.py; standard library only."""
import json
import os
import resource
import sys

_RLIMITS = {"memory_bytes": resource.RLIMIT_AS, "file_bytes": resource.RLIMIT_FSIZE, "cpu_seconds": resource.RLIMIT_CPU}


def main() -> None:
    limits, command = json.loads(sys.argv[1]), sys.argv[2:]
    for name, value in limits.items():
        hard = value + 1 if name == "cpu_seconds" else value  # SIGXCPU at the soft limit, then SIGKILL
        resource.setrlimit(_RLIMITS[name], (value, hard))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
