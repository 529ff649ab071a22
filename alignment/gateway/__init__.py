"""A gateway in front of the decode engine speaking OpenAI chat completions, OpenAI Responses and Anthropic Messages
(each streamed or not), the model list and OpenAI's legacy completions.

Two uses: serving a model to any OpenAI or Anthropic client (`alignment-serve`, serving.py), and training agent
programs that call it (ppo/rollout/agent_programs.py): each episode's calls go to a session of their own, sampled by the
policy being trained, and become that episode's trajectory (backend.py). route.py registers a route per protocol
(chat_completions.py, responses.py, anthropic_messages.py): each checks its requests into protocol.py's one
`ChatRequest` and writes the call's `Outcome` (outcome.py) back in its protocol, streamed as server-sent events
as the turn is decoded (streaming.py, live.py) or not; render.py turns messages and tools into token ids and
sampled text into messages with tool calls; app.py is the HTTP side.
"""
