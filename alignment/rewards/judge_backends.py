"""A local language model that answers a model judge's prompts (model_judges.py): each prompt as the user's turn in
the model's chat template, answered greedily (or sampled at the judge's temperature). When the parser reads
log-probs of given answers (yes_no's candidates), each candidate's exact log-probability as the whole answer's
start, log p(candidate tokens | judge prompt) (an endpoint gives its first token's top log-probs instead).
Loaded on first use."""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np
import paddle

from alignment.data.tokenized import attention_mask_for, pad_sequences


class LocalJudgeModel:
    def __init__(self, path: str):
        from alignment.models import LlamaForCausalLM, Tokenizer

        self.tokenizer = Tokenizer.from_pretrained(path)
        self.model = LlamaForCausalLM.from_pretrained(path)
        self.model.eval()

    def prompt_ids(self, text: str) -> List[int]:
        rendered = self.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        return self.tokenizer.encode(rendered, add_special_tokens=True)

    @paddle.no_grad()
    def answer(self, prompts: List[str], max_tokens: int, candidates: Sequence[str] = (),
               temperature: float = 0.0) -> List[Tuple[str, Optional[list]]]:
        """(answer text, [(candidate, log-prob)] or None) per judge prompt."""
        from alignment.models.generation import GenerationConfig, generate

        ids = [self.prompt_ids(text) for text in prompts]
        input_ids = paddle.to_tensor(pad_sequences(ids, self.tokenizer.pad_token_id, left=True))  # [b, P]
        mask = paddle.to_tensor(attention_mask_for(ids, left=True))  # [b, P]
        config = GenerationConfig(max_new_tokens=max_tokens, do_sample=temperature > 0, temperature=temperature or 1.0,
                                  eos_token_id=self.model.config.eos_token_ids or self.tokenizer.eos_token_id,
                                  pad_token_id=self.tokenizer.pad_token_id)
        out = generate(self.model, input_ids, mask, config)
        new = out.sequences[:, input_ids.shape[1]:].numpy()
        lengths = out.response_mask.sum(axis=1).numpy()
        texts = [self.tokenizer.decode(row[: int(n)]) for row, n in zip(new, lengths)]
        if not candidates:
            return [(text, None) for text in texts]
        return list(zip(texts, self.candidate_log_probs(ids, candidates)))

    @paddle.no_grad()
    def candidate_log_probs(self, prompt_ids: List[List[int]], candidates: Sequence[str]) -> List[list]:
        """Per prompt [(candidate, log p(its tokens | prompt))], from one batched forward pass of every pair."""
        cand_ids = [self.tokenizer.encode(c, add_special_tokens=False) for c in candidates]
        n, pad = len(cand_ids), self.tokenizer.pad_token_id
        prompts = pad_sequences(prompt_ids, pad, left=True)  # [u, P]
        width = prompts.shape[1]
        answers = pad_sequences(cand_ids, pad)  # [n, C]
        rows = np.concatenate([np.repeat(prompts, n, axis=0), np.tile(answers, (len(prompt_ids), 1))], axis=1)
        mask = np.concatenate([np.repeat(attention_mask_for(prompt_ids, left=True), n, axis=0),
                               np.tile(attention_mask_for(cand_ids), (len(prompt_ids), 1))], axis=1)  # [b, P + C]
        groups = paddle.to_tensor(np.repeat(np.arange(len(prompt_ids)), n).astype("int64"))  # each prompt runs once
        hidden = self.model.model.forward_sharing_prompts(paddle.to_tensor(rows), paddle.to_tensor(mask), width,
                                                          groups)  # [b, P + C, h]
        states = hidden[:, width - 1: -1]  # [b, C, h]: the states predicting each candidate token
        log_probs, _ = self.model.token_log_probs(states, paddle.to_tensor(rows[:, width:]))  # [b, C]
        log_probs = (log_probs.numpy() * mask[:, width:]).sum(axis=1).reshape([len(prompt_ids), n])  # [u, n]
        return [[(text, float(value)) for text, value in zip(candidates, row)] for row in log_probs]
