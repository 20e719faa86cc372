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


def main() -> None:
    name, out = sys.argv[1], Path(sys.argv[2])
    result = SCENARIOS[name](sys.argv[3:])
    (out / f"rank{RANK}.json").write_text(json.dumps(result))
    from specswap.distributed import current_group
    if current_group() is not None:
        current_group().close()


if __name__ == "__main__":
    main()
