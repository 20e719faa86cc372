"""Thin wrapper over a ``tokenizers`` tokenizer with the ids, special-token strings and chat template the runtime
needs; loaded from a checkpoint directory (``load_tokenizer``) or built from a GGUF (``gguf_tokenizer``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as _HFTokenizer

from .model_config import CheckpointError

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"  # where transformers 4.43+ saves a template outside tokenizer_config
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")
# special-token spellings used by common families, tried when config.json names no ids
BOS_CANDIDATES = ("<s>", "<|begin_of_text|>", "<bos>", "<|bos|>")
EOS_CANDIDATES = ("</s>", "<|end_of_text|>", "<|eot_id|>", "<eos>", "<|eos|>", "<|endoftext|>")


class Tokenizer:
    """encode(str) -> list[int], decode(list[int]) -> str, plus bos/eos ids and vocab size.

    ``bos_token_id`` is the id text prompts start with, None when the tokenizer adds no BOS
    (``add_bos_token`` false in the GGUF or tokenizer_config.json), so callers that prepend it when present
    tokenize as transformers does. ``special_tokens`` holds the strings chat templates see (``bos_token``,
    ``eos_token``, ...; the BOS string is kept even when no BOS is added, since templates write it themselves);
    ``chat_template`` is the model's jinja2 template or None.
    """

    def __init__(self, tokenizer: _HFTokenizer, bos_token_id: int | None, eos_token_ids: set[int],
                 add_bos_token: bool = True, special_tokens: dict[str, str | None] | None = None,
                 chat_template: str | None = None):
        self._tokenizer = tokenizer
        self.bos_token_id = bos_token_id if add_bos_token else None
        self.eos_token_ids = eos_token_ids
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.special_tokens = dict(special_tokens or {})
        if self.special_tokens.get("bos_token") is None and bos_token_id is not None:
            self.special_tokens["bos_token"] = tokenizer.id_to_token(bos_token_id)
        if self.special_tokens.get("eos_token") is None and len(eos_token_ids) == 1:
            self.special_tokens["eos_token"] = tokenizer.id_to_token(next(iter(eos_token_ids)))
        self.chat_template = chat_template

    @property
    def backend(self) -> _HFTokenizer:
        """The ``tokenizers.Tokenizer`` underneath (to save as tokenizer.json)."""
        return self._tokenizer

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        """Ids of ``text``; special tokens written in it (``<|im_start|>``, ``<start_of_turn>``) stay whole."""
        ids = self._tokenizer.encode(text, add_special_tokens=False).ids
        return [self.bos_token_id, *ids] if add_bos and self.bos_token_id is not None else ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)


def _token_string(value: Any) -> str | None:
    """A tokenizer_config.json special token: a string or an AddedToken dict ({"content": ...})."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def chat_template_from_hf(path: str | Path) -> str | None:
    """The chat template of a Hugging Face checkpoint directory: ``chat_template.jinja``, else
    ``tokenizer_config.json``'s ``chat_template`` (a string, or a list of named templates: the one named
    "default"); None when it has none."""
    directory = Path(path)
    directory = directory if directory.is_dir() else directory.parent
    if (directory / CHAT_TEMPLATE_FILE).is_file():
        return (directory / CHAT_TEMPLATE_FILE).read_text()
    template = _read_tokenizer_config(directory).get("chat_template")
    if isinstance(template, list):
        named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def _read_tokenizer_config(directory: Path) -> dict[str, Any]:
    file = directory / TOKENIZER_CONFIG_FILE
    if not file.is_file():
        return {}
    try:
        config = json.loads(file.read_text())
    except json.JSONDecodeError as error:
        raise CheckpointError(f"{file}: not valid JSON ({error})") from error
    if not isinstance(config, dict):
        raise CheckpointError(f"{file}: expected a JSON object, got {type(config).__name__}")
    return config


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load tokenizer.json from a checkpoint directory (or the file itself).

    bos/eos ids come from the directory's config.json when it names them, else from well-known special tokens;
    tokenizer_config.json (when present) gives the special-token strings, ``add_bos_token`` (true when unsaid)
    and the chat template (``chat_template_from_hf``).
    When config.json gives a vocab_size, the tokenizer must not produce ids beyond it.
    """
    path = Path(path)
    directory, file = (path, path / TOKENIZER_FILE) if path.is_dir() else (path.parent, path)
    if not file.is_file():
        raise CheckpointError(f"{file}: missing tokenizer.json")
    try:
        tokenizer = _HFTokenizer.from_file(str(file))
    except Exception as error:
        raise CheckpointError(f"{file}: cannot read tokenizer ({error})") from error
    config = {}
    if (directory / "config.json").is_file():
        config = json.loads((directory / "config.json").read_text())
    tokenizer_config = _read_tokenizer_config(directory)
    bos = config.get("bos_token_id")
    if bos is None:
        bos = next((tokenizer.token_to_id(t) for t in BOS_CANDIDATES if tokenizer.token_to_id(t) is not None), None)
    eos = config.get("eos_token_id")
    if eos is None:
        eos_ids = {tokenizer.token_to_id(t) for t in EOS_CANDIDATES if tokenizer.token_to_id(t) is not None}
    else:
        eos_ids = {eos} if isinstance(eos, int) else set(eos)
    add_bos = tokenizer_config.get("add_bos_token")
    wrapped = Tokenizer(tokenizer, bos, eos_ids, add_bos_token=True if add_bos is None else bool(add_bos),
                        special_tokens={name: _token_string(tokenizer_config.get(name)) for name in
                                        SPECIAL_TOKEN_NAMES},
                        chat_template=chat_template_from_hf(directory))
    model_vocab = config.get("vocab_size") or config.get("target_vocab_size")
    if model_vocab is not None and wrapped.vocab_size > model_vocab:
        raise CheckpointError(f"{file}: tokenizer has {wrapped.vocab_size} tokens but {directory / 'config.json'} "
                              f"says vocab_size {model_vocab}; ids >= {model_vocab} would have no embedding")
    return wrapped


def save_tokenizer(tokenizer: Tokenizer, directory: str | Path) -> None:
    """tokenizer.json and a tokenizer_config.json (special tokens, add_bos_token, chat template) that both
    ``load_tokenizer`` and transformers' AutoTokenizer read."""
    directory = Path(directory)
    tokenizer.backend.save(str(directory / TOKENIZER_FILE))
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast",
                              "add_bos_token": tokenizer.bos_token_id is not None,
                              **{k: v for k, v in tokenizer.special_tokens.items() if v is not None}}
    if tokenizer.chat_template is not None:
        config["chat_template"] = tokenizer.chat_template
    (directory / TOKENIZER_CONFIG_FILE).write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
