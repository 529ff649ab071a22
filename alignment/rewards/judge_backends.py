"""A local language model that answers a model judge's prompts (model_judges.py): each prompt as the user's turn in
the model's chat template, answered greedily (or sampled at the judge's temperature), with the first answer
token's top log-probs when the parser reads them. Loaded on first use."""
from __future__ import annotations

from typing import List, Optional, Tuple

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
    def answer(self, prompts: List[str], max_tokens: int, top: int,
               temperature: float = 0.0) -> List[Tuple[str, Optional[list]]]:
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
        if not top:
            return [(text, None) for text in texts]
        logits = self.model(input_ids, attention_mask=mask, last_only=True).logits[:, -1]  # [b, V]
        values, indices = paddle.topk(paddle.nn.functional.log_softmax(logits, axis=-1), top)  # [b, top]
        tops = [[(self.tokenizer.decode([int(i)], skip_special_tokens=False), float(v)) for v, i in zip(vs, ix)]
                for vs, ix in zip(values.numpy(), indices.numpy())]
        return list(zip(texts, tops))
