"""The server of the environment directory (what `uvicorn server.app:app` serves)."""
from openenv.core import CallToolAction, create_app

from .guess_tools_environment import GuessObservation, GuessToolsEnvironment

app = create_app(GuessToolsEnvironment, CallToolAction, GuessObservation, env_name="guess_tools",
                 max_concurrent_envs=4)
