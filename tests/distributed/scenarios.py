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
    model = args[3] if len(args) > 3 else "tiny"
    if model.startswith("gemma"):
        kwargs["weights"] = args[4] if len(args) > 4 else "fp32"
    if os.environ.get("TP_DRAFT"):  # where the drafts come from (Engine's tp_draft)
        kwargs["tp_draft"] = os.environ["TP_DRAFT"]
    if os.environ.get("TP_GRAPHS") == "1":  # every rank captures its stages (and greedy rounds)
        kwargs["disable_graphs"] = False
    if os.environ.get("TP_TOPK"):  # a static tree tier of depth STEPS
        kwargs["speculative_eagle_topk"] = int(os.environ["TP_TOPK"])
    return kwargs, model


def _forbid_lookups():
    """A follower whose NGRAM drafts must come from its leader's broadcast: any lookup of its own fails."""
    import specswap.worker.ngram as ngram

    def forbidden(*args, **kwargs):
        raise AssertionError(f"rank {RANK} looked up NGRAM drafts itself (tp_draft='leader': the leader's only)")
    ngram.propose_ngram = ngram.propose_ngram_tree = forbidden


@scenario
def tp_engine(args):
    """The engine at TP=WORLD_SIZE; the leader generates TEXTS greedily, then (alone) target-only decoding in one
    process on a fresh copy: both token lists, and the tiers the TP rounds ran."""
    from specswap.engine import Engine
    kwargs, model = _engine_kwargs(args)
    min_dwell = {"min_dwell_rounds": 0} if kwargs.get("speculative_adaptive") else {}
    engine = Engine(model, tp_size=int(os.environ["WORLD_SIZE"]), **kwargs, **min_dwell)
    if not engine.is_leader:
        leader_drafts = kwargs["speculative_algorithm"] == "NGRAM" and kwargs.get("tp_draft", "leader") == "leader"
        if leader_drafts:
            _forbid_lookups()
        engine.follow()
        from specswap._core import _C
        return {"followed": True, "num_switches": engine.stats()["num_switches"], "current_steps": engine.current_tier,
                "leader_drafts": leader_drafts, "draft_tp_size": getattr(engine.draft, "tp_size", 1),
                "graph_captures": _C.graph_capture_count()}
    tiers = []
    ids = [engine.add_request(text, max_new_tokens=int(os.environ.get("TP_NEW_TOKENS", 40))) for text in TEXTS]
    outputs = {}
    while engine.has_unfinished():
        step = engine.step()
        tiers.append(step.tier)
        outputs.update((o.request_id, o.token_ids) for o in step.finished)
    engine.shutdown()
    stats = engine.stats()
    current = engine.current_tier
    from specswap._core import _C
    captures = _C.graph_capture_count()
    del engine  # its target's shard goes before the whole model loads again
    reference = Engine(model, speculative_algorithm=None, max_seq_len=160, max_batch_size=4, dtype="float32",
                       **({"weights": kwargs["weights"]} if "weights" in kwargs else {}))
    want = [r.token_ids for r in reference.generate(TEXTS, int(os.environ.get("TP_NEW_TOKENS", 40)))]
    return {"tokens": [outputs[i] for i in ids], "reference": want, "tiers": tiers, "current_steps": current,
            "num_switches": stats["num_switches"], "mean_accept_length": stats["mean_accept_length"],
            "graph_captures": captures}


