"""Generate text from an HF-layout checkpoint with our Paddle model (KV-cache sampling).

    python tools/generate.py --model checkpoints/smollm2-135m-instruct --prompt "What is the capital of France?"

The prompt is wrapped in the checkpoint's chat template unless --raw is given. Greedy unless --temperature > 0.
"""
from __future__ import annotations

import time

from alignment.commands.tool_parser import (ToolParser, non_negative_int, non_negative_number, positive_int,
                                            positive_number, probability)


def complete(model_dir: str, prompts, max_new_tokens: int = 64, temperature: float = 0.0, top_p: float = 1.0,
             top_k: int = 0, repetition_penalty: float = 1.0, raw: bool = False, seed: int = 0):
    """Return the decoded responses for a list of prompts (batched, left-padded)."""
    import paddle

    from alignment.data.tokenized import collate_prompts
    from alignment.models import GenerationConfig, LlamaForCausalLM, Tokenizer, generate

    tokenizer = Tokenizer.from_pretrained(model_dir)
    model = LlamaForCausalLM.from_pretrained(model_dir)
    texts = prompts if raw else [tokenizer.apply_chat_template(tokenizer.chat_messages(p)) for p in prompts]
    batch = collate_prompts([{"input_ids": tokenizer.encode(t, add_special_tokens=True)} for t in texts],
                            tokenizer.pad_token_id)
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=temperature > 0,
                              temperature=temperature if temperature > 0 else 1.0, top_p=top_p, top_k=top_k,
                              repetition_penalty=repetition_penalty,
                              eos_token_id=model.config.eos_token_ids or tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id)
    paddle.seed(seed)
    out = generate(model, paddle.to_tensor(batch["input_ids"]), paddle.to_tensor(batch["attention_mask"]), config)
    responses = out.sequences[:, batch["input_ids"].shape[1]:].numpy()
    return [tokenizer.decode(row[mask.astype(bool)]) for row, mask in zip(responses, out.response_mask.numpy())]


def main(argv=None):
    parser = ToolParser(__doc__)
    parser.add_argument("--model", required=True, help="checkpoint directory (HF layout, with tokenizer.json)")
    parser.add_argument("--prompt", action="append", required=True, help="repeat for a batch")
    parser.add_argument("--max-new-tokens", type=positive_int, default=64)
    parser.add_argument("--temperature", type=non_negative_number, default=0.0, help="0 = greedy")
    parser.add_argument("--top-p", type=probability, default=1.0)
    parser.add_argument("--top-k", type=non_negative_int, default=0)
    parser.add_argument("--repetition-penalty", type=positive_number, default=1.0)
    parser.add_argument("--raw", action="store_true", help="do not apply the chat template")
    parser.add_argument("--seed", type=non_negative_int, default=0)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    answers = complete(args.model, args.prompt, args.max_new_tokens, args.temperature, args.top_p, args.top_k,
                       args.repetition_penalty, args.raw, args.seed)
    for prompt, answer in zip(args.prompt, answers):
        print(f"### prompt: {prompt}\n{answer}\n")
    print(f"({time.perf_counter() - start:.1f} s)")
    return answers

