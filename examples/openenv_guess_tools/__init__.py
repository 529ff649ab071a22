"""An OpenEnv environment directory (the layout `openenv init` makes: openenv.yaml, server/app.py): guess a number
with an MCP tool. Played by the `openenv` adapter by id (docs/agentic/adapters.md) and its tests."""
