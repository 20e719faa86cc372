"""What each rank runs in tests/distributed (started by launch.py as ``scenarios.py NAME OUT_DIR [ARGS]``): the
result goes to OUT_DIR/rank<r>.json; a failure exits non-zero with its traceback on stdout."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)
RANK = int(os.environ["RANK"])
SCENARIOS = {}


def scenario(fn):
    SCENARIOS[fn.__name__] = fn
    return fn


def tiny_target():
    from specswap import zoo
    from specswap.models import load_model
    return load_model(zoo.path("tiny"), dtype=torch.float32, device="cpu")


@scenario
def tp_forward(args):
    """The tiny target's logits at TP=N against the unsharded model's, and the sharded greedy argmax."""
    from specswap.distributed import init_group, shard_target, vocab_parallel_argmax
    group = init_group(tp_size=int(os.environ["WORLD_SIZE"]))
    full, sharded = tiny_target(), shard_target(tiny_target(), group)
    ids = torch.randint(0, full.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(9).expand(2, -1)
    slots = torch.tensor([0, 1])
    with torch.inference_mode():
        want = full(ids, positions, full.make_cache(2, 16), slots)
        got = sharded(ids, positions, sharded.make_cache(2, 16), slots)
        greedy = vocab_parallel_argmax(sharded.lm_head, got.hidden)
    return {"max_error": (want.logits - got.logits).abs().max().item(),
            "scale": want.logits.abs().max().item(),
            "argmax_equal": bool((want.logits.argmax(-1) == got.logits.argmax(-1)).all()),
            "sharded_argmax_equal": bool((greedy == got.logits.argmax(-1)).all()),
            "kv_heads": sharded.make_cache(1, 4).num_kv_heads}


TEXTS = ["def fibonacci(n):\n    ", "import os\n\n\ndef main():\n    ", "The purpose of this module is",
         "for i in range(10):\n    print(", "x"]
# every step a decision, tiers 0..3, no dwell: switches happen within the few rounds of a test
SWITCHY = {"ema_alpha": 1.0, "warmup_batches": 0, "update_interval": 1, "candidate_steps": [0, 1, 3]}


def _engine_kwargs(args):
    """``ALGORITHM STEPS ADAPTIVE [MODEL]``: the engine the scenario builds (ADAPTIVE 0/1: the SWITCHY policy)."""
    algorithm, steps, adaptive = args[0], int(args[1]), args[2] == "1"
    kwargs = dict(speculative_algorithm=None if algorithm == "NONE" else algorithm, speculative_num_steps=steps,
                  max_seq_len=160, max_batch_size=4, disable_graphs=True, dtype="float32")
    if adaptive:
        kwargs.update(speculative_adaptive=True, speculative_adaptive_config=SWITCHY)
    return kwargs, (args[3] if len(args) > 3 else "tiny")


@scenario
def tp_engine(args):
    """The engine at TP=WORLD_SIZE; the leader generates TEXTS greedily, then (alone) target-only decoding in one
    process on a fresh copy: both token lists, and the tiers the TP rounds ran."""
    from specswap.engine import Engine
    kwargs, model = _engine_kwargs(args)
    min_dwell = {"min_dwell_rounds": 0} if kwargs.get("speculative_adaptive") else {}
    engine = Engine(model, tp_size=int(os.environ["WORLD_SIZE"]), **kwargs, **min_dwell)
    if not engine.is_leader:
        engine.follow()
        return {"followed": True, "num_switches": engine.stats()["num_switches"], "current_steps": engine.current_steps}
    tiers = []
    ids = [engine.add_request(text, max_new_tokens=int(os.environ.get("TP_NEW_TOKENS", 40))) for text in TEXTS]
    outputs = {}
    while engine.has_unfinished():
        step = engine.step()
        tiers.append(step.tier)
        outputs.update((o.request_id, o.token_ids) for o in step.finished)
    engine.shutdown()
    stats = engine.stats()
    reference = Engine(model, speculative_algorithm=None, max_seq_len=160, max_batch_size=4, dtype="float32")
    want = [r.token_ids for r in reference.generate(TEXTS, int(os.environ.get("TP_NEW_TOKENS", 40)))]
    return {"tokens": [outputs[i] for i in ids], "reference": want, "tiers": tiers, "current_steps": engine.current_steps,
            "num_switches": stats["num_switches"], "mean_accept_length": stats["mean_accept_length"]}


def main() -> None:
    name, out = sys.argv[1], Path(sys.argv[2])
    result = SCENARIOS[name](sys.argv[3:])
    (out / f"rank{RANK}.json").write_text(json.dumps(result))
    from specswap.distributed import current_group
    if current_group() is not None:
        current_group().close()


if __name__ == "__main__":
    main()
