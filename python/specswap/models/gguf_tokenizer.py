"""Tokenizers and chat templates described by a GGUF file's metadata, built on the ``tokenizers`` library.

A GGUF has no tokenizer.json: it stores the vocabulary (``tokenizer.ggml.tokens``), its scores, token types and
merges, the special-token ids, the BOS/EOS flags and the chat template as metadata under llama.cpp's key names.
This module rebuilds the tokenizer those describe the way transformers' GGUF conversion does
(``transformers/integrations/gguf/gguf_tokenizer_mapping.py``; tests/models/test_gguf_tokenizer.py checks both
encode alike):

- ``tokenizer.ggml.model == "llama"``: sentencepiece BPE with byte fallback. Gemma files (architecture
  ``gemma*``) get Gemma's spelling (spaces respelled as U+2581 by a normalizer, whitespace-only tokens respelled
  to match) and merges ordered by file position; other files get Llama's Metaspace and merges ordered by score.
- ``tokenizer.ggml.model == "gpt2"``: byte-level BPE from the file's merges; ``tokenizer.ggml.pre`` picks the
  split regex (Llama 3, Qwen 2, ...), and any other value keeps GPT-2's own.

Control tokens (type 3) become special added tokens and user-defined ones (type 4) plain added tokens, so both are
matched whole in text, as llama.cpp does.

``read_gguf_metadata`` parses only the metadata section with ``struct`` (a fraction of a second even for
Gemma's 262k-token vocabulary, where ``gguf.GGUFReader`` takes tens of seconds); every function here also takes
an open ``GGUFReader`` or an already-read metadata dict.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any

from .model_config import CheckpointError

TOKEN_TYPE_CONTROL = 3       # llama.cpp token types
TOKEN_TYPE_USER_DEFINED = 4
GGUF_VERSIONS = (2, 3)
SUPPORTED_TOKENIZER_MODELS = ("gpt2", "llama")
SENTENCEPIECE_GEMMA_ARCHITECTURES = ("gemma", "gemma2", "gemma3")

# Split regexes for tokenizer.ggml.pre values, as transformers' GGUF_PRE_TOKENIZER_SPLITS has them
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_TEKKEN_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                 r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
                 r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZER_SPLITS: dict[str, str] = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                     "dbrx", "smaug-bpe"), _LLAMA3_SPLIT),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "megrez"), _QWEN2_SPLIT),
    "tekken": _TEKKEN_SPLIT,
    **dict.fromkeys(("gpt-4o", "llama4"), _GPT4O_SPLIT),
}

# the metadata a tokenizer needs (everything else in the file is left unread by tokenizer_metadata)
TOKENIZER_KEYS = (
    "general.architecture", "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
    "tokenizer.ggml.scores", "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_space_prefix",
    "tokenizer.chat_template",
)

# ------------------------------------------------------------------------------------------ metadata

_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
                   12: "<d"}
_TYPE_STRING, _TYPE_ARRAY = 8, 9


def read_gguf_metadata(path: str | Path) -> dict[str, Any]:
    """Every metadata key of a GGUF file as Python values (str, int, float, bool, lists), tensors left unread.

    A missing, foreign, truncated or corrupt file is a CheckpointError naming the file and the byte it broke at.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: GGUF file does not exist")
    with open(path, "rb") as file:
        if path.stat().st_size == 0:
            raise CheckpointError(f"{path}: not a GGUF file (empty)")
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _parse_metadata(data, path)


def _parse_metadata(data, path: Path) -> dict[str, Any]:
    offset = 0

    def take(fmt: str):
        nonlocal offset
        value = struct.unpack_from(fmt, data, offset)
        offset += struct.calcsize(fmt)
        return value[0]

    def string() -> str:
        nonlocal offset
        size = take("<Q")
        if offset + size > len(data):
            raise struct.error(f"a string of {size} bytes runs past the end of the file")
        text = bytes(data[offset:offset + size]).decode("utf-8", errors="replace")
        offset += size
        return text

    def value(kind: int):
        if kind == _TYPE_STRING:
            return string()
        if kind == _TYPE_ARRAY:
            item_kind, count = take("<I"), take("<Q")
            if item_kind in _SCALAR_FORMATS:
                fmt = _SCALAR_FORMATS[item_kind]
                width = struct.calcsize(fmt)
                if offset + count * width > len(data):
                    raise struct.error(f"an array of {count} values runs past the end of the file")
                items = list(struct.unpack_from(f"<{count}{fmt[1]}", data, offset))
                offset_add(count * width)
                return items
            return [value(item_kind) for _ in range(count)]
        if kind not in _SCALAR_FORMATS:
            raise ValueError(f"unknown metadata value type {kind}")
        return take(_SCALAR_FORMATS[kind])

    def offset_add(size: int):
        nonlocal offset
        offset += size

    if bytes(data[:4]) != b"GGUF":
        raise CheckpointError(f"{path}: not a GGUF file (starts with {bytes(data[:4])!r}, not b'GGUF')")
    key = "the header"
    try:
        offset = 4
        version = take("<I")
        if version not in GGUF_VERSIONS:
            raise CheckpointError(f"{path}: GGUF version {version} is not supported; valid: {list(GGUF_VERSIONS)}")
        take("<Q")  # tensor count
        count = take("<Q")
        metadata: dict[str, Any] = {}
        for index in range(count):
            key = f"metadata entry {index}"
            key = string()
            metadata[key] = value(take("<I"))
        return metadata
    except (struct.error, ValueError, OverflowError, MemoryError) as error:
        raise CheckpointError(f"{path}: GGUF metadata is truncated or corrupt at byte {offset} "
                              f"(reading {key!r}: {error})") from error