@scenario
def tp_sampling(args):
    """TP=2 with sampled requests (one seeded, one not), a greedy one and one aborted after 3 steps: the follower
    runs the same steps (its round hash checked against the leader's every step); the seeded and greedy requests
    against one process with the same seeds."""
    from specswap.engine import Engine
    from specswap.sampling import SamplingParams
    engine = Engine("tiny", speculative_algorithm="EAGLE", speculative_num_steps=3, max_seq_len=160, max_batch_size=4,
                    dtype="float32", disable_graphs=True, tp_size=int(os.environ["WORLD_SIZE"]))
    if not engine.is_leader:
        engine.follow()
        return {"followed": True, "generated": engine.stats()["generated_tokens"]}
    params = [SamplingParams(max_new_tokens=30, temperature=0.8, top_p=0.9, seed=7),
              SamplingParams(max_new_tokens=30, temperature=1.0),
              SamplingParams(max_new_tokens=30),
              SamplingParams(max_new_tokens=30, temperature=0.7, seed=3)]
    ids = [engine.add_request(text, p) for text, p in zip(TEXTS, params)]
    outputs, steps = {}, 0
    while engine.has_unfinished():
        outputs.update((o.request_id, o) for o in engine.step().finished)
        steps += 1
        if steps == 3:
            outputs[ids[3]] = engine.abort(ids[3])
    engine.shutdown()
    generated = engine.stats()["generated_tokens"]
    one = Engine("tiny", speculative_algorithm="EAGLE", speculative_num_steps=3, max_seq_len=160, max_batch_size=4,
                 dtype="float32", disable_graphs=True)
    want = [one.add_request(TEXTS[i], params[i]) for i in (0, 2)]
    done = {}
    while one.has_unfinished():
        done.update((o.request_id, o.token_ids) for o in one.step().finished)
    return {"seeded_and_greedy": [outputs[ids[i]].token_ids for i in (0, 2)], "one_process": [done[w] for w in want],
            "aborted": outputs[ids[3]].finish_reason, "generated": generated}


@scenario
def tp_request_fault(args):
    """TP=2, three greedy requests; the leader's stop check of the second one raises after 4 tokens (a fault of
    that request alone, injected on the leader only): it ends with finish_reason "error", the leader's decision
    reaches the follower (an abort, next step), every step's round hash still matches, and the other two equal one
    process's tokens."""
    from specswap.engine import Engine
    engine = Engine("tiny", speculative_algorithm="EAGLE", speculative_num_steps=3, max_seq_len=160, max_batch_size=4,
                    dtype="float32", disable_graphs=True, tp_size=int(os.environ["WORLD_SIZE"]))
    if not engine.is_leader:
        engine.follow()
        return {"followed": True, "generated": engine.stats()["generated_tokens"],
                "faults": engine.stats()["request_faults"]}
    ids = [engine.add_request(text, max_new_tokens=24) for text in TEXTS[:3]]
    original = engine.batch.append

    def append(request, tokens):
        if request.request_id == ids[1] and len(request.token_ids) >= 4:
            raise RuntimeError("injected fault in one request")
        original(request, tokens)
    engine.batch.append = append
    outputs = {}
    while engine.has_unfinished():
        outputs.update((o.request_id, o) for o in engine.step().finished)
    for _ in range(2):  # the follower applies the abort at the next step's announcement
        engine.step()
    engine.shutdown()
    one = Engine("tiny", speculative_algorithm="EAGLE", speculative_num_steps=3, max_seq_len=160, max_batch_size=4,
                 dtype="float32", disable_graphs=True)
    want = [o.token_ids for o in one.generate([TEXTS[0], TEXTS[2]], 24)]
    return {"others": [outputs[ids[i]].token_ids for i in (0, 2)], "one_process": want,
            "faulted": [outputs[ids[1]].finish_reason, outputs[ids[1]].error], "faults": engine.stats()["request_faults"]}


# rank 0's prompts repeat themselves (prompt lookup accepts long runs), rank 1's do not
DP_TEXTS = {0: ["abc abc abc abc abc abc abc abc ", "x = 1\nx = 1\nx = 1\nx = 1\n", "for for for for for ",
                "aaaa aaaa aaaa aaaa "],
            1: ["The purpose of this module is", "Permission is hereby granted, free of charge,"]}


def _dp_engine(args, max_batch_size=4, **extra):
    from specswap.engine import Engine
    algorithm = args[0] if args else "NGRAM"
    return Engine("tiny", speculative_algorithm=algorithm, speculative_num_steps=3, speculative_adaptive=True,
                  speculative_adaptive_config=SWITCHY, max_seq_len=320, max_batch_size=max_batch_size, dtype="float32",
                  dp_size=int(os.environ["WORLD_SIZE"]), **extra)


