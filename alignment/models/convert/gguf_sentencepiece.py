"""A GGUF's SentencePiece vocabulary (`tokenizer.ggml.model` "llama": LLaMA 1/2, Mistral, ERNIE 4.5) as a
`tokenizers` BPE, the way transformers builds it from a GGUF (LlamaTokenizer from tokens and merges):

- the pieces keep their ids; the merges are recovered from the scores (a SentencePiece BPE model scores each
  piece by the order it was learned: every split of a piece into two pieces of the vocabulary is a merge ranked
  by the whole piece's score, higher first), from normal pieces only: control, byte and unused pieces are never
  matched in text;
- a space becomes "▁", and "▁" goes before the text when `tokenizer.ggml.add_space_prefix` (default true) says
  so: before the text and after each special token in it, as llama.cpp tokenizes (transformers' Metaspace adds
  it only before the first piece, and not before text that starts with a space, which sentencepiece does);
- a character outside the vocabulary is its UTF-8 bytes as `<0xNN>` pieces (byte fallback) when the vocabulary
  has them, else the unknown token; decoding reverses both.

Encodings equal sentencepiece's own on a model trained with identity normalisation
(tests/models/test_import_gguf_spm.py): SentencePiece's normaliser (NFKC, collapsing whitespace) is not in a GGUF, and
llama.cpp does not apply it either.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import gguf
from tokenizers import Tokenizer, decoders, models, normalizers

SPACE = "\u2581"
NORMAL, UNKNOWN, BYTE = int(gguf.TokenType.NORMAL), int(gguf.TokenType.UNKNOWN), int(gguf.TokenType.BYTE)


def first_ids(tokens: Sequence[str]) -> Dict[str, int]:
    """token -> id; a few GGUFs repeat a token (padding): the first id is kept."""
    vocab: Dict[str, int] = {}
    for index, token in enumerate(tokens):
        vocab.setdefault(token, index)
    return vocab


def merges_from_scores(tokens: Sequence[str], scores: Sequence[float], types: Sequence[int],
                       ids: Dict[str, int]) -> List[Tuple[str, str]]:
    """Every (left, right) split of a normal piece into two pieces of the vocabulary `ids` (first_ids), ranked by
    the whole piece's score (higher first; ties: shorter left part first, then the parts' ids), as transformers'
    generate_merges."""
    ranked = []
    for token, score, kind in zip(tokens, scores, types):
        if kind != NORMAL or len(token) < 2:
            continue
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ids and right in ids:
                ranked.append((-score, len(left), len(right), ids[left], ids[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def sentencepiece_tokenizer(meta: dict) -> Tokenizer:
    """The BPE of a "llama" GGUF vocabulary (tokens, scores, token types); specials are added by the caller."""
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = list(meta.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens))
    scores = list(meta.get("tokenizer.ggml.scores") or [-float(i) for i in range(len(tokens))])
    vocab = first_ids(tokens)
    unknown = meta.get("tokenizer.ggml.unknown_token_id")
    if unknown is None:
        unknown = next((i for i, kind in enumerate(types) if kind == UNKNOWN), None)
    byte_fallback = any(kind == BYTE for kind in types)
    tokenizer = Tokenizer(models.BPE(vocab, merges_from_scores(tokens, scores, types, vocab),
                                     unk_token=tokens[unknown] if unknown is not None else None,
                                     fuse_unk=True, byte_fallback=byte_fallback))
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    spaces = normalizers.Replace(" ", SPACE)
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), spaces]) if prefix else spaces
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    tokenizer.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    return tokenizer
