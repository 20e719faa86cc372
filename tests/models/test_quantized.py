"""The quantized linear over GGUF blocks (torch.ops.specswap.ggml_*, specswap.models.quantized).

- every supported weight type against an independent dequantizer (the gguf package's numpy code) and a float64
  matmul, within a bound derived from how ggml quantizes the activations (``activation_error_bound``);
- dtypes in and out; batch invariance (a row's bits do not depend on the rows beside it, nor on the thread
  count); our multi-row kernels against ggml's own vec_dot, bit for bit; CPU tape replay against eager;
- errors that name the bad value; the embedding's rows and scale;
- the interleaved layouts (Q8_0x8, Q5_0x8, Q4_1x8): the same bytes rearranged, the activation bound and the plain
  kernel's values to fp32 rounding, the VNNI, AVX2 and scalar forms bit for bit, batch and thread invariance.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from components import require_native_kernels
from specswap.models import quantized as q

require_native_kernels()

gguf = pytest.importorskip("gguf", reason="the gguf package is the independent reference dequantizer")
from gguf.quants import dequantize as gguf_dequantize  # noqa: E402

from specswap._core import _C  # noqa: E402
from specswap.capability import cpu_capability  # noqa: E402

q.load_ggml()
ggml_linear = torch.ops.specswap.ggml_linear

# 32-value blocks whose dot products quantize the activations to Q8_0 (d fp16) or Q8_1 (d, s fp16)
Q8_0_ACT = ("Q4_0", "Q5_0", "Q8_0")
Q8_1_ACT = ("Q4_1", "Q5_1")
K_TYPES = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")  # 256-value super-blocks, activations as Q8_K (d fp32)
FLOAT_TYPES = ("F32", "F16", "BF16")                # the activation is rounded to the weight's float type
ALL_TYPES = FLOAT_TYPES + Q8_0_ACT + Q8_1_ACT + K_TYPES
FAST_TYPES = ("Q8_0", "Q5_0", "Q4_0", "Q4_1")       # our multi-row kernels with ggml's own bits
FAST_K_TYPES = ("Q4_K", "Q6_K")                     # our multi-row kernels with their own float order

U32 = 2.0 ** -24   # fp32 unit roundoff
U16 = 2.0 ** -11   # fp16 unit roundoff (10 stored mantissa bits)
UBF16 = 2.0 ** -8  # bf16 unit roundoff (7 stored mantissa bits)


def block_size(kind: str) -> int:
    return 256 if kind in K_TYPES else 32 if kind in Q8_0_ACT + Q8_1_ACT else 1


def shapes_for(kind: str) -> list[tuple[int, tuple[int, ...], int]]:
    """(out_features N, leading dims of x, in_features K): N in {1, 37, 300}, 1 / 3 / 8 rows, up to [B, T, K]."""
    ks = (256, 512) if kind in K_TYPES else (96, 512)
    leads = ((1,), (3, 1), (2, 4))
    return [(n, lead, k) for k in ks for n, lead in zip((1, 37, 300), leads)] + [(300, (1, 3), ks[0])]


def random_weight(n: int, k: int, seed: int) -> torch.Tensor:
    """Rows of different magnitudes and an outlier per row, so block scales differ within and across rows."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * torch.logspace(-1, 0.5, n)[:, None]
    w[torch.arange(n), torch.randint(0, k, (n,), generator=g)] *= 4
    return w


def random_input(lead: tuple[int, ...], k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    m = int(np.prod(lead))
    x = torch.randn(m, k, generator=g) * torch.logspace(-1, 1, m)[:, None]  # each row quantized on its own scale
    return x.reshape(*lead, k)


def reference_dequantize(blocks: torch.Tensor, kind: str) -> torch.Tensor:
    """The gguf package's numpy dequantizer (independent of ggml's C code) as float64 [N, K]."""
    values = gguf_dequantize(blocks.numpy(), gguf.GGMLQuantizationType[kind])
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float64))


def group_max(values: torch.Tensor, size: int) -> torch.Tensor:
    """Each element replaced by the largest |value| of its block of ``size`` along the last dimension."""
    if size == 1:
        return values.abs()
    grouped = values.abs().reshape(*values.shape[:-1], -1, size)
    return grouped.amax(-1, keepdim=True).expand_as(grouped).reshape(values.shape)