@scenario
def dp_agreement(args):
    """Data parallel, different prompts per rank; rank 1 joins with nothing to do and adds its requests at step 40
    (shorter ones: it idles again at the end; rank 0's: ``DP_NEW_TOKENS`` tokens, default 240). Every step's tier,
    and each rank's tokens against target-only decoding of its prompts in one process."""
    from specswap.engine import Engine
    engine = _dp_engine(args, max_batch_size=2)
    texts = DP_TEXTS[RANK % 2] * (2 if RANK == 0 else 1)  # rank 0: 8 requests, two at a time
    new_tokens = int(os.environ.get("DP_NEW_TOKENS", 240)) if RANK == 0 else 60
    ids, outputs, tiers = [], {}, []
    if RANK == 0:
        ids = [engine.add_request(t, max_new_tokens=new_tokens, ignore_eos=True) for t in texts]
    while engine.has_unfinished() or not ids:
        if RANK != 0 and len(tiers) == 40:
            ids = [engine.add_request(t, max_new_tokens=new_tokens, ignore_eos=True) for t in texts]
        step = engine.step()
        tiers.append(step.tier)
        outputs.update((o.request_id, o.token_ids) for o in step.finished)
    stats = engine.stats()
    reference = Engine("tiny", speculative_algorithm=None, max_seq_len=320, max_batch_size=4, dtype="float32")
    want = [r.token_ids for r in reference.generate(texts, new_tokens, ignore_eos=True)]
    return {"tiers": tiers, "identical": [outputs[i] for i in ids] == want, "num_switches": stats["num_switches"],
            "rounds": stats["num_verify_rounds"], "mean_accept_length": stats["mean_accept_length"],
            "agreement_steps": stats["agreement_steps"]}


