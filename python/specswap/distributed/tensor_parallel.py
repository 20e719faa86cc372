"""Tensor parallelism of a target (Llama, Qwen 2/3, Mistral, Gemma 3: the shared ``models.layers`` blocks).

``shard_target(target, group)`` rewrites a built target in place into this rank's shard:

- native (GGUF block) weights stay in their blocks, split by rows of blocks; their o_proj and down_proj are
  ``GatheredColumnLinear`` (input gathered, output rows split, output gathered) so no sum is split;
- attention: q/k/v column-parallel by heads (rank r holds query heads [r h/N, (r+1) h/N) and the KV heads they
  read; with fewer KV heads than ranks a KV head is replicated on the ranks whose query heads share it), o_proj
  row-parallel: one all-reduce after attention;
- MLP: gate/up column-parallel, down row-parallel: one all-reduce after the MLP;
- embedding vocabulary-parallel (rank r looks up its rows, zeros elsewhere, one all-reduce: adding exact zeros,
  so the output has the single-process bits);
- LM head vocabulary-parallel: each rank computes its rows' logits; ``VocabParallelHead`` gathers them into the
  full row the sampler reads, except where only greedy readers read it (``greedy_only``: set by the engine's
  lockstep for an eager all-greedy step, and while a greedy round graph is captured, ``graphs.RoundGraphs``): then ``vocab_parallel_argmax`` combines each shard's (max, index) pair (two numbers per
  row gathered) and the row it returns is -inf but 0 at that argmax, which every greedy reader maps to the token;
- norms, rotary tables and the KV cache's shape follow: the cache holds this rank's KV heads.

The draft is replicated by default (``tp_draft="replicate"``): an EAGLE head keeps the unsharded embedding and
LM head it was built over, so every rank drafts the same tokens with no collective. ``shard_draft`` (``tp_draft=
"shard"``) splits it like the target instead: a draft model is sharded by ``shard_target``; an EAGLE or EAGLE-3
head's decoder layer by heads and MLP rows (two all-reduces a step) and its draft-vocabulary LM head by rows (one
all-gather of the row), its embedding (the target's) and ``fc`` replicated. results/tp2-draft-placement-native.json
measures both. Row-parallel sums change the fp32 summation order, so logits agree with one process to rounding,
not bit for bit; all ranks get the same bits (an all-reduce hands every rank one result).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from specswap.models.kv_cache import KVCache
from specswap.models.layers import Attention, GatedMLP

__all__ = ["RowParallelLinear", "VocabParallelEmbedding", "VocabParallelHead", "shard_draft", "shard_target",
           "vocab_parallel_argmax"]


def _split(total: int, parts: int, index: int, what: str) -> slice:
    if total % parts:
        raise ValueError(f"{what}={total} is not divisible by tp_size={parts}; tensor parallelism needs it to be")
    size = total // parts
    return slice(index * size, (index + 1) * size)


def _quantized():
    from specswap.models.quantized import QuantizedLinear
    return QuantizedLinear


def _is_quantized(module) -> bool:
    return type(module).__name__ == "QuantizedLinear" and isinstance(module, _quantized())


def _check_linear(linear) -> None:
    if not isinstance(linear, nn.Linear) and not _is_quantized(linear):
        raise NotImplementedError(f"tensor parallelism shards nn.Linear (fp32/bf16) and QuantizedLinear (native GGUF "
                                  f"blocks) weights; got {type(linear).__name__}")


def _linear_rows(linear, rows: slice):
    """A linear over output rows ``rows`` of ``linear`` (column parallel): a copy, so the full weight can go.
    Native weights keep their blocks: the rows' blocks, interleaved again by eight rows where they were."""
    _check_linear(linear)
    if _is_quantized(linear):
        return linear.rows(torch.arange(rows.start, rows.stop))
    out = nn.Linear(linear.in_features, rows.stop - rows.start, bias=linear.bias is not None,
                    device=linear.weight.device, dtype=linear.weight.dtype)
    with torch.no_grad():
        out.weight.copy_(linear.weight[rows])
        if linear.bias is not None:
            out.bias.copy_(linear.bias[rows])
    out.requires_grad_(False)
    return out


def _linear_cols(linear: nn.Linear, cols: slice) -> nn.Linear:
    """A bias-free linear over input columns ``cols`` of ``linear`` (row parallel; native weights never split
    their columns: ``GatheredColumnLinear``)."""
    out = nn.Linear(cols.stop - cols.start, linear.out_features, bias=False, device=linear.weight.device,
                    dtype=linear.weight.dtype)
    with torch.no_grad():
        out.weight.copy_(linear.weight[:, cols])
    out.requires_grad_(False)
    return out


