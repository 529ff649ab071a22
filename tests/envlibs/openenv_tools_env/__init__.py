"""An OpenEnv environment directory (the layout `openenv init` makes) for the adapter tests: guess a number with
an MCP tool."""