@scenario
def grid(args):
    """tp_size=2 x dp_size=WORLD/2, adaptive: each group's leader generates its own prompts; every rank's tier per
    step, each leader's tokens against one process's target-only decoding."""
    from specswap.engine import Engine
    world = int(os.environ["WORLD_SIZE"])
    engine = Engine("tiny", speculative_algorithm="NGRAM", speculative_num_steps=3, speculative_adaptive=True,
                    speculative_adaptive_config=SWITCHY, max_seq_len=160, max_batch_size=4, dtype="float32",
                    disable_graphs=True, tp_size=2, dp_size=world // 2, min_dwell_rounds=2)
    if not engine.is_leader:
        engine.follow()
        return {"switches": engine.stats()["num_switches"]}
    texts = DP_TEXTS[(RANK // 2) % 2]
    ids = [engine.add_request(t, max_new_tokens=40, ignore_eos=True) for t in texts]
    outputs, tiers = {}, []
    while engine.has_unfinished():
        step = engine.step()
        tiers.append(step.tier)
        outputs.update((o.request_id, o.token_ids) for o in step.finished)
    engine.shutdown()
    switches = engine.stats()["num_switches"]
    reference = Engine("tiny", speculative_algorithm=None, max_seq_len=160, max_batch_size=4, dtype="float32")
    want = [r.token_ids for r in reference.generate(texts, 40, ignore_eos=True)]
    return {"tiers": tiers, "identical": [outputs[i] for i in ids] == want, "switches": switches}


@scenario
def dp_failure(args):
    """Data parallel; rank ``args[1]`` dies (SIGKILL) or hangs (sleeps) at step 20; the survivors report the
    ``RankFailure`` they got and how long after their last good step."""
    import signal
    import time
    from specswap.distributed import RankFailure
    how, victim = args[0], int(args[1])
    engine = _dp_engine(["NGRAM"])
    for text in DP_TEXTS[RANK % 2]:
        engine.add_request(text, max_new_tokens=200, ignore_eos=True)
    steps, last = 0, time.monotonic()
    try:
        while engine.has_unfinished():
            if steps == 20 and RANK == victim:
                if how == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(3600)
            engine.step()
            steps += 1
            last = time.monotonic()
    except RankFailure as failure:
        return {"error": str(failure), "ranks": failure.ranks, "after_seconds": time.monotonic() - last,
                "steps": steps}
    return {"error": None, "steps": steps}


@scenario
def tp_follower_dies(args):
    """TP=2: the follower is killed (SIGKILL) in its 10th step: before it (``args[0]`` "step", eager), so the
    leader's step broadcast fails, or in its 10th round (``round``, with graphs), so a collective the leader's
    replayed graph runs fails; either must raise RankFailure naming rank 1."""
    import signal
    import time
    from specswap.distributed import RankFailure
    from specswap.engine import Engine
    where = args[0] if args else "step"
    engine = Engine("tiny", speculative_algorithm="EAGLE", speculative_num_steps=3, max_seq_len=160, max_batch_size=4,
                    dtype="float32", disable_graphs=where == "step", tp_size=2)
    if not engine.is_leader:
        owner, name = (engine.batch, "step") if where == "step" else (engine.worker, "decode_round")
        call, count = getattr(owner, name), [0]

        def dying(*call_args):
            count[0] += 1
            if count[0] == 10:
                os.kill(os.getpid(), signal.SIGKILL)
            return call(*call_args)
        setattr(owner, name, dying)
        engine.follow()
        return {"error": None}
    for text in TEXTS:
        engine.add_request(text, max_new_tokens=100, ignore_eos=True)
    steps, last = 0, time.monotonic()
    try:
        while engine.has_unfinished():
            engine.step()
            steps += 1
            last = time.monotonic()
    except RankFailure as failure:
        return {"error": str(failure), "ranks": failure.ranks, "after_seconds": time.monotonic() - last,
                "steps": steps, "collective": failure.collective}
    return {"error": None, "steps": steps}


@scenario
def killed_host(args):
    """``args[0]`` "tp" (TP=2) or "dp" (DP=2, adaptive), NGRAM: the ranks decode until one fails, each leader
    writing OUT/rank<r>.running at its 10th step (a follower runs the same steps); the caller then kills a rank's
    host from outside (every process of its network namespace, tools/netns_hosts.sh kill). The survivor reports
    the RankFailure it got and how long after its last good step."""
    import time
    from specswap.distributed import RankFailure
    from specswap.engine import Engine
    if args[0] == "tp":
        engine = Engine("tiny", speculative_algorithm="NGRAM", speculative_num_steps=3, max_seq_len=160,
                        max_batch_size=2, dtype="float32", disable_graphs=True, tp_size=2)
    else:  # adaptive: the ranks agree every step
        engine = _dp_engine(["NGRAM"], max_batch_size=2, disable_graphs=True)
    steps, last = 0, time.monotonic()
    try:
        if not engine.is_leader:
            engine.follow()
            return {"error": None}
        while True:
            if not engine.has_unfinished():
                engine.add_request(DP_TEXTS[RANK % 2][0], max_new_tokens=100, ignore_eos=True)
            engine.step()
            steps += 1
            last = time.monotonic()
            if steps == 10:
                (Path(sys.argv[2]) / f"rank{RANK}.running").touch()
    except RankFailure as failure:
        return {"error": str(failure), "ranks": failure.ranks, "after_seconds": time.monotonic() - last,
                "steps": steps, "collective": failure.collective}


@scenario
def config_mismatch(args):
    """Rank 1 starts with another candidate list: every rank's Engine must refuse to start."""
    from specswap.distributed import ConfigMismatch
    from specswap.engine import Engine
    candidates = [0, 1, 3] if RANK == 0 else [0, 1, 2]
    try:
        Engine("tiny", speculative_algorithm="NGRAM", speculative_num_steps=3, speculative_adaptive=True,
               speculative_adaptive_config={"candidate_steps": candidates}, max_seq_len=64, dtype="float32",
               dp_size=int(os.environ["WORLD_SIZE"]))
    except ConfigMismatch as mismatch:
        return {"error": str(mismatch), "field": mismatch.field}
    return {"error": None}


@scenario
def close_group(args):
    """Join, meet once, leave: rank 0, which hosts the job's store, reports whether its server still listens."""
    import socket
    from specswap.distributed import init_group
    group = init_group(dp_size=int(os.environ["WORLD_SIZE"]))
    group.barrier()
    group.close()
    if RANK != 0:
        return {}
    with socket.socket() as probe:
        listening = probe.connect_ex((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))) == 0
    return {"store_listening": listening}


@scenario
def slow_start(args):
    """Data parallel, adaptive: rank 1's start-up takes ``args[1]`` seconds longer than the collectives' timeout
    allows (``args[0]`` "slow") or fails (``fail``); then a few steps. Each rank reports what it got."""
    import time
    import specswap.engine_builder as engine_module  # where the engine builds its worker
    from specswap.distributed import RankFailure
    how, delay = args[0], float(args[1]) if len(args) > 1 else 0.0
    build = engine_module.SpeculativeWorker

    def late(*call_args, **kwargs):
        worker = build(*call_args, **kwargs)
        if RANK == 1:
            if how == "fail":
                raise RuntimeError("graph capture failed on purpose")
            time.sleep(delay)
        return worker
    engine_module.SpeculativeWorker = late
    try:
        engine = _dp_engine(["NGRAM"], disable_graphs=True)
        out = engine.generate(DP_TEXTS[RANK % 2][:1], 8)
    except RankFailure as failure:
        return {"error": str(failure), "ranks": failure.ranks}
    except RuntimeError as error:
        return {"error": str(error), "ranks": None}
    engine.shutdown()
    return {"error": None, "tokens": len(out[0].token_ids)}


@scenario
def dp_shutdown(args):
    """Data parallel, adaptive: rank 0 generates one short request and shuts down; rank 1 generates, then (as a
    server would, still up) generates again, then shuts down. Every rank must end without a RankFailure."""
    from specswap.distributed import current_group
    engine = _dp_engine(["NGRAM"], disable_graphs=True)
    first = engine.generate(DP_TEXTS[RANK % 2][:1], 8)
    second = engine.generate(DP_TEXTS[RANK % 2][1:2], 24) if RANK == 1 else []
    engine.shutdown()
    return {"tokens": [len(o.token_ids) for o in first + second], "closed": current_group() is None,
            "agreement_steps": engine.stats()["agreement_steps"]}


@scenario
def grid_hang(args):
    """tp_size=2 x dp_size=2, adaptive, with graphs: group 0 (ranks 0, 1) decodes, group 1 idles; rank 1 hangs in
    its 6th step before its round (host work that never ends). Every other rank reports the RankFailure it got."""
    import time
    from specswap.distributed import RankFailure
    from specswap.engine import Engine
    engine = Engine("tiny", speculative_algorithm="NGRAM", speculative_num_steps=3, speculative_adaptive=True,
                    speculative_adaptive_config=SWITCHY, max_seq_len=96, max_batch_size=2, dtype="float32",
                    tp_size=2, dp_size=2, min_dwell_rounds=2)
    if RANK == 1:
        forward, count = engine.batch.forward, [0]

        def hanging(fn, *call_args):
            if fn == engine.worker.decode_round:
                count[0] += 1
                if count[0] == 6:
                    time.sleep(3600)
            return forward(fn, *call_args)
        engine.batch.forward = hanging
    try:
        if engine.is_leader:
            if RANK == 0:
                engine.add_request(DP_TEXTS[0][0], max_new_tokens=60, ignore_eos=True)
            while True:
                engine.step()
        engine.follow()
    except RankFailure as failure:
        return {"error": str(failure), "ranks": failure.ranks, "collective": failure.collective}
    return {"error": None}


@scenario
def exit_without_close(args):
    """Join, meet once, then rank 0 raises (an error exit, nobody calls close()): at exit, after the group's own
    handler, rank 0 records whether its store still listens."""
    import atexit
    import socket

    def probe():  # registered first: runs after the group's exit handler
        with socket.socket() as sock:
            listening = sock.connect_ex((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))) == 0
        (Path(sys.argv[2]) / "rank0.json").write_text(json.dumps({"store_listening": listening}))
    if RANK == 0:
        atexit.register(probe)
    from specswap.distributed import init_group
    init_group(dp_size=int(os.environ["WORLD_SIZE"])).barrier()
    if RANK == 0:
        raise RuntimeError("an error exit")
    return {}


def main() -> None:
    name, out = sys.argv[1], Path(sys.argv[2])
    result = SCENARIOS[name](sys.argv[3:])
    (out / f"rank{RANK}.json").write_text(json.dumps(result))
    from specswap.distributed import current_group
    if current_group() is not None:
        current_group().close()


if __name__ == "__main__":
    main()
