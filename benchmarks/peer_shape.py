"""The TRL peer's benchmark shape, built offline: a byte-level BPE tokenizer (vocab 8000) trained on generated
template text, prompts of the same kinds, and random-init LLaMA policy / reward / value checkpoints (hidden 256,
intermediate 1024, 4 layers, 4 heads; 8.29M parameters, fp32). Used by bench_rl_step.py."""
from __future__ import annotations

import json
import os
import random

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]
VOCAB_SIZE = 8000
MODEL_SHAPE = dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=4, max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=10000.0,
                   tie_word_embeddings=False, initializer_range=0.02)
NUM_PROMPTS = 64  # the peer's dataset size

# Words of the generated tokenizer corpus and the prompts (the same kinds of text as the peer's).
SUBJECTS = ["the cat", "a dog", "my friend", "the teacher", "a small robot", "the old man", "our team", "the bird",
            "a child", "the farmer"]
VERBS = ["likes", "sees", "finds", "loves", "hates", "builds", "paints", "reads", "writes", "opens", "eats",
         "carries"]
ADJECTIVES = ["happy", "sad", "good", "bad", "great", "terrible", "bright", "dark", "quiet", "loud", "warm", "cold",
              "lovely", "awful", "nice", "boring"]
TOPICS = ["apple", "book", "river", "house", "garden", "song", "letter", "window", "cake", "mountain", "story",
          "picture", "road", "boat"]
LINKS = ["and", "but", "because", "so", "while", "when"]


# --- data: corpus, tokenizer, prompts -----------------------------------------------------------------------------
def corpus_lines(seed: int = 0):
    """Template sentences, arithmetic Q/A and reviews, then random letter 'words' so BPE fills 8000 merges."""
    rng = random.Random(seed)
    for _ in range(20000):
        kind = rng.random()
        if kind < 0.6:
            text = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} a {rng.choice(ADJECTIVES)} {rng.choice(TOPICS)}"
            if rng.random() < 0.5:
                text += f" {rng.choice(LINKS)} {rng.choice(SUBJECTS)} {rng.choice(VERBS)} the {rng.choice(TOPICS)}"
            yield text[0].upper() + text[1:] + "."
        elif kind < 0.85:
            a, b, op = rng.randint(0, 99), rng.randint(0, 99), rng.choice("+-*")
            value = {"+": a + b, "-": a - b, "*": a * b}[op]
            yield f"Question: what is {a} {op} {b}? Answer: {value}."
        else:
            yield f"Review: this {rng.choice(TOPICS)} is {rng.choice(ADJECTIVES)}. Rating: {rng.randint(1, 5)} stars."
    letters = "abcdefghijklmnopqrstuvwxyz"
    for _ in range(20000):
        yield " ".join("".join(rng.choice(letters) for _ in range(rng.randint(3, 9))) for _ in range(12))


def build_tokenizer(directory: str):
    """Byte-level BPE, vocab 8000, saved in the HF layout our Tokenizer reads. No eos token is declared: responses
    are always exactly max_new_tokens long (the peer: PPO stop_token=None; GRPO on an untrained model)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from alignment.models import Tokenizer as OurTokenizer

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, min_frequency=1, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus_lines(), trainer=trainer)
    os.makedirs(directory, exist_ok=True)
    tok.save(os.path.join(directory, "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "pad_token": "<pad>",
              "unk_token": "<unk>", "add_bos_token": False, "model_max_length": MODEL_SHAPE["max_position_embeddings"]}
    with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    return OurTokenizer.from_pretrained(directory)


def prompt_texts(n: int = NUM_PROMPTS, seed: int = 0):
    """Plain-text prompts (no chat template), alternating the peer's two kinds: about 9-12 tokens each."""
    rng = random.Random(seed)
    texts = []
    for i in range(n):
        if i % 2 == 0:
            texts.append(f"Write a happy sentence about the {rng.choice(TOPICS)}:")
        else:
            texts.append(f"Question: what is {rng.randint(0, 50)} + {rng.randint(0, 50)}? Answer:")
    return texts


# --- models -------------------------------------------------------------------------------------------------------
def model_config(tokenizer, cls, **extra):
    return cls(vocab_size=VOCAB_SIZE, bos_token_id=tokenizer.bos_token_id, eos_token_id=None,
               pad_token_id=tokenizer.pad_token_id, **MODEL_SHAPE, **extra)


def build_checkpoints(tokenizer, directory: str, seed: int) -> dict:
    """Random-init policy (seed), reward model (seed + 1) and value model (seed + 2), saved in the HF layout."""
    import paddle

    from alignment.models import LlamaConfig, LlamaForCausalLM
    from alignment.models.score_model import ScoreConfig, ScoreModel

    paths = {name: os.path.join(directory, name) for name in ("policy", "reward", "value")}
    paddle.seed(seed)
    policy = LlamaForCausalLM(model_config(tokenizer, LlamaConfig))
    policy.save_pretrained(paths["policy"], tokenizer_dir=tokenizer.name_or_path)
    for offset, name in ((1, "reward"), (2, "value")):
        paddle.seed(seed + offset)
        ScoreModel(model_config(tokenizer, ScoreConfig, num_labels=1)).save_pretrained(
            paths[name], tokenizer_dir=tokenizer.name_or_path)
    return paths
