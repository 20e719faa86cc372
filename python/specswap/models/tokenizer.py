"""Thin wrapper over a ``tokenizers`` tokenizer.json with the ids the runtime needs."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer as _HFTokenizer

from .config import CheckpointError

TOKENIZER_FILE = "tokenizer.json"
# special-token spellings used by common families, tried when config.json names no ids
BOS_CANDIDATES = ("<s>", "<|begin_of_text|>", "<bos>", "<|bos|>")
EOS_CANDIDATES = ("</s>", "<|end_of_text|>", "<|eot_id|>", "<eos>", "<|eos|>", "<|endoftext|>")


class Tokenizer:
    """encode(str) -> list[int], decode(list[int]) -> str, plus bos/eos ids and vocab size."""

    def __init__(self, tokenizer: _HFTokenizer, bos_token_id: int | None, eos_token_ids: set[int]):
        self._tokenizer = tokenizer
        self.bos_token_id = bos_token_id
        self.eos_token_ids = eos_token_ids
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = self._tokenizer.encode(text, add_special_tokens=False).ids
        return [self.bos_token_id, *ids] if add_bos and self.bos_token_id is not None else ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load tokenizer.json from a checkpoint directory (or the file itself).

    bos/eos ids come from the directory's config.json when it names them, else from well-known special tokens.
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
    bos = config.get("bos_token_id")
    if bos is None:
        bos = next((tokenizer.token_to_id(t) for t in BOS_CANDIDATES if tokenizer.token_to_id(t) is not None), None)
    eos = config.get("eos_token_id")
    if eos is None:
        eos_ids = {tokenizer.token_to_id(t) for t in EOS_CANDIDATES if tokenizer.token_to_id(t) is not None}
    else:
        eos_ids = {eos} if isinstance(eos, int) else set(eos)
    wrapped = Tokenizer(tokenizer, bos, eos_ids)
    model_vocab = config.get("vocab_size") or config.get("target_vocab_size")
    if model_vocab is not None and wrapped.vocab_size > model_vocab:
        raise CheckpointError(f"{file}: tokenizer has {wrapped.vocab_size} tokens but {directory / 'config.json'} "
                              f"says vocab_size {model_vocab}; ids >= {model_vocab} would have no embedding")
    return wrapped
