"""Per-request speculation control through the server: a request with ``disable_speculative_decoding``, batched
with speculating requests, returns exactly the tokens it returns alone with speculation off (greedy, and sampled
at T > 0 with a seed), verifies no drafts, and leaves the others their tier.

The engine and worker side (the request decodes at tier 0 inside the speculating batch, with its own generator,
uncounted by the policy) is implemented in ``specswap.engine`` / ``specswap.worker``; until it is, the
``spec_accept_token_num == 0`` check fails (the request still speculates), and a sampled EAGLE request can draw
other tokens batched than alone.
"""

import httpx
import pytest

from server_helpers import CharTokenizer, random_models, running_server
from specswap import zoo
from specswap.cli_flags import build_engine
from specswap.engine import Engine
from specswap.loading import load_models
from specswap.server.app import create_app

STEPS = 3
MAX_NEW = 32
SAMPLED = {"temperature": 0.8, "sampling_seed": 1234}
GREEDY = {"temperature": 0}
HAS_TINY = all((zoo.path(name) / "model.safetensors").is_file() for name in ("tiny", "tiny-eagle"))


def ngram_case():
    target, _ = random_models()
    speculating = Engine(target, None, "NGRAM", speculative_num_steps=STEPS, max_batch_size=4, max_seq_len=256,
                         tokenizer=CharTokenizer())
    target_only = Engine(target, None, None, max_batch_size=1, max_seq_len=256, tokenizer=CharTokenizer())
    # greedy decoding of "q..." repeats q: prompt lookup drafts are accepted, so a request that still
    # speculated would show accepted drafts
    return speculating, target_only, ["q" * 8, "q" * 6, "qqqq qqqq", "ab ab ab ab"]


def eagle_case():
    models = load_models("tiny", speculative_algorithm="EAGLE", dtype="float32")
    speculating = build_engine(models, "EAGLE", STEPS, max_batch_size=4, max_seq_len=256)
    target_only = build_engine(models, None, max_batch_size=1, max_seq_len=256)
    return speculating, target_only, ["def fibonacci(n):\n    ", "import os\n\n\ndef main():\n    ",
                                      "for i in range(10):\n    print(", "class Stack:\n    def push(self, item):"]


@pytest.fixture(scope="module", params=["NGRAM", "EAGLE"])
def case(request):
    if request.param == "EAGLE" and not HAS_TINY:
        pytest.skip("tiny zoo weights are not built (python -m specswap.zoo train tiny)")
    speculating, target_only, prompts = (ngram_case if request.param == "NGRAM" else eagle_case)()
    return request.param, speculating, target_only, prompts


def rounds_at_tier_zero(http) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith('spec_request_verify_rounds_total{num_steps="0"}'):
            return float(line.split()[-1])
    return 0.0


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_a_request_with_speculation_off_batched_equals_it_alone(case, sampling):
    algorithm, speculating, target_only, prompts = case
    params = {**sampling, "max_new_tokens": MAX_NEW, "ignore_eos": True}
    off = {**params, "disable_speculative_decoding": True}
    keyed = target_only.keyed_sampling and speculating.keyed_sampling
    reference = None
    if sampling is GREEDY or keyed:  # tier 0 draws what target-only decoding draws (keyed: by seed and position)
        reference = target_only.generate([prompts[0]], MAX_NEW, temperature=sampling["temperature"],
                                         seed=sampling.get("sampling_seed"), ignore_eos=True)[0].token_ids
    with running_server(create_app(speculating, "m")) as url, httpx.Client(base_url=url, timeout=120) as http:
        alone = http.post("/generate", json={"text": prompts[0], "sampling_params": off}).json()
        tier_zero_rounds = rounds_at_tier_zero(http)
        batch = http.post("/generate", json={"text": prompts, "sampling_params": [off] + [params] * 3}).json()
        info = http.get("/server_info").json()
        tier_zero_rounds = rounds_at_tier_zero(http) - tier_zero_rounds

    flagged, others = batch[0], batch[1:]
    assert flagged["output_ids"] == alone["output_ids"], algorithm
    if reference is not None:
        assert flagged["output_ids"] == reference, algorithm
    for out in (alone, flagged):
        meta = out["meta_info"]
        assert meta["completion_tokens"] == MAX_NEW
        assert meta["spec_draft_token_num"] == 0 and meta["spec_accept_token_num"] == 0, (algorithm, meta)
    assert tier_zero_rounds > 0  # its rounds counted at tier 0
    # the others kept the tier: every round verified STEPS drafts, and they accepted some
    assert info["speculative_num_steps"] == STEPS
    for out in others:  # NGRAM's plain rounds (nothing to look up) verify no drafts: the engine's own count
        meta = out["meta_info"]
        drafted = meta["spec_draft_token_num"]
        assert 0 < drafted <= STEPS * meta["spec_verify_ct"]
        if algorithm != "NGRAM":
            assert drafted == STEPS * meta["spec_verify_ct"]
    if sampling is GREEDY:
        assert sum(out["meta_info"]["spec_accept_token_num"] for out in others) > 0
    assert info["requests_speculation_disabled"] == 2
