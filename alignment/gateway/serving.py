"""Serving a trained model (an output directory or an export's hf/ checkpoint) to OpenAI clients: the requests'
own sampling parameters, one engine of `slots` sequences, the pump in the calling thread."""
from __future__ import annotations

import sys
from typing import Optional

from alignment.envs.formats import tool_call_format
from alignment.gateway.app import GatewayServer, create_app
from alignment.gateway.backend import Gateway
from alignment.gateway.protocol import ChatRequest
from alignment.models.sampling import GenerationConfig


def request_sampler(eos_ids, pad_id: int, max_tokens: int, prompt_lookup: int = 0):
    """A request's sampling: temperature (default 1; 0 = greedy), top_p, max_tokens (default and cap
    `max_tokens`); log-probs at the sampling temperature. prompt_lookup: the server's speculative decoding
    (GenerationConfig.prompt_lookup_num_tokens; 0 = off)."""
    def sampler(request: ChatRequest):
        temperature = 1.0 if request.temperature is None else float(request.temperature)
        greedy = temperature == 0.0
        config = GenerationConfig(max_new_tokens=min(request.max_tokens or max_tokens, max_tokens),
                                  do_sample=not greedy, temperature=1.0 if greedy else temperature,
                                  top_p=1.0 if request.top_p in (None, 0) else float(request.top_p),
                                  eos_token_id=eos_ids, pad_token_id=pad_id, prompt_lookup_num_tokens=prompt_lookup)
        return config, config.temperature
    return sampler


def build_gateway(model, tokenizer, slots: int, capacity: int, max_tokens: int, fmt: str = "hermes",
                  name: str = "policy", prompt_lookup: int = 0) -> Gateway:
    eos = getattr(model.config, "eos_token_ids", None) or tokenizer.eos_token_id
    return Gateway(model, tokenizer, slots, capacity, tool_call_format(fmt),
                   request_sampler(eos, tokenizer.pad_token_id, max_tokens, prompt_lookup), name)


def serve(model, tokenizer, host: str, port: int, key: Optional[str], slots: int, capacity: int, max_tokens: int,
          fmt: str, name: str, ready=None, prompt_lookup: int = 0) -> None:
    """Serve until interrupted; ready(base_url) once listening."""
    gateway = build_gateway(model, tokenizer, slots, capacity, max_tokens, fmt, name, prompt_lookup)
    server = GatewayServer(create_app(gateway, key), host, port)
    print(f"gateway listening on {server.base_url}/v1 (model {', '.join(map(repr, gateway.model_names()))}, "
          f"{slots} sequences at once, {capacity} tokens each)", flush=True)
    if ready is not None:
        ready(server.base_url)
    try:
        gateway.pump(lambda: not server.thread.is_alive())
    except KeyboardInterrupt:
        print("gateway: stopped", file=sys.stderr)
    finally:
        server.stop()