def tokenizer_metadata(source) -> dict[str, Any]:
    """The tokenizer's metadata from a GGUF path, an open ``gguf.GGUFReader`` or a metadata dict."""
    if isinstance(source, dict):
        return source
    if isinstance(source, (str, Path)):
        return read_gguf_metadata(source)
    fields = getattr(source, "fields", None)
    if fields is None:
        raise TypeError(f"expected a GGUF path, a gguf.GGUFReader or a metadata dict, got {type(source).__name__}")
    return {key: fields[key].contents() for key in TOKENIZER_KEYS if key in fields}


def _source_name(source) -> str:
    if isinstance(source, (str, Path)):
        return str(source)
    data = getattr(source, "data", None)
    return str(getattr(data, "filename", "GGUF metadata"))


def _required(metadata: dict[str, Any], key: str, name: str):
    if key not in metadata:
        raise CheckpointError(f"{name}: GGUF metadata has no {key!r}, which a tokenizer needs")
    return metadata[key]


# ------------------------------------------------------------------------------------------ building


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table, the alphabet byte-level vocabularies are spelled in."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


def sentencepiece_merges(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """BPE merges implied by a vocabulary, best first: every split of a token into two vocabulary pieces,
    ordered by the token's score (then by piece lengths). Same order as transformers' ``generate_merges``."""
    merges = []
    for merged, score in scores.items():
        local = [(merged[:cut], merged[cut:], score) for cut in range(1, len(merged))
                 if merged[:cut] in vocab and merged[cut:] in vocab]
        local.sort(key=lambda merge: (vocab[merge[0]], vocab[merge[1]]))
        merges.extend(local)
    merges.sort(key=lambda merge: (merge[2], len(merge[0]), len(merge[1])), reverse=True)
    return [(left, right) for left, right, _ in merges]


def _file_merges(metadata: dict[str, Any]) -> list[tuple[str, str]] | None:
    merges = metadata.get("tokenizer.ggml.merges")
    return None if merges is None else [tuple(merge.split(" ", 1)) for merge in merges]


def _sentencepiece(metadata: dict[str, Any], name: str):
    """Sentencepiece BPE with byte fallback: Gemma's spelling for gemma* files, Llama's Metaspace otherwise."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers  # noqa: PLC0415
    from tokenizers.models import BPE  # noqa: PLC0415

    tokens: list[str] = _required(metadata, "tokenizer.ggml.tokens", name)
    unk_id = metadata.get("tokenizer.ggml.unknown_token_id")
    gemma = metadata.get("general.architecture") in SENTENCEPIECE_GEMMA_ARCHITECTURES
    if gemma:
        # Gemma files store whitespace-only tokens with real spaces while the normalizer looks them up as U+2581;
        # its scores do not follow merge order, file position does
        tokens = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens]
        vocab = {token: index for index, token in enumerate(tokens)}
        order = {token: -index for index, token in enumerate(tokens)}
    else:
        vocab = {token: index for index, token in enumerate(tokens)}
        scores = _required(metadata, "tokenizer.ggml.scores", name) if "tokenizer.ggml.merges" not in metadata \
            else None
        order = dict(zip(tokens, scores)) if scores is not None else None
    merges = _file_merges(metadata) or sentencepiece_merges(vocab, order)
    unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else ("<unk>" if gemma else None)
    tokenizer = Tokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=True, unk_token=unk, dropout=None,
                              byte_fallback=True))
    if gemma:
        tokenizer.normalizer = normalizers.Replace(" ", "\u2581")
        tokenizer.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
        tokenizer.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                               decoders.Fuse()])
    else:
        # transformers' LlamaTokenizer (legacy=False, add_prefix_space=True): one "▁" before the first word only
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
        tokenizer.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                               decoders.Fuse(), decoders.Strip(content=" ", left=1)])
    return tokenizer, vocab


def _byte_level(metadata: dict[str, Any], name: str):
    """Byte-level BPE over the file's merges, split by the regex ``tokenizer.ggml.pre`` names."""
    from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers  # noqa: PLC0415
    from tokenizers.models import BPE  # noqa: PLC0415

    tokens: list[str] = _required(metadata, "tokenizer.ggml.tokens", name)
    merges = _file_merges(metadata)
    if merges is None:
        raise CheckpointError(f"{name}: a 'gpt2' tokenizer needs 'tokenizer.ggml.merges', which the file lacks")
    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    # tokens outside the byte alphabet (added tokens stored in plain text) are respelled byte by byte
    vocab = {token if set(token) <= alphabet else "".join(spelling[b] for b in token.encode("utf-8")): index
             for index, token in enumerate(tokens)}
    tokenizer = Tokenizer(BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                              end_of_word_suffix="", fuse_unk=False))
    split = PRE_TOKENIZER_SPLITS.get(metadata.get("tokenizer.ggml.pre"))
    if split is None:  # "default", "gpt2", "smollm", ...: GPT-2's own regex
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                                           pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                                    use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer, vocab, alphabet