def activation_error_bound(kind: str, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A bound on |ggml_linear(x, W) - x @ W^T| in exact arithmetic, per output [M, N] (x [M, K], w [N, K] the
    dequantized weights, both float64).

    ggml first converts each activation row to the weight type's dot-product type (``vec_dot_type``):
    - F32: kept; F16 / BF16: rounded to nearest, |x - x_q| <= u |x| with u = 2^-11 / 2^-8;
    - Q8_0 and Q8_1 (32-value blocks): d = amax / 127 (fp32), q = round(x / d) in [-127, 127], stored d16 =
      fp16(d), so x_q = d16 q and |x - x_q| <= d/2 + |d - d16| |q| <= d (1/2 + 127 u16) (plus fp32 rounding of
      x * (1/d), below 2^-20 d);
    - Q8_K (256-value blocks): d = max / -127 kept in fp32, q = min(127, round(x / d)), so |x - x_q| <= d/2
      (quantize_row_q8_K_ref; |x / d| <= 127, the clamp never bites).
    Q4_1 / Q5_1 also use the block's s = fp16(d * sum q) for the weight-min term m * sum x_q: its two fp16
    roundings add at most |m| 2 u16 d sum|q| <= |m| 2 u16 sum(|x| + d/2), where |m| <= the block's largest
    |weight| (the smallest weight of a block quantizes to exactly m).
    The integer dot products inside a block are exact; the float ones (scales, block sums, the final horizontal
    sum) add at most gamma * sum(|terms|) with gamma = (K/16 + 16) u32, a generous depth for the summation
    tree, and every term bounded by (|w| + 2 max|w| of its block) (|x| + e), covering K-quants' d*sc*q and
    dmin*m parts, which are each up to about twice the block's range.
    """
    k = x.shape[-1]
    if kind == "F32":
        err = torch.zeros_like(x)
    elif kind == "F16":
        err = x.abs() * U16 + 2.0 ** -25  # the absolute term covers fp16's subnormal spacing
    elif kind == "BF16":
        err = x.abs() * UBF16 + 2.0 ** -134
    elif kind in Q8_0_ACT + Q8_1_ACT:
        err = group_max(x, 32) / 127 * (0.5 + 127 * U16 + 2.0 ** -20)
    else:
        err = group_max(x, 256) / 127 * (0.5 + 2.0 ** -20)
    bound = err @ w.abs().T
    if kind in Q8_1_ACT:
        block_w = group_max(w, 32)[..., ::32]                                  # [N, K/32] >= |m| per block
        block_x = (x.abs() + group_max(x, 32) / 254).reshape(*x.shape[:-1], -1, 32).sum(-1)  # [M, K/32]
        bound = bound + 2 * U16 * block_x @ block_w.T
    return bound + fp32_slack(kind, x, err, w)


def fp32_slack(kind: str, x: torch.Tensor, err: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The float rounding of the dot products (activation_error_bound's last paragraph), [M, N]."""
    magnitude = (x.abs() + err) @ (w.abs() + 2 * group_max(w, block_size(kind))).T
    return (x.shape[-1] / 16 + 16) * U32 * magnitude + 1e-30


def emulated_product(kind: str, x: torch.Tensor, w: torch.Tensor, blocks: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_q @ W^T in float64, its tolerance), x_q the activation as ggml quantizes it, emulated here from the
    algorithm (fp32 arithmetic as ggml does it), so what remains is only the fp32 rounding of the dot products.

    ggml's x86 and generic quantizers compute x / d as x * (127 / amax) or x * (1 / d): the two can round
    differently next to a tie, so an element within 1e-4 of one may land one step either way (allowed here).
    """
    m, k = x.shape
    x32 = x.float()
    near_tie = torch.zeros_like(x, dtype=torch.bool)
    step = torch.zeros_like(x)
    extra = torch.zeros(m, w.shape[0], dtype=torch.float64)
    if kind == "F32":
        xq = x32.double()
    elif kind == "F16":
        xq = x32.half().double()
    elif kind == "BF16":
        xq = x32.bfloat16().double()
    elif kind in Q8_0_ACT + Q8_1_ACT:
        xb = x32.reshape(m, -1, 32)
        amax = xb.abs().amax(-1, keepdim=True)
        d = amax / 127
        v = xb * torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))
        qv = torch.round(v)
        d16 = d.half().double()
        xq = (d16 * qv.double()).reshape(m, k)
        near_tie = ((v - v.floor() - 0.5).abs() < 1e-4).reshape(m, k)
        step = d16.expand_as(xb).reshape(m, k)
        if kind in Q8_1_ACT:
            # the weight-min term uses s = fp16(d * sum q) instead of d16 * sum q: m * (s - d16 * sum q) per block
            sum_q = qv.sum(-1, keepdim=True)
            s16 = (d * sum_q).half().double()
            per_block = (s16 - d16 * sum_q.double()).squeeze(-1)                # [M, K/32]
            block_bytes = blocks.shape[1] // (k // 32)
            mins = blocks.reshape(w.shape[0], k // 32, block_bytes)[..., 2:4].contiguous().view(torch.float16)
            extra = per_block @ mins.squeeze(-1).double().T                    # block: d, m, ... (fp16 each)
    else:
        xb = x32.reshape(m, -1, 256)
        signed_max = xb.gather(-1, xb.abs().argmax(-1, keepdim=True))
        iscale = torch.where(signed_max != 0, -127 / signed_max, torch.zeros_like(signed_max))
        v = xb * iscale
        qv = torch.round(v).clamp(max=127)
        d = torch.where(iscale != 0, 1 / iscale, torch.zeros_like(iscale)).double()
        xq = (d * qv.double()).reshape(m, k)
        near_tie = ((v - v.floor() - 0.5).abs() < 1e-4).reshape(m, k)
        step = d.abs().expand_as(xb).reshape(m, k)
    product = xq @ w.T + extra
    tie_err = torch.where(near_tie, step * 1.001, torch.zeros_like(step))
    tolerance = tie_err @ (w.abs() + group_max(w, 32 if kind in Q8_1_ACT else 1)).T  # a flip moves sum q too
    return product, tolerance + fp32_slack(kind, xq, tie_err, w)


# ---------------------------------------------------------------------------------------------------------
# the op against dequantize-then-matmul


@pytest.mark.parametrize("kind", ALL_TYPES)
def test_ggml_dequantize_agrees_with_the_gguf_package(kind):
    k = 512
    w = random_weight(37, k, seed=1)
    blocks = q.quantize(w, kind)
    assert blocks.dtype == torch.uint8 and blocks.shape == (37, q.row_bytes(kind, k))
    ours = q.dequantize(blocks, kind, k)
    reference = reference_dequantize(blocks, kind)
    assert ours.dtype == torch.float32 and ours.shape == (37, k)
    # the same formulas in fp32 on both sides: equal bits, not just close
    assert torch.equal(ours.double(), reference), (ours.double() - reference).abs().max()
    # and the blocks hold w to the type's precision (a shuffled or mis-sized layout would not)
    relative = (ours - w).norm() / w.norm()
    assert relative < {"F32": 1e-7, "F16": 1e-3, "BF16": 4e-3, "Q8_0": 0.01, "Q6_K": 0.02, "Q2_K": 0.4}.get(kind, 0.2)


@pytest.mark.parametrize("kind", ALL_TYPES)
def test_linear_is_within_the_activation_quantization_bound(kind):
    for case, (n, lead, k) in enumerate(shapes_for(kind)):
        w = random_weight(n, k, seed=10 + case)
        blocks = q.quantize(w, kind)
        x = random_input(lead, k, seed=100 + case)
        y = ggml_linear(x, blocks, q.ggml_type(kind))
        assert y.shape == (*lead, n) and y.dtype == torch.float32

        w64 = reference_dequantize(blocks, kind)
        x64 = x.reshape(-1, k).double()
        reference = x64 @ w64.T
        bound = activation_error_bound(kind, x64, w64)
        error = (y.reshape(-1, n).double() - reference).abs()
        assert (error <= bound).all(), (kind, n, lead, k, (error - bound).max().item())
        # the worst case is loose (errors of random signs mostly cancel), so also: against the activation as ggml
        # quantizes it, only the dot products' fp32 rounding remains
        emulated, tolerance = emulated_product(kind, x64, w64, blocks)
        error = (y.reshape(-1, n).double() - emulated).abs()
        assert (error <= tolerance).all(), (kind, n, lead, k, (error - tolerance).max().item())
        # that check has teeth: its tolerance is a tiny fraction of the dot product's scale (near-tie elements,
        # about one in 5000, may widen a few outputs)
        scale = x64.abs() @ w64.abs().T
        assert (tolerance / scale).median() < 5e-5 and (tolerance / scale).max() < 0.02, (kind, n, lead, k)


@pytest.mark.parametrize("kind", ALL_TYPES)
def test_bf16_in_bf16_out_and_fp32_in_fp32_out(kind):
    k = 256
    blocks = q.quantize(random_weight(40, k, seed=5), kind)
    x = random_input((2, 3), k, seed=6)
    y32 = ggml_linear(x, blocks, q.ggml_type(kind))
    assert y32.dtype == torch.float32 and y32.shape == (2, 3, 40)
    xb = x.to(torch.bfloat16)
    yb = ggml_linear(xb, blocks, q.ggml_type(kind))
    assert yb.dtype == torch.bfloat16 and yb.shape == (2, 3, 40)
    # bf16 input is widened exactly, computed as fp32, and the result rounded once to bf16
    assert torch.equal(yb, ggml_linear(xb.float(), blocks, q.ggml_type(kind)).to(torch.bfloat16))


def test_non_contiguous_input_is_read_as_its_values():
    blocks = q.quantize(random_weight(20, 64, seed=7), "Q8_0")
    x = random_input((64,), 8, seed=8).reshape(64, 8).T  # [8, 64], a transposed view
    assert not x.is_contiguous()
    assert torch.equal(ggml_linear(x, blocks, q.ggml_type("Q8_0")),
                       ggml_linear(x.contiguous(), blocks, q.ggml_type("Q8_0")))


# ---------------------------------------------------------------------------------------------------------
# batch invariance and the kernels


@pytest.mark.parametrize("kind", ALL_TYPES)
def test_a_row_has_the_same_bits_whatever_rows_are_beside_it(kind):
    k, n = 256, 300
    blocks = q.quantize(random_weight(n, k, seed=9), kind)
    x = random_input((16,), k, seed=10)
    alone = [ggml_linear(x[r:r + 1], blocks, q.ggml_type(kind))[0] for r in range(16)]
    for m in range(1, 17):
        for start in {0, 16 - m}:  # the first m rows and the last m rows: each row at two places in its group
            out = ggml_linear(x[start:start + m], blocks, q.ggml_type(kind))
            for r in range(m):
                assert torch.equal(out[r], alone[start + r]), (kind, m, start, r)


@pytest.mark.parametrize("kind", ALL_TYPES)
def test_thread_count_does_not_change_the_bits(kind):
    k, n = 256, 1200  # enough output rows that two threads split them
    blocks = q.quantize(random_weight(n, k, seed=11), kind)
    x = random_input((16,), k, seed=12)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = [ggml_linear(x[:m], blocks, q.ggml_type(kind)) for m in (1, 4, 16)]
        torch.set_num_threads(2)
        two = [ggml_linear(x[:m], blocks, q.ggml_type(kind)) for m in (1, 4, 16)]
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(one, two):
        assert torch.equal(a, b), kind


@pytest.fixture
def fast_kernels_restored():
    previous = _C.ggml_set_fast_kernels(True)  # the switches only answer by being set: read, then put back
    _C.ggml_set_fast_kernels(previous)
    previous_vnni = _C.ggml_set_vnni(True)
    _C.ggml_set_vnni(previous_vnni)
    try:
        yield
    finally:
        _C.ggml_set_fast_kernels(previous)
        _C.ggml_set_vnni(previous_vnni)


def _vnni_settings():
    """VNNI off (the AVX2 integer dot), and on where this CPU and its capability have it."""
    return (False, True) if _C.ggml_vnni_available() and cpu_capability().avx512_vnni else (False,)


@pytest.mark.skipif(not _C.ggml_fast_kernels_available(), reason="our multi-row kernels need AVX2, FMA and F16C")
@pytest.mark.parametrize("kind", FAST_TYPES)
def test_fast_kernels_equal_ggml_vec_dot_bit_for_bit(kind, fast_kernels_restored):
    for n, k in ((37, 96), (300, 512)):
        blocks = q.quantize(random_weight(n, k, seed=13), kind)
        x = random_input((17,), k, seed=14)
        for m in range(1, 18):  # every remainder of the eight-row groups, and two groups
            _C.ggml_set_fast_kernels(False)
            plain = ggml_linear(x[:m], blocks, q.ggml_type(kind))
            _C.ggml_set_fast_kernels(True)
            for vnni in _vnni_settings():
                _C.ggml_set_vnni(vnni)
                fast = ggml_linear(x[:m], blocks, q.ggml_type(kind))
                assert torch.equal(fast, plain), (kind, n, k, m, vnni, (fast - plain).abs().max().item())


@pytest.mark.skipif(not _C.ggml_fast_kernels_available(), reason="our multi-row kernels need AVX2, FMA and F16C")
@pytest.mark.parametrize("kind", FAST_K_TYPES)
def test_fast_k_quant_kernels_agree_with_ggml_vec_dot_to_float_rounding(kind, fast_kernels_restored):
    # both compute each sub-block's integer dot exactly and differ only in the order of the float scaling and
    # sums: a few units of fp32 rounding of the sum of |w| |x| (a wrong unpacking is off by whole terms)
    for n, k in ((37, 256), (300, 1024)):
        blocks = q.quantize(random_weight(n, k, seed=13), kind)
        magnitude_w = q.dequantize(blocks, kind, k).abs()
        x = random_input((17,), k, seed=14)
        for m in range(1, 18):
            _C.ggml_set_fast_kernels(False)
            plain = ggml_linear(x[:m], blocks, q.ggml_type(kind))
            _C.ggml_set_fast_kernels(True)
            fast = ggml_linear(x[:m], blocks, q.ggml_type(kind))
            bound = 16 * 2.0 ** -24 * (x[:m].abs() @ magnitude_w.T) + 1e-30
            excess = ((fast - plain).abs() / bound).max().item()
            assert excess <= 1.0, (kind, n, k, m, excess)


def test_vnni_switch_returns_the_previous_setting(fast_kernels_restored):
    _C.ggml_set_vnni(True)
    assert _C.ggml_set_vnni(False) is True
    assert _C.ggml_set_vnni(True) is False


def test_fast_kernel_switch_returns_the_previous_setting(fast_kernels_restored):
    _C.ggml_set_fast_kernels(True)
    assert _C.ggml_set_fast_kernels(False) is True
    assert _C.ggml_set_fast_kernels(True) is False


# ---------------------------------------------------------------------------------------------------------
# CPU operator tape


@pytest.mark.parametrize("kind,dtype", [("Q8_0", torch.float32), ("Q5_0", torch.bfloat16), ("Q4_K", torch.float32),
                                        ("Q6_K", torch.bfloat16), ("F16", torch.float32)])
def test_tape_replay_is_bit_identical_to_eager(kind, dtype):
    torch.manual_seed(15)
    k, n = 256, 48  # K-quants need in_features a multiple of 256 in both layers
    # the bias in the activation dtype, as the models hold it (an fp32 bias would promote a bf16 output)
    up = q.QuantizedLinear.from_linear(nn.Linear(k, k, bias=True).to(dtype), kind)
    down = q.QuantizedLinear(q.quantize(random_weight(n, k, seed=16), kind), kind, k)
    x = torch.randn(2, 3, k).to(dtype)
    out = torch.empty(2, 3, n, dtype=dtype)

    def forward():
        return down(torch.nn.functional.gelu(up(x)))

    runner = _C.GraphRunner("verify", 1, 1, _C.GraphPool(torch.device("cpu")))
    with torch.inference_mode():
        assert forward().dtype == dtype
        runner.capture(lambda: out.copy_(forward()))
        previous = out.clone()
        for step in range(3):
            x.copy_(torch.randn(2, 3, k).to(dtype))  # new values in the captured input buffer
            runner.replay()
            assert not torch.equal(out, previous), step  # replay computed something new
            assert torch.equal(out, forward()), (kind, dtype, step)
            previous = out.clone()


def test_embedding_replays_on_new_ids():
    table = q.QuantizedLinear(q.quantize(random_weight(50, 64, seed=17), "Q8_0"), "Q8_0", 64)
    embed = q.QuantizedEmbedding(table, torch.float32, scale=8.0)
    ids, out = torch.tensor([[1, 2, 3]]), torch.empty(1, 3, 64)
    runner = _C.GraphRunner("verify", 1, 1, _C.GraphPool(torch.device("cpu")))
    with torch.inference_mode():
        runner.capture(lambda: out.copy_(embed(ids)))
        for row in (0, 49, 7):
            ids.copy_(torch.tensor([[row, 3, row]]))
            runner.replay()
            assert torch.equal(out, embed(ids))


# ---------------------------------------------------------------------------------------------------------
# embedding


@pytest.mark.parametrize("kind", ("Q8_0", "Q4_K", "Q6_K", "BF16", "F32"))  # F32: no ggml to_float
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_embedding_rows_are_the_dequantized_table_times_its_scale(kind, dtype):
    vocab, dim = 70, 256
    blocks = q.quantize(random_weight(vocab, dim, seed=18), kind)
    table = q.QuantizedLinear(blocks, kind, dim)
    rows = q.dequantize(blocks, kind, dim)
    ids = torch.tensor([[0, 69, 5], [5, 33, 1]])
    plain = q.QuantizedEmbedding(table, dtype)
    assert plain.weight is table.weight and (plain.num_embeddings, plain.embedding_dim) == (vocab, dim)
    out = plain(ids)
    assert out.dtype == dtype and out.shape == (2, 3, dim)
    assert torch.equal(out, rows[ids].to(dtype))
    assert torch.equal(plain(ids.int()), out)
    # Gemma multiplies by sqrt(hidden) rounded to the activation dtype
    scaled = q.QuantizedEmbedding(table, dtype, scale=dim ** 0.5)(ids)
    assert torch.equal(scaled, rows[ids].to(dtype) * torch.tensor(dim ** 0.5).to(dtype))
    torch.testing.assert_close(scaled.double(), rows[ids].double() * dim ** 0.5,
                               rtol=2 * UBF16 if dtype == torch.bfloat16 else 1e-6, atol=0)


# ---------------------------------------------------------------------------------------------------------
# errors name the value


def test_errors_name_the_bad_value():
    q8 = q.ggml_type("Q8_0")
    blocks = q.quantize(random_weight(4, 64, seed=19), "Q8_0")  # 64 values: 2 blocks of 34 bytes
    x = torch.randn(3, 64)
    with pytest.raises(RuntimeError, match=r"uint8 tensor of blocks \[N, row_bytes\], got Float"):
        ggml_linear(x, blocks.float(), q8)
    with pytest.raises(RuntimeError, match=r"2-D uint8 .* got Byte of shape \[272\]"):
        ggml_linear(x, blocks.reshape(-1), q8)
    with pytest.raises(RuntimeError, match="a q8_0 row of 64 values takes 68 bytes, but weight rows have 70"):
        ggml_linear(x, torch.zeros(4, 70, dtype=torch.uint8), q8)
    with pytest.raises(RuntimeError, match="a q8_0 row of 96 values takes 102 bytes, but weight rows have 68"):
        ggml_linear(torch.randn(3, 96), blocks, q8)
    with pytest.raises(RuntimeError, match="x must be float32 or bfloat16, got Double"):
        ggml_linear(x.double(), blocks, q8)
    with pytest.raises(RuntimeError, match="x must be float32 or bfloat16, got Half"):
        ggml_linear(x.half(), blocks, q8)
    with pytest.raises(RuntimeError, match=r"ggml type 9 \(q8_1\) is not supported .*supported: f32, f16, bf16"):
        ggml_linear(x, blocks, 9)
    with pytest.raises(RuntimeError, match=r"ggml type 99 is not supported .*q6_K"):
        ggml_linear(x, blocks, 99)
    with pytest.raises(RuntimeError, match="ggml type -1 is not supported"):
        ggml_linear(x, blocks, -1)
    with pytest.raises(RuntimeError, match="in_features 40 is not a positive multiple of q8_0's block size 32"):
        ggml_linear(torch.randn(3, 40), blocks, q8)
    with pytest.raises(RuntimeError, match="in_features 320 is not a positive multiple of q4_K's block size 256"):
        ggml_linear(torch.randn(3, 320), torch.zeros(4, 180, dtype=torch.uint8), q.ggml_type("Q4_K"))
    with pytest.raises(RuntimeError, match="K = 40 is not a positive multiple of q5_0's block size 32"):
        torch.ops.specswap.ggml_quantize(torch.randn(4, 40), q.ggml_type("Q5_0"))
    with pytest.raises(RuntimeError, match=r"weight must be 2-D \[N, K\], got shape \[64\]"):
        torch.ops.specswap.ggml_quantize(torch.randn(64), q8)


def test_embedding_errors_name_the_bad_value():
    q8 = q.ggml_type("Q8_0")
    blocks = q.quantize(random_weight(5, 64, seed=20), "Q8_0")
    embedding = torch.ops.specswap.ggml_embedding
    with pytest.raises(RuntimeError, match=r"token id 5 is outside the vocabulary \[0, 5\)"):
        embedding(blocks, q8, 64, torch.tensor([0, 5]), torch.float32)
    with pytest.raises(RuntimeError, match=r"token id -1 is outside the vocabulary \[0, 5\)"):
        embedding(blocks, q8, 64, torch.tensor([-1]), torch.float32)
    with pytest.raises(RuntimeError, match="ids must be int64 or int32, got Float"):
        embedding(blocks, q8, 64, torch.tensor([0.0]), torch.float32)
    with pytest.raises(RuntimeError, match="dtype must be float32 or bfloat16, got Half"):
        embedding(blocks, q8, 64, torch.tensor([0]), torch.float16)
    with pytest.raises(RuntimeError, match="ggml_embedding: a q8_0 row of 96 values takes 102 bytes"):
        embedding(blocks, q8, 96, torch.tensor([0]), torch.float32)
    table = q.QuantizedLinear(blocks, "Q8_0", 64)
    with pytest.raises(RuntimeError, match=r"token id 7 is outside the vocabulary \[0, 5\)"):
        q.QuantizedEmbedding(table, torch.float32)(torch.tensor([[7]]))


def test_python_wrapper_errors_name_the_bad_value():
    with pytest.raises(ValueError, match="ggml type 'Q8_1' is not supported; supported: F32, F16, Q4_0"):
        q.ggml_type("Q8_1")
    with pytest.raises(ValueError, match="ggml type 9 is not supported"):
        q.ggml_type(9)
    blocks = q.quantize(random_weight(4, 64, seed=21), "Q4_0")  # 2 blocks of 18 bytes
    with pytest.raises(ValueError, match=r"Q4_0 weight for in_features=96 must be uint8 \[N, 54\], got torch.uint8 "
                                         r"\(4, 36\)"):
        q.QuantizedLinear(blocks, "Q4_0", 96)
    with pytest.raises(ValueError, match=r"must be uint8 \[N, 36\], got torch.float32"):
        q.QuantizedLinear(blocks.float(), "Q4_0", 64)
    assert q.row_bytes("Q4_K", 512) == 288 and q.row_bytes("Q8_0", 64) == 68


def test_quantized_linear_keeps_the_bias_and_names_its_type():
    torch.manual_seed(22)
    linear = nn.Linear(64, 12, bias=True)
    layer = q.QuantizedLinear.from_linear(linear, "Q8_0")
    assert "type=Q8_0" in repr(layer) and (layer.in_features, layer.out_features) == (64, 12)
    x = torch.randn(5, 64)
    assert torch.equal(layer(x), ggml_linear(x, layer.weight, q.ggml_type("Q8_0")) + linear.bias.detach())


# ---------------------------------------------------------------------------------------------------------
# the interleaved layouts (Q8_0x8, Q5_0x8, Q4_1x8, Q4_Kx8, Q6_Kx8: csrc/quant/x8_kernels.h)

LAYOUT_SOURCES = tuple(q.REPACKED)  # Q8_0, Q5_0, Q4_1, Q4_K, Q6_K


def _width(kind: str, k: int) -> int:
    """k, or for a K-quant (256 values a block) k rounded up to a multiple of 256."""
    return -(-k // 256) * 256 if kind.endswith("_K") else k


def _layout(kind: str) -> int:
    return q.LAYOUT_TYPES[q.REPACKED[kind]]


def _repack(blocks: torch.Tensor, kind: str, k: int) -> torch.Tensor:
    return torch.ops.specswap.ggml_repack(blocks, q.ggml_type(kind), k)


@pytest.mark.parametrize("kind", LAYOUT_SOURCES)
def test_repacked_weights_hold_the_same_bytes_rearranged(kind):
    for n, k in ((8, _width(kind, 32)), (48, 512)):
        blocks = q.quantize(random_weight(n, k, seed=30), kind)
        packed = _repack(blocks, kind, k)
        assert packed.shape == blocks.shape and packed.dtype == torch.uint8
        assert not torch.equal(packed, blocks)
        assert torch.equal(torch.ops.specswap.ggml_unrepack(packed, _layout(kind), k), blocks)
        # its rows read back as the file's rows: dequantizing, and embedding look-ups
        assert torch.equal(torch.ops.specswap.ggml_dequantize(packed, _layout(kind), k), q.dequantize(blocks, kind, k))
        ids = torch.tensor([0, n - 1, 3, 3])
        assert torch.equal(torch.ops.specswap.ggml_embedding(packed, _layout(kind), k, ids, torch.bfloat16),
                           torch.ops.specswap.ggml_embedding(blocks, q.ggml_type(kind), k, ids, torch.bfloat16))


@pytest.mark.parametrize("kind", LAYOUT_SOURCES)
def test_layout_linear_is_within_the_activation_bound_and_agrees_with_the_plain_kernel(kind):
    for case, (n, lead, k) in enumerate([(8, (1,), 32), (40, (3, 1), 96), (296, (2, 4), 512), (64, (17,), 256)]):
        k = _width(kind, k)
        w = random_weight(n, k, seed=40 + case)
        blocks = q.quantize(w, kind)
        x = random_input(lead, k, seed=140 + case)
        y = ggml_linear(x, _repack(blocks, kind, k), _layout(kind))
        assert y.shape == (*lead, n) and y.dtype == torch.float32
        w64, x64 = reference_dequantize(blocks, kind), x.reshape(-1, k).double()
        error = (y.reshape(-1, n).double() - x64 @ w64.T).abs()
        bound = activation_error_bound(kind, x64, w64)
        assert (error <= bound).all(), (kind, n, lead, k, (error - bound).max().item())
        # the same exact integer dots as ggml's vec_dot, summed in another float order: a few units of fp32
        # rounding of sum |w| |x| apart (a wrong chunk, row or correction is off by whole terms)
        plain = ggml_linear(x, blocks, q.ggml_type(kind)).reshape(-1, n).double()
        scale = x.reshape(-1, k).abs() @ q.dequantize(blocks, kind, k).abs().T
        excess = ((y.reshape(-1, n).double() - plain).abs() / (16 * 2.0 ** -24 * scale.double() + 1e-30)).max()
        assert excess <= 1.0, (kind, n, lead, k, excess.item())


@pytest.mark.parametrize("kind", LAYOUT_SOURCES)
def test_layout_paths_give_the_same_bits_and_rows_are_batch_invariant(kind, fast_kernels_restored):
    k, n = 256, 104
    blocks = _repack(q.quantize(random_weight(n, k, seed=50), kind), kind, k)
    x = random_input((17,), k, seed=51)
    _C.ggml_set_fast_kernels(False)  # the scalar form: every CPU computes these bits
    scalar = ggml_linear(x, blocks, _layout(kind))
    alone = torch.stack([ggml_linear(x[r:r + 1], blocks, _layout(kind))[0] for r in range(17)])
    assert torch.equal(scalar, alone)
    if not _C.ggml_fast_kernels_available():
        return
    _C.ggml_set_fast_kernels(True)
    for vnni in _vnni_settings():  # AVX2, and AVX-512 VNNI where present
        _C.ggml_set_vnni(vnni)
        for m in range(1, 18):  # every remainder of the eight-row passes, and two passes
            for start in {0, 17 - m}:
                out = ggml_linear(x[start:start + m], blocks, _layout(kind))
                assert torch.equal(out, scalar[start:start + m]), (kind, vnni, m, start)


@pytest.mark.parametrize("kind", LAYOUT_SOURCES)
def test_layout_thread_count_does_not_change_the_bits(kind):
    k, n = 256, 1200
    blocks = _repack(q.quantize(random_weight(n, k, seed=52), kind), kind, k)
    x = random_input((9,), k, seed=53)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = [ggml_linear(x[:m], blocks, _layout(kind)) for m in (1, 9)]
        torch.set_num_threads(2)
        two = [ggml_linear(x[:m], blocks, _layout(kind)) for m in (1, 9)]
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(one, two)), kind


def test_quantized_linear_repacks_what_it_can_and_gathers_rows_of_a_layout(monkeypatch):
    for kind in LAYOUT_SOURCES:
        k = _width(kind, 64)
        w = random_weight(24, k, seed=54)
        blocks = q.quantize(w, kind)
        layer = q.QuantizedLinear(blocks, kind, k, repack=True)
        assert layer.weight_type == _layout(kind) and layer.block_type == kind and layer.repacked
        assert f"type={kind} as {q.REPACKED[kind]}" in repr(layer)
        assert torch.equal(layer.plain_blocks()[0], blocks) and layer.plain_blocks()[1] == kind
        kept = q.QuantizedLinear(blocks, kind, k, repack=False)
        assert kept.weight_type == q.ggml_type(kind) and torch.equal(kept.weight, blocks) and not kept.repacked
        x = random_input((3,), k, seed=55)
        index = torch.tensor([5, 0, 23, 7, 7, 1, 2, 3, 9, 10, 11, 12, 13, 14, 15, 16])
        rows = layer.rows(index)  # 16 rows: repacked again, so each row's bits are the full layer's
        assert rows.weight_type == _layout(kind)
        assert torch.equal(rows(x), layer(x)[:, index])
        odd = layer.rows(index[:13])  # 13 rows: kept as blocks, the plain kernel's float order
        assert odd.weight_type == q.ggml_type(kind)
        torch.testing.assert_close(odd(x), layer(x)[:, index[:13]], rtol=1e-5, atol=1e-5)
    # not a multiple of 8 rows, or another type: kept as it is
    k = 64
    w = random_weight(24, k, seed=54)
    assert q.QuantizedLinear(q.quantize(w[:12], "Q8_0"), "Q8_0", k, repack=True).weight_type == q.ggml_type("Q8_0")
    assert q.QuantizedLinear(q.quantize(w, "Q4_0"), "Q4_0", k, repack=True).weight_type == q.ggml_type("Q4_0")
    # the default follows the CPU capability (AVX2)
    monkeypatch.setattr(q, "repack_default", lambda: False)
    assert q.QuantizedLinear(q.quantize(w, "Q8_0"), "Q8_0", k).weight_type == q.ggml_type("Q8_0")


def test_layout_errors_name_the_bad_value():
    blocks = q.quantize(random_weight(12, 64, seed=56), "Q8_0")
    with pytest.raises(RuntimeError, match="interleaved weights hold groups of 8 rows, got 12 rows"):
        _repack(blocks, "Q8_0", 64)
    with pytest.raises(RuntimeError, match="Q8_0x8 weights hold groups of 8 rows, got 12 rows"):
        ggml_linear(torch.randn(2, 64), blocks, _layout("Q8_0"))
    with pytest.raises(RuntimeError, match="only Q8_0, Q5_0, Q4_1, Q4_K and Q6_K weights repack .*got q4_0"):
        _repack(q.quantize(random_weight(8, 64, seed=57), "Q4_0"), "Q4_0", 64)
    with pytest.raises(RuntimeError, match="Q5_0x8 is a layout, not a quantizer: quantize to q5_0, then ggml_repack"):
        torch.ops.specswap.ggml_quantize(torch.randn(8, 64), _layout("Q5_0"))
    with pytest.raises(RuntimeError, match="ggml_unrepack: q8_0 is not an interleaved layout"):
        torch.ops.specswap.ggml_unrepack(blocks, q.ggml_type("Q8_0"), 64)
    with pytest.raises(RuntimeError, match=r"ggml type 1007 is not supported .*Q8_0x8 \(1008\), Q5_0x8 \(1006\), "
                                           r"Q4_1x8 \(1003\), Q4_Kx8 \(1012\), Q6_Kx8 \(1014\)"):
        ggml_linear(torch.randn(2, 64), blocks, 1007)
