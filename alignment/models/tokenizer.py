"""A thin tokenizer over the `tokenizers` library, reading the Hugging Face files of a checkpoint directory.

`tokenizer.json` gives the model; `tokenizer_config.json` gives the special tokens and the chat template
(rendered with jinja2 as transformers does). Checkpoints without a chat template use DEFAULT_CHAT_TEMPLATE,
the plain "BEGINNING OF CONVERSATION: USER: ... ASSISTANT:" format of safe-rlhf and PaddleNLP's PPO.
"""
from __future__ import annotations

import json
import os
import shutil
from typing import Dict, List, Optional

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

from alignment.inputs import FLAG, POSITIVE_NUMBER, TEXT, Kind, check_keys, read_json, read_text

DEFAULT_CHAT_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}BEGINNING OF CONVERSATION:{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}"
    "{% elif message['role'] == 'user' %} USER: {{ message['content'] }}"
    "{% else %} ASSISTANT:{{ message['content'] }}{{ eos_token }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %} ASSISTANT:{% endif %}"
)

# PaddleNLP's chat_template "none": no template; prompts are used as they are (already templated text) and each
# answer follows its prompt directly (the tokenizer's EOS is appended after answers by the data code)
NO_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


SPECIAL_TOKEN = Kind("a string or {\"content\": string}", lambda v: isinstance(v, str) or (
    isinstance(v, dict) and isinstance(v.get("content"), str)))
CONFIG_KEYS = {"add_bos_token": FLAG, "chat_template": TEXT, "model_max_length": POSITIVE_NUMBER,
               **{f"{name}_token": SPECIAL_TOKEN for name in ("bos", "eos", "pad", "unk")}}  # what we read of it


def _token_string(value) -> Optional[str]:
    """tokenizer_config.json stores special tokens as strings or as {"content": ...} dicts."""
    if isinstance(value, dict):
        return value.get("content")
    return value


def _raise_template_error(message):
    raise jinja2.exceptions.TemplateError(message)


class Tokenizer:
    def __init__(self, tokenizer: HFTokenizer, config: Dict, name_or_path: str = ""):
        self._tok = tokenizer
        self.config = config
        self.name_or_path = name_or_path
        self.chat_template = config.get("chat_template") or DEFAULT_CHAT_TEMPLATE
        self._template, self._template_source = None, None  # the compiled chat template and its text
        self.template_file = (None, None)  # (a chat template read from a file, that file)
        self.bos_token = _token_string(config.get("bos_token"))
        self.eos_token = _token_string(config.get("eos_token"))
        self.pad_token = _token_string(config.get("pad_token")) or self.eos_token
        self.add_bos_token = bool(config.get("add_bos_token", False))
        self.model_max_length = int(config.get("model_max_length", 10**9))

    @classmethod
    def from_pretrained(cls, path: str) -> "Tokenizer":
        file = os.path.join(path, "tokenizer.json")
        if not os.path.exists(file):
            raise FileNotFoundError(f"{file}: tokenizer not found (a checkpoint directory needs tokenizer.json)")
        config_file = os.path.join(path, "tokenizer_config.json")
        config = {}
        if os.path.exists(config_file):
            config = check_keys(read_json(config_file, "tokenizer config"), CONFIG_KEYS, config_file,
                                what="tokenizer config")
        template_file = os.path.join(path, "chat_template.jinja")
        source = config_file if config.get("chat_template") else None
        if os.path.exists(template_file) and not config.get("chat_template"):
            config["chat_template"], source = read_text(template_file, "chat template"), template_file
        try:
            tokenizer = HFTokenizer.from_str(read_text(file, "tokenizer file"))
        except Exception as err:  # the tokenizers library raises a bare Exception for a corrupt file
            if isinstance(err, ValueError) and str(err).startswith(file):
                raise  # the shared reader's error: it names the file
            raise ValueError(f"{file}: not a valid tokenizer file ({err})") from None
        tokenizer_ = cls(tokenizer, config, path)
        tokenizer_.template_file = (config.get("chat_template"), source)
        return tokenizer_

    def save_pretrained(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)
        self._tok.save(os.path.join(path, "tokenizer.json"))
        with open(os.path.join(path, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(self.config, f, indent=2, ensure_ascii=False)

    def token_to_id(self, token: Optional[str]) -> Optional[int]:
        return None if token is None else self._tok.token_to_id(token)

    @property
    def bos_token_id(self) -> Optional[int]:
        return self.token_to_id(self.bos_token)

    @property
    def eos_token_id(self) -> Optional[int]:
        return self.token_to_id(self.eos_token)

    @property
    def pad_token_id(self) -> int:
        pad = self.token_to_id(self.pad_token)
        if pad is None:
            raise ValueError(f"{self.name_or_path}: tokenizer has neither a pad nor an eos token")
        return pad

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = False) -> List[int]:
        """Token ids of `text`; special tokens written in the text (e.g. <|im_start|>) are recognised."""
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos_token and self.bos_token_id is not None:
            ids = [self.bos_token_id] + ids
        return ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def batch_decode(self, batch, skip_special_tokens: bool = True) -> List[str]:
        return [self.decode(ids, skip_special_tokens) for ids in batch]

    def apply_chat_template(self, messages: List[Dict[str, str]], add_generation_prompt: bool = True) -> str:
        """Render a conversation to text with the checkpoint's chat template (as transformers does, in jinja2's
        sandbox); a template that does not compile, raises or does what the sandbox refuses is a one-line
        ValueError naming the tokenizer."""
        try:
            return self._compiled().render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         bos_token=self.bos_token or "", eos_token=self.eos_token or "")
        except jinja2.exceptions.TemplateError as err:  # SecurityError, UndefinedError, raise_exception(...)
            raise ValueError(f"{self._template_where()}: the chat template failed: {type(err).__name__}: "
                             f"{' '.join(str(err).split())}") from None

    def _compiled(self) -> jinja2.Template:
        """The chat template, compiled once (again only when `chat_template` is given another text)."""
        if self._template_source != self.chat_template:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise_template_error
            try:
                self._template = env.from_string(self.chat_template)
            except jinja2.exceptions.TemplateSyntaxError as err:
                raise ValueError(f"{self._template_where()}: the chat template does not compile: line {err.lineno}: "
                                 f"{err.message}") from None
            self._template_source = self.chat_template
        return self._template

    def _template_where(self) -> str:
        """The file the chat template was read from (tokenizer_config.json, chat_template.jinja), else the
        tokenizer's directory."""
        text, file = self.template_file
        return file if file and text == self.chat_template else self.name_or_path

    def chat_messages(self, turns) -> List[Dict[str, str]]:
        """A prompt string or an alternating user/assistant list of turns -> chat messages."""
        if isinstance(turns, str):
            turns = [turns]
        return [{"role": "user" if i % 2 == 0 else "assistant", "content": text} for i, text in enumerate(turns)]


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                   "chat_template.jinja", "tokenizer.model")


def copy_tokenizer_files(src: str, dst: str) -> None:
    for name in TOKENIZER_FILES:
        if os.path.exists(os.path.join(src, name)):
            shutil.copy2(os.path.join(src, name), os.path.join(dst, name))