def build_gguf_tokenizer(source):
    """The ``tokenizers.Tokenizer`` a GGUF's metadata describes (``source``: path, GGUFReader or metadata dict).

    An unsupported ``tokenizer.ggml.model`` is refused naming it and the supported ones.
    """
    return _build(tokenizer_metadata(source), _source_name(source))


def _build(metadata: dict[str, Any], name: str):
    from tokenizers import AddedToken  # noqa: PLC0415

    model = _required(metadata, "tokenizer.ggml.model", name)
    alphabet = None
    if model == "llama":
        tokenizer, vocab = _sentencepiece(metadata, name)
    elif model == "gpt2":
        tokenizer, vocab, alphabet = _byte_level(metadata, name)
    else:
        raise CheckpointError(f"{name}: tokenizer.ggml.model {model!r} is not supported; "
                              f"supported: {list(SUPPORTED_TOKENIZER_MODELS)}")
    tokens = metadata["tokenizer.ggml.tokens"]
    types = metadata.get("tokenizer.ggml.token_type") or ()
    # a control token spelled outside a byte-level alphabet is a llama.cpp mislabel; adding it would grow the
    # vocabulary past the model's (transformers skips it too)
    control = [AddedToken(token, normalized=False, special=True) for token, kind in zip(tokens, types)
               if kind == TOKEN_TYPE_CONTROL and (alphabet is None or set(token) <= alphabet)]
    tokenizer.add_special_tokens(control)
    spelled = tokens if model == "gpt2" else list(vocab)  # Gemma respells; user tokens are matched as spelled
    user = [AddedToken(token, normalized=False, special=False) for token, kind in zip(spelled, types)
            if kind == TOKEN_TYPE_USER_DEFINED and token in vocab]
    tokenizer.add_tokens(user)
    return tokenizer


def _token(metadata: dict[str, Any], key: str) -> str | None:
    index = metadata.get(f"tokenizer.ggml.{key}")
    tokens = metadata.get("tokenizer.ggml.tokens") or []
    return tokens[index] if index is not None and 0 <= index < len(tokens) else None


def tokenizer_config_from_gguf(source) -> dict[str, Any]:
    """What a tokenizer_config.json would say for this file: special tokens, BOS/EOS flags and chat template.

    ``add_bos_token`` defaults to True for sentencepiece vocabularies that do not say (llama.cpp's rule, as in
    transformers), False otherwise.
    """
    metadata = tokenizer_metadata(source)
    add_bos = metadata.get("tokenizer.ggml.add_bos_token")
    if add_bos is None:
        add_bos = metadata.get("tokenizer.ggml.model") == "llama"
    return {
        "bos_token": _token(metadata, "bos_token_id"), "eos_token": _token(metadata, "eos_token_id"),
        "unk_token": _token(metadata, "unknown_token_id"), "pad_token": _token(metadata, "padding_token_id"),
        "add_bos_token": bool(add_bos), "add_eos_token": bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
        "chat_template": metadata.get("tokenizer.chat_template"),
    }


def chat_template_from_gguf(source) -> str | None:
    """The file's ``tokenizer.chat_template`` (a jinja2 string), or None when it has none."""
    return tokenizer_metadata(source).get("tokenizer.chat_template")


def tokenizer_from_gguf(source):
    """The runtime ``Tokenizer`` (encode/decode, BOS/EOS ids, special-token strings, chat template) of a GGUF.

    ``source``: a path, an open ``gguf.GGUFReader`` or a metadata dict from ``read_gguf_metadata``.
    """
    from .tokenizer import Tokenizer  # noqa: PLC0415

    metadata = tokenizer_metadata(source)
    tokenizer = _build(metadata, _source_name(source))
    config = tokenizer_config_from_gguf(metadata)
    bos = metadata.get("tokenizer.ggml.bos_token_id")
    eos = metadata.get("tokenizer.ggml.eos_token_id")
    return Tokenizer(tokenizer, bos, {eos} if eos is not None else set(), add_bos_token=config["add_bos_token"],
                     special_tokens={k: config[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token")},
                     chat_template=config["chat_template"])


__all__ = [
    "PRE_TOKENIZER_SPLITS", "SUPPORTED_TOKENIZER_MODELS", "build_gguf_tokenizer", "bytes_to_unicode",
    "chat_template_from_gguf", "read_gguf_metadata", "sentencepiece_merges", "tokenizer_config_from_gguf",
    "tokenizer_from_gguf", "tokenizer_metadata",
]
