"""GGUF files with a SentencePiece vocabulary (`tokenizer.ggml.model` "llama", as llama.cpp writes ERNIE 4.5, LLaMA 2
and Mistral; alignment/models/convert/gguf_sentencepiece.py): a SentencePiece BPE model trained here, written into
the GGUF as llama.cpp's converter writes it (pieces, scores, token types), imported: every encoding equals
sentencepiece's own and decodes back to the text; the ERNIE 4.5 fixture imported with it loads and tokenizes the
same."""
import io
import os

import gguf
import numpy as np
import pytest
import sentencepiece as spm

from alignment.models import Tokenizer as OurTokenizer
from alignment.models.convert import from_gguf
from tests.models.test_import_gguf_families import import_file, write_gguf
from tests.models.test_model_families import FIXTURES

WORDS = ("the a of to and in is it you that he was for on are with as his they be at one have this from or had by "
         "hot word but what some we can out other were all there when up use your how said an each she which do "
         "their time if will way about many then them write would like so these her long make thing see him two "
         "has look more day could go come did number sound no most people my over know water than call first "
         "who may down side been now find").split()
HELD_OUT = ["the word is hot", "  two spaces", "hello world", "日本 café ☃ 12345", "a\nb\tc", "x", "", " leading",
            "trailing ", "numbers 42, 7!", "unseen: zyx qj", "tabs\t\tand\n\nlines"]


def corpus(count=3000, seed=0):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, rng.integers(3, 12))) + rng.choice(["", ".", "!", "?", ", 42", " 7"])
            for _ in range(count)]


def trained(vocab_size, byte_fallback):
    """A SentencePiece BPE model with identity normalisation (a GGUF carries no normaliser; llama.cpp applies none)."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus()), model_writer=model, model_type="bpe", vocab_size=vocab_size,
        byte_fallback=byte_fallback, normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, character_coverage=1.0, minloglevel=2)
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def token_type(sp, i):
    """llama.cpp's convert_hf_to_gguf.py (_create_vocab_sentencepiece): the piece's type from the model."""
    if sp.is_unknown(i):
        return gguf.TokenType.UNKNOWN
    if sp.is_control(i):
        return gguf.TokenType.CONTROL
    if sp.is_byte(i):
        return gguf.TokenType.BYTE
    return gguf.TokenType.UNUSED if sp.is_unused(i) else gguf.TokenType.NORMAL


def gguf_vocabulary(sp):
    ids = range(sp.get_piece_size())
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": [sp.id_to_piece(i) for i in ids],
            "tokenizer.ggml.scores": [sp.get_score(i) for i in ids],
            "tokenizer.ggml.token_type": [int(token_type(sp, i)) for i in ids],
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0}


@pytest.fixture(scope="module")
def with_bytes():
    return trained(400, byte_fallback=True)


def test_encodings_equal_sentencepieces_with_byte_fallback(with_bytes):
    tokenizer, control = from_gguf.build_tokenizer(gguf_vocabulary(with_bytes), "spm.gguf")
    assert control == ["<s>", "</s>"]
    for text in HELD_OUT + corpus(300, seed=1):
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        assert ids == with_bytes.encode(text), text
        assert tokenizer.decode(ids) == with_bytes.decode(ids) == text


def test_a_character_outside_the_vocabulary_is_its_bytes_or_the_unknown_token(with_bytes):
    tokenizer, _ = from_gguf.build_tokenizer(gguf_vocabulary(with_bytes), "spm.gguf")
    pieces = tokenizer.encode("☃", add_special_tokens=False).tokens
    assert pieces == ["▁", "<0xE2>", "<0x98>", "<0x83>"]
    plain = trained(200, byte_fallback=False)
    tokenizer, _ = from_gguf.build_tokenizer(gguf_vocabulary(plain), "spm.gguf")
    assert tokenizer.encode("a☃b", add_special_tokens=False).ids == plain.encode("a☃b")
    assert 0 in plain.encode("a☃b")  # the unknown token, as sentencepiece gives it


def test_control_pieces_are_not_matched_in_text_and_special_tokens_keep_their_ids(with_bytes):
    tokenizer, _ = from_gguf.build_tokenizer(gguf_vocabulary(with_bytes), "spm.gguf")
    assert "<s>" not in tokenizer.encode("<0x41> s>", add_special_tokens=False).tokens[:3]
    # a special token in the text is its id, and the text after it starts a new word as llama.cpp's tokenizer does
    assert tokenizer.encode("<s>the", add_special_tokens=False).ids == [1, *with_bytes.encode("the")]


def test_no_space_prefix_when_the_file_says_so(with_bytes):
    vocabulary = {**gguf_vocabulary(with_bytes), "tokenizer.ggml.add_space_prefix": False}
    tokenizer, _ = from_gguf.build_tokenizer(vocabulary, "spm.gguf")
    encoding = tokenizer.encode("the word", add_special_tokens=False)
    assert encoding.tokens[0] != "▁the" and "▁word" in "".join(encoding.tokens)
    assert tokenizer.decode(encoding.ids) == "the word"


def test_an_ernie_gguf_with_its_sentencepiece_vocabulary_imports_and_tokenizes_the_same(tmp_path):
    sp = trained(128, byte_fallback=False)  # the fixture's vocabulary size

    def vocabulary(writer):
        writer.add_tokenizer_model("llama")
        writer.add_token_list([sp.id_to_piece(i) for i in range(128)])
        writer.add_token_scores([sp.get_score(i) for i in range(128)])
        writer.add_token_types([token_type(sp, i) for i in range(128)])
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        writer.add_unk_token_id(0)
        writer.add_add_bos_token(True)

    path = write_gguf(tmp_path / "ernie.gguf", os.path.join(FIXTURES, "ernie4_5"), "ernie4_5", vocabulary=vocabulary)
    model = import_file(path, tmp_path / "imported")
    assert model.config.vocab_size == 128
    ours = OurTokenizer.from_pretrained(str(tmp_path / "imported"))
    for text in HELD_OUT[:4] + corpus(50, seed=2):
        assert ours.encode(text) == sp.encode(text), text
        assert ours.encode(text, add_special_tokens=True) == [1, *sp.encode(text)]  # add_bos_token: <s> first
        if 0 not in sp.encode(text):  # no unknown token: the text comes back
            assert ours.decode(sp.encode(text)) == text


def test_an_unknown_tokenizer_model_is_one_line_naming_both_supported(with_bytes):
    with pytest.raises(from_gguf.ConversionError, match=r"x.gguf: tokenizer.ggml.model 'bert' is not supported "
                                                        r"\(supported: 'gpt2', byte-level BPE; 'llama', SentencePiece\)"):
        from_gguf.build_tokenizer({**gguf_vocabulary(with_bytes), "tokenizer.ggml.model": "bert"}, "x.gguf")
