"""An OpenAI-compatible gateway in front of the decode engine: `POST /v1/chat/completions` and `GET /v1/models`.

Two uses: serving a model to any OpenAI client (`alignment-serve`, serving.py), and training agent programs that
call it (ppo/agent_programs.py): each episode's calls go to a session of their own, sampled by the policy being trained,
and become that episode's trajectory (backend.py). protocol.py checks requests and shapes errors as OpenAI's,
render.py turns messages and tools into token ids and sampled text into messages with `tool_calls`, app.py is the
HTTP side.
"""
