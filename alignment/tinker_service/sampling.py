"""A Tinker sampling client's model: the base model, or the base with a saved adapter folded in (lora.py:
merge_lora, so the decode engine runs its fused float32 path), sampled through the project's decode engine
(models/engine.py), one engine sequence per requested sample.

SamplingParams: max_tokens (default: the server's --max-tokens), temperature (0: greedy), top_k (-1 or 0: off),
top_p, seed, stop (None: the model's eos; a list of token ids: those; [] : none, run to max_tokens; stop strings
are refused). Sample i of a request with seed s draws its uniform numbers from numpy's default_rng(s + i), so a
seeded request gives the same tokens every time. The returned log-probs are the model's at the sampling
temperature (at 1 when greedy). A sequence that ended on a stop token reports "stop", one cut at max_tokens or at
the model's length "length".
"""
from __future__ import annotations

from typing import List, Optional, Sequence as Seq, Tuple

import numpy as np

from alignment.models import LlamaForCausalLM
from alignment.models.engine import DecodeEngine, DecodeSequence
from alignment.models.lora import apply_lora, load_adapter, merge_lora
from alignment.models.sampling import GenerationConfig
from alignment.tinker_service.training import BaseModel, UserError, checkpoint_shape

ENDINGS = {"eos": "stop", "stop": "stop", "length": "length", "budget": "length"}


def sampler_model(base: BaseModel, adapter_dir: Optional[str] = None):
    """The base model, with the adapter at adapter_dir merged in when given; in eval mode."""
    model = LlamaForCausalLM.from_pretrained(base.path)
    if adapter_dir is not None:
        shape = checkpoint_shape(adapter_dir)
        apply_lora(model, shape["rank"], shape["alpha"], 0.0, shape["targets"])
        try:
            load_adapter(model, adapter_dir)
        except (ValueError, FileNotFoundError) as err:
            raise UserError(str(err)) from None
        merge_lora(model)
    model.eval()
    return model


def generation_config(params: dict, eos: List[int], default_max_tokens: int) -> GenerationConfig:
    stop = params.get("stop")
    if isinstance(stop, str) or (isinstance(stop, list) and any(isinstance(s, str) for s in stop)):
        raise UserError("stop strings are not supported by this server; give stop token ids")
    max_tokens = params.get("max_tokens") or default_max_tokens
    temperature = float(params.get("temperature", 1.0))
    top_k, top_p = int(params.get("top_k", -1)), float(params.get("top_p", 1.0))
    if temperature < 0 or not 0 < top_p <= 1 or max_tokens < 1:
        raise UserError("sampling_params need temperature >= 0, 0 < top_p <= 1 and max_tokens >= 1")
    return GenerationConfig(max_new_tokens=int(max_tokens), do_sample=temperature > 0,
                            temperature=temperature if temperature > 0 else 1.0, top_k=max(top_k, 0), top_p=top_p,
                            eos_token_id=eos if stop is None else [int(s) for s in stop])


def sample(model, prompt: Seq[int], num_samples: int, config: GenerationConfig, seed: Optional[int],
           max_length: int) -> List[Tuple[str, List[int], List[float]]]:
    """num_samples continuations of `prompt` -> (stop reason, tokens, log-probs) each."""
    vocab = model.config.vocab_size
    if not prompt or min(prompt) < 0 or max(prompt) >= vocab:
        raise UserError(f"the prompt must be non-empty token ids in [0, {vocab})")
    if len(prompt) >= max_length:
        raise UserError(f"a prompt of {len(prompt)} tokens leaves no room in the model's {max_length}")
    if not 1 <= num_samples <= 64:
        raise UserError("num_samples must be in 1..64")
    budget = min(max_length, len(prompt) + config.max_new_tokens)
    temperature = config.temperature if config.do_sample else 1.0
    seqs = [DecodeSequence(list(prompt), config, budget, rng=np.random.default_rng(seed + i) if seed is not None
                     else np.random.default_rng(), log_prob_temperature=temperature) for i in range(num_samples)]
    engine = DecodeEngine(model, num_samples, budget)
    for seq in seqs:
        engine.add(seq)
    while engine.busy():
        engine.step()
    return [(ENDINGS[s.ending], list(s.turn), list(s.turn_log_probs)) for s in seqs]
