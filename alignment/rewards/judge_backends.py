"""A local language model that answers a model judge's prompts (model_judges.py): each prompt as the user's turn in
the model's chat template, answered greedily (or sampled at the judge's temperature). When the parser reads
log-probs of given answers (yes_no's candidates), each candidate's exact log-probability as the whole answer's
start, log p(candidate tokens | judge prompt) (an endpoint gives its first token's top log-probs instead).
Loaded on first use."""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

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
        rows = [p + c for p in prompt_ids for c in cand_ids]
        logits = self.model(paddle.to_tensor(pad_sequences(rows, self.tokenizer.pad_token_id)),
                            attention_mask=paddle.to_tensor(attention_mask_for(rows))).logits  # [b, L, V]
        table = paddle.nn.functional.log_softmax(logits.astype("float32"), axis=-1).numpy()
        out, k = [], 0
        for p in prompt_ids:
            pairs = []
            for text, c in zip(candidates, cand_ids):
                positions = range(len(p) - 1, len(p) - 1 + len(c))  # logits at t predict token t + 1
                pairs.append((text, float(sum(table[k, t, token] for t, token in zip(positions, c)))))
                k += 1
            out.append(pairs)
        return out
