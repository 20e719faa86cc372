"""Write small random Gemma 3 GGUF files with llama.cpp's conventions, for cache and loader tests.

Every supported tensor type appears: the embedding in Q8_0, q/k/gate/up in Q5_0, o in Q4_K, down in Q6_K,
v in F16 and norms in F32 stored as (1 + w), as llama.cpp writes them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS, HEAD_DIM, WINDOW = 256, 512, 2, 4, 1, 64, 4
SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
PIECES = ["\u2581", "a", "b", "c", "\u2581a", "\u2581b", "ab", "abc", "\u2581ab", "  ", "\n", "<start_of_turn>"]


def tiny_vocab() -> tuple[list[str], list[int]]:
    tokens = SPECIAL + [f"<0x{byte:02X}>" for byte in range(256)] + PIECES
    types = [3] * len(SPECIAL) + [6] * 256 + [1] * (len(PIECES) - 3) + [4, 4, 3]
    return tokens, types


# gguf-py cannot quantize K-quants, so their blocks are random bytes with the fp16 super-block scales set to
# small finite values: byte offsets of those scales within a block, per type (ggml's block_q4_K / block_q6_K)
K_QUANT_SCALES = {"Q4_K": (144, (0, 2)), "Q6_K": (210, (208,))}


def random_k_quant_blocks(rng: np.random.Generator, rows: int, cols: int, kind: str) -> np.ndarray:
    block_bytes, scale_offsets = K_QUANT_SCALES[kind]
    blocks = rng.integers(0, 256, size=(rows, cols // 256, block_bytes), dtype=np.uint8)
    scales = (np.abs(rng.standard_normal((rows, cols // 256, len(scale_offsets)))) * 2e-3).astype(np.float16)
    for index, offset in enumerate(scale_offsets):
        blocks[..., offset:offset + 2] = scales[..., index:index + 1].view(np.uint8)
    return blocks.reshape(rows, -1)


def write_tiny_gemma3_gguf(path: str | Path, seed: int = 0, architecture: str = "gemma3") -> Path:
    import gguf

    path = Path(path)
    rng = np.random.default_rng(seed)
    tokens, types = tiny_vocab()
    writer = gguf.GGUFWriter(str(path), arch=architecture)
    writer.add_name("tiny gemma3")
    writer.add_context_length(64)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(INTERMEDIATE)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_sliding_window(WINDOW)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types(types)
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)

    def weight(name: str, rows: int, cols: int, kind: str) -> None:
        values = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
        qtype = gguf.GGMLQuantizationType[kind]
        if kind == "F16":
            writer.add_tensor(name, values.astype(np.float16))
        elif kind in K_QUANT_SCALES:
            writer.add_tensor(name, random_k_quant_blocks(rng, rows, cols, kind), raw_dtype=qtype)
        else:  # gguf-py quantizes the legacy types itself
            writer.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)

    def norm(name: str, size: int) -> None:
        writer.add_tensor(name, (1.0 + rng.standard_normal(size) * 0.1).astype(np.float32))

    weight("token_embd.weight", len(tokens), HIDDEN, "Q8_0")
    norm("output_norm.weight", HIDDEN)
    for layer in range(LAYERS):
        prefix = f"blk.{layer}."
        weight(prefix + "attn_q.weight", HEADS * HEAD_DIM, HIDDEN, "Q5_0")
        weight(prefix + "attn_k.weight", KV_HEADS * HEAD_DIM, HIDDEN, "Q5_0")
        weight(prefix + "attn_v.weight", KV_HEADS * HEAD_DIM, HIDDEN, "F16")
        weight(prefix + "attn_output.weight", HIDDEN, HEADS * HEAD_DIM, "Q4_K")
        weight(prefix + "ffn_gate.weight", INTERMEDIATE, HIDDEN, "Q5_0")
        weight(prefix + "ffn_up.weight", INTERMEDIATE, HIDDEN, "Q5_0")
        weight(prefix + "ffn_down.weight", HIDDEN, INTERMEDIATE, "Q6_K")
        for name, size in (("attn_norm", HIDDEN), ("attn_q_norm", HEAD_DIM), ("attn_k_norm", HEAD_DIM),
                           ("post_attention_norm", HIDDEN), ("ffn_norm", HIDDEN), ("post_ffw_norm", HIDDEN)):
            norm(prefix + name + ".weight", size)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