class RowParallelLinear(nn.Module):
    """``x_local @ W[:, cols].T`` summed over the tensor-parallel ranks (one all-reduce), plus the bias once.

    bf16 partial sums are reduced in fp32 and rounded once."""

    def __init__(self, linear: nn.Linear, cols: slice, group):
        super().__init__()
        _check_linear(linear)
        self.local = _linear_cols(linear, cols)
        bias = getattr(linear, "bias", None)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.in_features, self.out_features = cols.stop - cols.start, linear.out_features
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.local(x)
        out = self.group.tp_sum(out.float()).to(x.dtype) if out.dtype != torch.float32 else self.group.tp_sum(out)
        return out if self.bias is None else out + self.bias


class GatheredColumnLinear(nn.Module):
    """The row-parallel position (o_proj, down_proj) for native block weights: the sharded input all-gathered, this
    rank's output rows computed over all of it, the outputs all-gathered (two all-gathers instead of one
    all-reduce). Each output is then the one-process kernel's dot product over the whole row, in its order: a split
    sum would change fp32 roundings that the next layer's per-block activation quantization can turn into other
    tokens."""

    def __init__(self, linear, tp_rank: int, tp_size: int, group):
        super().__init__()
        self.local = _linear_rows(linear, _split(linear.out_features, tp_size, tp_rank, "out_features"))
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.group = group

    def forward(self, x_local: torch.Tensor) -> torch.Tensor:
        return self.group.tp_cat(self.local(self.group.tp_cat(x_local)))


def _row_parallel(linear, cols: slice, tp_rank: int, tp_size: int, group) -> nn.Module:
    if _is_quantized(linear):
        return GatheredColumnLinear(linear, tp_rank, tp_size, group)
    return RowParallelLinear(linear, cols, group)


class VocabParallelEmbedding(nn.Module):
    """This rank's rows [start, stop) of an embedding (``Gemma``'s scale applied after the sum, where it is);
    a native (block-format) table keeps its rows' blocks and dequantizes only the rows looked up."""

    def __init__(self, embedding: nn.Module, rows: slice, group):
        super().__init__()
        self.start, self.stop = rows.start, rows.stop
        self.num_embeddings, self.embedding_dim = embedding.num_embeddings, embedding.embedding_dim
        self.group = group
        if type(embedding).__name__ == "QuantizedEmbedding":
            from specswap.models.quantized import QuantizedEmbedding
            self.embed_scale = embedding.scale
            self.table = QuantizedEmbedding(_linear_rows(embedding.table, rows), embedding.dtype, None)
            self.weight = None
        elif isinstance(embedding, nn.Embedding):
            self.embed_scale = getattr(embedding, "embed_scale", None)
            self.table = None
            self.weight = nn.Parameter(embedding.weight.detach()[rows].contiguous(), requires_grad=False)
        else:
            raise NotImplementedError(f"tensor parallelism shards nn.Embedding and QuantizedEmbedding; got "
                                      f"{type(embedding).__name__}")

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.start
        outside = (local < 0) | (local >= self.stop - self.start)
        local = local.masked_fill(outside, 0)
        rows = self.table(local) if self.table is not None else F.embedding(local, self.weight)
        rows = rows.masked_fill(outside[..., None], 0)
        dtype = rows.dtype
        # exact either way (the other ranks add zeros); gloo sums fp32 everywhere
        rows = self.group.tp_sum(rows.float()).to(dtype) if dtype != torch.float32 else self.group.tp_sum(rows)
        if self.embed_scale is not None:
            scale = torch.full((), self.embed_scale, dtype=torch.float32, device=rows.device).to(dtype)
            rows = rows * scale
        return rows


