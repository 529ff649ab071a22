"""Create a tiny random LLaMA and its tokenizer locally (no downloads, a few seconds) for smoke runs and tests.

    python tools/make_tiny.py [--output checkpoints/tiny] [--force]

The tokenizer is a byte-level BPE trained with the `tokenizers` library on the text of the shipped data under
data/ (except data/judged_tiny: text the tiny model sampled itself), with a ChatML chat template
(<|im_start|>role ... <|im_end|>). The model is a LLaMA with the config below, randomly initialised from a fixed
seed. Idempotent: an existing output made from the same recipe is kept.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os

from alignment.commands.tool_parser import ToolParser
from alignment.fileio import refuse_to_replace
from alignment.inputs import InputError, json_lines


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
MODEL_CONFIG = dict(hidden_size=128, intermediate_size=352, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=10000.0,
                    tie_word_embeddings=False, initializer_range=0.02)
VOCAB_SIZE = 1024
SEED = 1234


# The folders of data/ the tiny tokenizer is trained on, named: data added later (another demo's) must not change
# the tokenizer, hence the tiny models every test and the tiny pipeline build. Text the tiny model itself sampled
# (judged_tiny) is left out: it would change the tokenizer, hence the SFT model that sampled it.
TOKENIZER_CORPUS = ("hh_rlhf_sample", "judged", "preference", "prompts", "reasoning", "sft")


def corpus_files(data_dir: str) -> list:
    files = sorted(file for file in glob.glob(os.path.join(data_dir, "**", "*.jsonl"), recursive=True)
                   if os.path.relpath(file, data_dir).split(os.sep)[0] in TOKENIZER_CORPUS)
    if not files:
        raise FileNotFoundError(f"{data_dir}: no .jsonl files to train the tiny tokenizer on")
    return files


def iter_texts(files):
    for file in files:
        for line, row in json_lines(file, "data file"):
            if not isinstance(row, dict):
                raise InputError(f"{file} line {line}: expected a JSON object", file, line)
            yield from (v for v in row.values() if isinstance(v, str))


def recipe_hash(files) -> str:
    digest = hashlib.sha256(json.dumps([MODEL_CONFIG, VOCAB_SIZE, SEED, CHAT_TEMPLATE]).encode())
    for file in files:
        with open(file, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()[:16]


def train_tokenizer(files):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(iter_texts(files), trainer=trainer)
    return tokenizer


def write_tiny(output: str, files, recipe: str) -> None:
    import paddle

    from alignment.fileio import atomic_directory
    from alignment.models import LlamaConfig, LlamaForCausalLM
    from alignment.models.checkpoint import save_weights

    tokenizer = train_tokenizer(files)
    ids = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
    config = LlamaConfig(vocab_size=tokenizer.get_vocab_size(), bos_token_id=ids["<|endoftext|>"],
                         eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|pad|>"], **MODEL_CONFIG)
    paddle.seed(SEED)
    model = LlamaForCausalLM(config)
    with atomic_directory(output) as tmp:
        model.config.save_pretrained(tmp)
        save_weights(model, tmp)
        tokenizer.save(os.path.join(tmp, "tokenizer.json"))
        tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|endoftext|>",
                            "eos_token": "<|im_end|>", "pad_token": "<|pad|>", "unk_token": None,
                            "add_bos_token": False, "model_max_length": MODEL_CONFIG["max_position_embeddings"],
                            "chat_template": CHAT_TEMPLATE}
        with open(os.path.join(tmp, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(tokenizer_config, f, indent=2)
        with open(os.path.join(tmp, "tiny_recipe.txt"), "w") as f:
            f.write(recipe + "\n")
    print(f"tiny LLaMA ({model.num_parameters() / 1e6:.2f}M parameters, vocab {config.vocab_size}) -> {output}")


def main(argv=None) -> str:
    parser = ToolParser(__doc__)
    parser.add_argument("--output", default=os.path.join(REPO, "checkpoints", "tiny"))
    parser.add_argument("--data-dir", default=os.path.join(REPO, "data"))
    parser.add_argument("--force", action="store_true", help="rebuild even if an up-to-date output exists")
    args = parser.parse_args(argv)
    files = corpus_files(args.data_dir)
    recipe = recipe_hash(files)
    marker = os.path.join(args.output, "tiny_recipe.txt")
    if not args.force and os.path.exists(marker) and open(marker).read().strip() == recipe:
        print(f"{args.output} is up to date (recipe {recipe}); use --force to rebuild")
        return args.output
    refuse_to_replace(args.output, args.force, "--force to replace it", ours=lambda path: os.path.exists(marker))
    write_tiny(args.output, files, recipe)
    return args.output

