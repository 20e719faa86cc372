"""Weight-only int8 drafts: the quantized linear, the head's int8 mode, the auto rule, and exactness of the output
(a quantized draft may change what is accepted, never what comes out)."""

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "worker"))
from spec_helpers import bigram_pair, random_eagle_head, random_target, run_to_completion  # noqa: E402

from specswap.capability import cpu_capability  # noqa: E402
from specswap.loading import resolve_draft_quantization  # noqa: E402
from specswap.models.draft_quantization import Int8Linear, quantize_linears_int8, quantize_rows_int8  # noqa: E402
from specswap.sampling import argmax  # noqa: E402
from specswap.worker import SpeculativeWorker  # noqa: E402

# the int8 kernel dispatches on the CPU's vector level, and "auto" consults cpu_capability()
pytestmark = pytest.mark.capability


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_linear_is_within_half_a_step_per_weight_of_the_linear(dtype):
    torch.manual_seed(0)
    linear = nn.Linear(96, 40, bias=True).to(dtype)
    weight, scales = quantize_rows_int8(linear.weight, torch.float32)
    assert weight.dtype == torch.int8 and scales.shape == (40,)
    # each weight is rounded to the nearest multiple of its row's scale
    error = (weight.float() * scales[:, None] - linear.weight.float()).abs()
    assert (error <= scales[:, None] / 2 + 1e-6).all()
    quantized = Int8Linear(linear)
    x = torch.randn(2, 3, 96).to(dtype)
    out, reference = quantized(x), linear(x)
    assert out.shape == (2, 3, 40) and out.dtype == dtype
    relative = (out.float() - reference.float()).norm() / reference.float().norm()
    assert relative < (0.02 if dtype == torch.bfloat16 else 0.01), relative


def test_all_zero_rows_quantize_without_nan():
    weight, scales = quantize_rows_int8(torch.zeros(3, 8), torch.float32)
    assert torch.isfinite(scales).all() and (weight == 0).all()


def test_quantize_linears_replaces_every_linear_and_nothing_else():
    module = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 4), nn.LayerNorm(4)))
    assert quantize_linears_int8(module) == 2
    assert isinstance(module[0], Int8Linear) and isinstance(module[2][0], Int8Linear)
    assert isinstance(module[2][1], nn.LayerNorm)


def test_auto_rule_and_bad_values(cpu_override):
    # int8 needs torch's vectorized int8 kernel (bf16 activations, AVX2 or AVX-512)
    expected = "int8" if cpu_capability().avx2 else None
    assert resolve_draft_quantization("auto", "EAGLE", torch.bfloat16, "cpu") == expected
    assert resolve_draft_quantization("auto", "EAGLE", torch.float32, "cpu") is None
    assert resolve_draft_quantization("auto", "EAGLE", torch.bfloat16, "cuda") is None
    assert resolve_draft_quantization("auto", "NGRAM", torch.bfloat16, "cpu") is None
    assert resolve_draft_quantization("auto", None, torch.bfloat16, "cpu") is None
    assert resolve_draft_quantization("none", "EAGLE", torch.bfloat16, "cpu") is None
    assert resolve_draft_quantization("int8", "EAGLE", torch.float32, "cpu") == "int8"
    with pytest.raises(ValueError, match="applies to EAGLE heads"):
        resolve_draft_quantization("int8", "STANDALONE", torch.bfloat16, "cpu")
    with pytest.raises(ValueError, match="valid"):
        resolve_draft_quantization("int4", "EAGLE", torch.bfloat16, "cpu")
    assert not cpu_override("none").avx2
    assert resolve_draft_quantization("auto", "EAGLE", torch.bfloat16, "cpu") is None
    assert resolve_draft_quantization("int8", "EAGLE", torch.bfloat16, "cpu") == "int8"  # by name: the scalar kernel
    assert cpu_override("-avx512").avx2
    assert resolve_draft_quantization("auto", "EAGLE", torch.bfloat16, "cpu") == "int8"


def test_head_int8_mode_keeps_dtype_cache_and_target_untouched():
    target = random_target(seed=0).to(torch.bfloat16)
    head = random_eagle_head(target, seed=1).to(torch.bfloat16)
    target_lm = target.lm_head.weight.clone()
    x, features = torch.tensor([[3, 4, 5]]), torch.randn(1, 3, head.config.hidden_size).bfloat16()
    positions = torch.arange(3).unsqueeze(0)
    before = head(x, features, positions, None, None).logits
    head.quantize_int8()
    head.quantize_int8()  # idempotent
    after = head(x, features, positions, None, None).logits
    assert after.dtype == torch.bfloat16 and after.shape == before.shape
    assert (argmax(after) == argmax(before)).float().mean() >= 2 / 3
    assert head.make_cache(1, 8).keys[0].dtype == torch.bfloat16
    assert torch.equal(target.lm_head.weight, target_lm)
    assert isinstance(head.fc, Int8Linear)


@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("steps", [1, 3])
def test_int8_head_output_equals_target_only_in_fp32(graphs, steps):
    prompts = [[1, 5, 9, 2], [3, 3, 3, 3, 3, 3, 7], [11, 4]]
    target, head = bigram_pair(head_noise=0.1)
    full = SpeculativeWorker(target, head, "EAGLE", steps, max_batch_size=4, max_seq_len=64, graphs=graphs)
    reference, _, _ = run_to_completion(SpeculativeWorker(target, None, None, 0, max_batch_size=4, max_seq_len=64,
                                                    graphs=graphs), prompts, 20)
    tokens_full, accepts_full, _ = run_to_completion(full, prompts, 20)
    _, quantized_head = bigram_pair(head_noise=0.1)
    quantized_head.quantize_int8()
    quantized = SpeculativeWorker(target, quantized_head, "EAGLE", steps, max_batch_size=4, max_seq_len=64, graphs=graphs)
    tokens, accepts, _ = run_to_completion(quantized, prompts, 20)
    assert tokens == reference == tokens_full
    # the int8 head still drafts what the bf16 one does most of the time
    accepted = sum(map(sum, accepts)) / max(1, sum(map(len, accepts)))
    accepted_full = sum(map(sum, accepts_full)) / max(1, sum(map(len, accepts_full)))
    assert accepted >= 0.7 * accepted_full > 0, (accepted, accepted_full)


def test_argmax_is_torch_argmax_on_ties_and_nan():
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randint(0, 3, (32, 257)).to(dtype)  # many ties: the first index wins in both
        assert torch.equal(argmax(x), x.argmax(-1))
        x = torch.randn(4, 3, 300).to(dtype)
        x[0, 1, 7] = float("nan")
        assert torch.equal(argmax(x), x.argmax(-1))