class VocabParallelHead(nn.Module):
    """This rank's LM-head rows [start, stop) (an fp32/bf16 vocabulary padded to a multiple of the ranks with zero
    rows; a native one must divide); ``forward`` returns the full logits row (one all-gather), ``local_logits``
    this rank's part."""

    def __init__(self, lm_head, tp_rank: int, tp_size: int, group):
        super().__init__()
        _check_linear(lm_head)
        vocab = lm_head.out_features
        self.shard = math.ceil(vocab / tp_size)
        self.start = tp_rank * self.shard
        stop = min(self.start + self.shard, vocab)
        self.out_features, self.in_features = vocab, lm_head.in_features
        self.valid = max(stop - self.start, 0)
        self.group = group
        if _is_quantized(lm_head):
            if vocab % tp_size:
                raise ValueError(f"a native LM head of {vocab} rows does not split over tp_size={tp_size}")
            self.local = _linear_rows(lm_head, slice(self.start, stop))
            return
        weight = lm_head.weight.detach()
        local = nn.Linear(lm_head.in_features, self.shard, bias=False, device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            local.weight.zero_()
            local.weight[:self.valid] = weight[self.start:stop]
        self.local = local.requires_grad_(False)

    @property
    def weight(self) -> torch.Tensor:
        return self.local.weight

    def local_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.local(hidden)

    # set by the engine's lockstep for a step whose every request is greedy: the logits are read by argmax only
    greedy_only = False

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.greedy_only:  # (max, index) per shard gathered, not the row: a row of -inf but 0 at the argmax
            tokens = vocab_parallel_argmax(self, hidden)
            logits = torch.full((*hidden.shape[:-1], self.out_features), float("-inf"), dtype=hidden.dtype,
                                device=hidden.device)
            # out of place: a CPU tape replays an in-place write into a fresh factory tensor wrongly
            return logits.scatter(-1, tokens.unsqueeze(-1), 0.0)
        return self.group.tp_cat(self.local_logits(hidden))[..., :self.out_features]


def vocab_parallel_argmax(head: VocabParallelHead, hidden: torch.Tensor) -> torch.Tensor:
    """Greedy tokens of ``hidden`` [..., H] from the sharded head: each rank's (max, first index of it) over its
    rows, all-gathered (two numbers per row), the largest taken, ties to the lower rank: the full row's first
    argmax, as ``torch.argmax`` picks it. Logit soft-capping (tanh, monotone) does not change the pick."""
    logits = head.local_logits(hidden)
    if head.valid < head.shard:
        logits[..., head.valid:] = float("-inf")
    values, index = logits.max(dim=-1)
    pair = torch.stack((values.float(), (index + head.start).float()), dim=-1)    # [..., 2]
    gathered = head.group.tp_stack(pair)                                            # [N, ..., 2]
    best = gathered[..., 0].argmax(dim=0)                                           # first max: lowest rank
    return gathered[..., 1].gather(0, best.unsqueeze(0)).squeeze(0).long()


def _shard_attention(attention: Attention, tp_rank: int, tp_size: int, group) -> None:
    heads, kv_heads, head_dim = attention.num_heads, attention.num_kv_heads, attention.head_dim
    q_rows = _split(heads, tp_size, tp_rank, "num_attention_heads")
    if kv_heads % tp_size and tp_size % kv_heads:
        raise ValueError(f"num_key_value_heads={kv_heads} and tp_size={tp_size}: one must divide the other (KV heads "
                         f"are split between ranks, or each replicated on tp_size/kv ranks)")
    group_size = heads // kv_heads                            # query heads per KV head
    first_kv = q_rows.start // group_size
    last_kv = (q_rows.stop - 1) // group_size
    local_heads, local_kv = q_rows.stop - q_rows.start, last_kv - first_kv + 1
    attention.q_proj = _linear_rows(attention.q_proj, slice(q_rows.start * head_dim, q_rows.stop * head_dim))
    kv_rows = slice(first_kv * head_dim, (last_kv + 1) * head_dim)
    attention.k_proj = _linear_rows(attention.k_proj, kv_rows)
    attention.v_proj = _linear_rows(attention.v_proj, kv_rows)
    attention.o_proj = _row_parallel(attention.o_proj, slice(q_rows.start * head_dim, q_rows.stop * head_dim),
                                     tp_rank, tp_size, group)
    attention.num_heads, attention.num_kv_heads = local_heads, local_kv


def _shard_mlp(mlp: GatedMLP, tp_rank: int, tp_size: int, group) -> None:
    rows = _split(mlp.gate_proj.out_features, tp_size, tp_rank, "intermediate_size")
    mlp.gate_proj = _linear_rows(mlp.gate_proj, rows)
    mlp.up_proj = _linear_rows(mlp.up_proj, rows)
    mlp.down_proj = _row_parallel(mlp.down_proj, rows, tp_rank, tp_size, group)


def _shard_layers(layers, group) -> int:
    """Every decoder layer's attention by heads and MLP by rows, in place; returns the KV heads a rank keeps."""
    for layer in layers:
        _shard_attention(layer.self_attn, group.tp_rank, group.tp_size, group)
        _shard_mlp(layer.mlp, group.tp_rank, group.tp_size, group)
    return layers[0].self_attn.num_kv_heads


def shard_target(target: nn.Module, group) -> nn.Module:
    """Rewrite ``target`` (a ``CausalLM``) in place into rank ``group.tp_rank``'s shard; returns it."""
    tp_rank, tp_size = group.tp_rank, group.tp_size
    if tp_size == 1:
        return target
    if getattr(target, "tp_size", 1) != 1:
        raise ValueError("this target is already sharded")
    layers = getattr(getattr(target, "model", None), "layers", None)
    if layers is None or not hasattr(target, "lm_head"):
        raise NotImplementedError(f"tensor parallelism supports the runtime's causal LMs (Llama, Qwen 2/3, Mistral, "
                                  f"Gemma 3); got {type(target).__name__}")
    local_kv = _shard_layers(layers, group)
    embedding = target.model.embed_tokens
    vocab = embedding.num_embeddings
    shard = math.ceil(vocab / tp_size)
    target.model.embed_tokens = VocabParallelEmbedding(
        embedding, slice(min(tp_rank * shard, vocab), min((tp_rank + 1) * shard, vocab)), group)
    # the LM head (tied or not) sharded on its own copy; a draft built over the full one keeps it
    target.lm_head = VocabParallelHead(target.lm_head, tp_rank, tp_size, group)
    config = target.config

    def make_cache(max_batch_size: int, capacity: int, dtype=None, device=None) -> KVCache:
        return KVCache(config.num_hidden_layers, max_batch_size, local_kv, capacity, config.head_dim,
                       dtype=dtype or target.dtype, device=device or target.device)

    object.__setattr__(target, "make_cache", make_cache)  # this rank's KV heads
    object.__setattr__(target, "tie_weights", lambda: None)  # the shards are not tied by name any more
    target.tp_size, target.tp_rank, target.tp_group = tp_size, tp_rank, group
    return target


def _draft_lm_rows(head) -> nn.Module:
    """An EAGLE-1 head's draft LM head as one linear over the draft vocabulary's rows (``EagleHead._logits``)."""
    if head._draft_lm is not None:
        return head._draft_lm
    if head._draft_lm_scales is not None:
        raise NotImplementedError("tp_draft='shard' does not split an int8 draft LM head (draft_quantization="
                                  "'int8'); pass draft_quantization='none' or tp_draft='replicate'")
    if _is_quantized(head.lm_head) and head.token_map is None:
        return head.lm_head
    weight = head.lm_head.weight.detach() if head._draft_lm_weight is None else head._draft_lm_weight
    rows = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        rows.weight.copy_(weight)
    return rows.requires_grad_(False)


def shard_draft(draft: nn.Module, group) -> nn.Module:
    """Rewrite a draft in place into rank ``group.tp_rank``'s shard (``tp_draft="shard"``); returns it.

    A draft model (a ``CausalLM``) is sharded as a target. An EAGLE head (``layers[0]``) or EAGLE-3 head
    (``midlayer``): attention by heads and the MLP by rows as in ``shard_target``, the draft-vocabulary LM head
    vocabulary-parallel (the full row gathered: tree drafts rank every token); ``fc`` and the shared embedding
    stay whole."""
    tp_rank, tp_size = group.tp_rank, group.tp_size
    if tp_size == 1 or draft is None:
        return draft
    if getattr(draft, "tp_size", 1) != 1:
        raise ValueError("this draft is already sharded")
    if hasattr(getattr(draft, "model", None), "layers"):
        return shard_target(draft, group)
    layers = list(draft.layers) if hasattr(draft, "layers") else [getattr(draft, "midlayer", None)]
    if layers[0] is None or not hasattr(draft, "make_cache"):
        raise NotImplementedError(f"tp_draft='shard' splits draft models and EAGLE / EAGLE-3 heads; got "
                                  f"{type(draft).__name__}")
    local_kv, whole = _shard_layers(layers, group), draft.make_cache
    if hasattr(draft, "_draft_lm"):  # EAGLE-1: the target's LM head, the draft vocabulary's rows of it
        draft._draft_lm = VocabParallelHead(_draft_lm_rows(draft), tp_rank, tp_size, group)
    else:  # EAGLE-3: its own draft-vocabulary LM head
        draft.lm_head = VocabParallelHead(draft.lm_head, tp_rank, tp_size, group)

    def make_cache(max_batch_size: int, capacity: int, dtype=None, device=None) -> KVCache:
        like = whole(1, 1, dtype, device)  # the dtype and device the head's own rule picks
        return KVCache(len(layers), max_batch_size, local_kv, capacity, like.head_dim, dtype=like.dtype,
                       device=like.device)

    object.__setattr__(draft, "make_cache", make_cache)  # this rank's KV heads
    draft.tp_size, draft.tp_rank, draft.tp_group = tp_size, tp_rank, group
    return draft
