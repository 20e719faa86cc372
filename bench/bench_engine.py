"""Engine throughput side by side: no speculation, static tiers 1/3/7 and adaptive, at several batch sizes.

Workloads: code prompts decoded greedily, runs of repeated lines decoded greedily (the upstream "high"
phase), and prose prompts sampled at temperature 1.0. Every configuration
runs in the same process on the same loaded weights, interleaved over repeats; the report gives tokens/s and
the ratio to no speculation measured in the same run. Optional rows: transformers' plain generate and
assisted generation (assistant = the standalone draft, schedule "heuristic", batch 1), and how often bf16
speculative greedy output agrees with bf16 target-only output.

    PYTHONPATH=python python bench/bench_engine.py --model tiny            # seconds: a smoke test
    PYTHONPATH=python python bench/bench_engine.py --model tiny --hf --bf16-agreement --repeats 3

``--model random`` uses randomly initialised tiny-shaped models (no checkpoint; acceptance is ~0) to check
the script itself. Tiny models are overhead-bound: speculation is not expected to win there.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from specswap.engine import Engine, resolve_checkpoint, resolve_dtype

CODE_PROMPTS = [
    "def fibonacci(n):\n    ",
    "import os\nimport sys\n\n\ndef main():\n    ",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n        ",
    "for i in range(10):\n    ",
    "def read_lines(path):\n    with open(path) as f:\n        ",
    "    if not isinstance(value, int):\n        raise ",
    "def __repr__(self):\n        return ",
    "try:\n    import json\nexcept ImportError:\n    ",
]
# the upstream benchmark's "high" phase: runs of identical lines, where drafts are accepted most
REPEAT_PROMPTS = [
    "x = 1\nx = 1\nx = 1\nx = 1\n",
    "print('hello')\nprint('hello')\nprint('hello')\n",
    "    self.a = a\n    self.a = a\n    self.a = a\n",
    "import os\nimport os\nimport os\nimport os\n",
    "0, 0, 0, 0, 0, 0, 0, 0, 0, 0,",
    "# -----\n# -----\n# -----\n",
    "return None\nreturn None\nreturn None\n",
    "a = []\na = []\na = []\na = []\n",
]
PROSE_PROMPTS = [
    "The purpose of this module is",
    "This function returns",
    "Permission is hereby granted, free of charge, to any person",
    "Return a new list containing",
    "The following example shows how",
    "If the argument is omitted,",
    "This software is provided",
    "Note that the result",
]


class ByteTokenizer:
    """For --model random: bytes folded into the vocabulary."""

    bos_token_id = None
    eos_token_ids: set[int] = set()

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        return [2 + b % (self.vocab_size - 2) for b in text.encode()]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(chr(32 + i % 90) for i in ids)


def load_models(name: str, algorithm: str, dtype: torch.dtype):
    """(target, draft, tokenizer), loaded once and shared by every engine of the run."""
    from specswap.models import (EagleConfig, EagleHead, LlamaConfig, LlamaForCausalLM, load_draft_model,
                                 load_eagle_head, load_model, load_tokenizer)
    if name == "random":
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=2048, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=512)
        target = LlamaForCausalLM(config).to(dtype).eval()
        if algorithm == "NGRAM":
            draft = None
        elif algorithm == "EAGLE":
            draft = EagleHead(EagleConfig.for_target(config), target.embed_tokens, target.lm_head).to(dtype).eval()
        else:
            draft = LlamaForCausalLM(LlamaConfig(**{**config.__dict__, "num_hidden_layers": 1})).to(dtype).eval()
        return target, draft, ByteTokenizer(config.vocab_size)
    target_path = resolve_checkpoint(name)
    target = load_model(target_path, dtype=dtype)
    if algorithm == "NGRAM":
        draft = None
    elif algorithm == "EAGLE":
        draft = load_eagle_head(resolve_checkpoint(f"{name}-eagle"), target)
    else:
        draft = load_draft_model(resolve_checkpoint(f"{name}-draft"), target)
    return target, draft, load_tokenizer(target_path)


def configurations(algorithm: str, adaptive_config):
    """name -> Engine keyword arguments."""
    configs = {"no-spec": dict(speculative_algorithm=None)}
    for steps in (1, 3, 7):
        configs[f"static-{steps}"] = dict(speculative_algorithm=algorithm, speculative_num_steps=steps)
    configs["adaptive"] = dict(speculative_algorithm=algorithm, speculative_num_steps=3, speculative_adaptive=True,
                               speculative_adaptive_config=adaptive_config)
    return configs


CLOCK = time.perf_counter  # set by --clock


def run_once(engine: Engine, prompts, max_new_tokens: int, temperature: float, seed: int):
    start = CLOCK()
    results = engine.generate(prompts, max_new_tokens, temperature=temperature, seed=seed)
    seconds = CLOCK() - start
    tokens = sum(len(r.token_ids) for r in results)
    rounds = sum(r.num_verify_rounds for r in results)
    accepted = sum(sum(r.accept_lengths) for r in results)
    return tokens / seconds, accepted / rounds if rounds else 0.0, results


def bench_engine(target, draft, tokenizer, args) -> list[dict]:
    rows = []
    workloads = [("code", CODE_PROMPTS, 0.0), ("repeat", REPEAT_PROMPTS, 0.0), ("prose", PROSE_PROMPTS, 1.0)]
    configs = configurations(args.algorithm, args.adaptive_config)
    for workload, prompts, temperature in workloads:
        prompts = prompts[:args.num_prompts]
        for batch_size in args.batch_sizes:
            engines = {name: Engine(target, draft if kwargs["speculative_algorithm"] in ("EAGLE", "STANDALONE")
                                    else None, tokenizer=tokenizer,
                                    max_batch_size=batch_size, max_seq_len=args.max_seq_len,
                                    disable_graphs=args.disable_graphs, **kwargs)
                       for name, kwargs in configs.items()}
            for engine in engines.values():  # warm-up
                engine.generate(prompts[:batch_size], 4, temperature=temperature, seed=0)
            speeds = {name: [] for name in engines}
            accepts = {name: [] for name in engines}
            for repeat in range(args.repeats):  # interleaved, so drift hits every configuration alike
                for name, engine in engines.items():
                    speed, accept, _ = run_once(engine, prompts, args.max_new_tokens, temperature, seed=repeat)
                    speeds[name].append(speed)
                    accepts[name].append(accept)
            base = statistics.median(speeds["no-spec"])
            for name, engine in engines.items():
                speed = statistics.median(speeds[name])
                stats = engine.stats()
                rows.append(dict(workload=workload, batch_size=batch_size, config=name,
                                 tokens_per_second=round(speed, 1), ratio=round(speed / base, 3),
                                 accepted_per_verify=round(statistics.mean(accepts[name]), 2),
                                 rounds_per_tier=stats["rounds_per_tier"], final_tier=stats["current_steps"]))
    return rows


def bench_transformers(target_name: str, tokenizer, target, args) -> list[dict]:
    """Plain and assisted generate at batch 1 (greedy, code prompts), as ratios to our no-spec engine."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    dtype = resolve_dtype(args.dtype, "cpu")
    hf_target = AutoModelForCausalLM.from_pretrained(resolve_checkpoint(target_name), dtype=dtype).eval()
    hf_draft = AutoModelForCausalLM.from_pretrained(resolve_checkpoint(f"{target_name}-draft"), dtype=dtype).eval()
    prompts = CODE_PROMPTS[:args.num_prompts]
    engine = Engine(target, None, None, tokenizer=tokenizer, max_batch_size=1, max_seq_len=args.max_seq_len,
                    disable_graphs=args.disable_graphs)
    engine.generate(prompts[:1], 4)

    def hf_speed(**kwargs):
        tokens, seconds = 0, 0.0
        for prompt in prompts:
            ids = torch.tensor([engine.encode(prompt)])
            start = CLOCK()
            with torch.no_grad():
                out = hf_target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens,
                                         min_new_tokens=args.max_new_tokens, do_sample=False, **kwargs)
            seconds += CLOCK() - start
            tokens += out.shape[1] - ids.shape[1]
        return tokens / seconds

    hf_speed()  # warm-up
    speeds = {"ours no-spec": [], "hf generate": [], "hf assisted (heuristic)": []}
    for repeat in range(args.repeats):
        speeds["ours no-spec"].append(run_once(engine, prompts, args.max_new_tokens, 0.0, repeat)[0])
        speeds["hf generate"].append(hf_speed())
        hf_draft.generation_config.num_assistant_tokens_schedule = "heuristic"
        speeds["hf assisted (heuristic)"].append(hf_speed(assistant_model=hf_draft))
    base = statistics.median(speeds["ours no-spec"])
    return [dict(workload="code", batch_size=1, config=name, tokens_per_second=round(statistics.median(v), 1),
                 ratio=round(statistics.median(v) / base, 3)) for name, v in speeds.items()]


def bf16_agreement(args) -> dict:
    """Greedy bf16: speculative vs target-only output on the code prompts (reported, not asserted)."""
    target, draft, tokenizer = load_models(args.model, args.algorithm, torch.bfloat16)
    prompts = CODE_PROMPTS[:args.num_prompts]
    reference = Engine(target, None, None, tokenizer=tokenizer, max_seq_len=args.max_seq_len).generate(
        prompts, args.max_new_tokens)
    report = {}
    for steps in (1, 3, 7):
        engine = Engine(target, draft if args.algorithm != "NGRAM" else None, args.algorithm,
                        speculative_num_steps=steps, tokenizer=tokenizer,
                        max_seq_len=args.max_seq_len)
        results = engine.generate(prompts, args.max_new_tokens)
        identical = sum(r.token_ids == ref.token_ids for r, ref in zip(results, reference))
        prefixes = []
        for r, ref in zip(results, reference):
            same = next((i for i, (a, b) in enumerate(zip(r.token_ids, ref.token_ids)) if a != b),
                        min(len(r.token_ids), len(ref.token_ids)))
            prefixes.append(same)
        report[f"static-{steps}"] = dict(identical=f"{identical}/{len(prompts)}",
                                         mean_common_prefix=round(statistics.mean(prefixes), 1))
    return report


def print_table(rows: list[dict]) -> None:
    columns = [c for c in ("workload", "batch_size", "config", "tokens_per_second", "ratio", "accepted_per_verify",
                           "final_tier", "rounds_per_tier") if any(c in r for r in rows)]
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(str(row.get(c, "")).ljust(widths[c]) for c in columns))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="zoo name or checkpoint directory, or 'random'")
    parser.add_argument("--algorithm", default="EAGLE", choices=["EAGLE", "STANDALONE", "NGRAM"])
    parser.add_argument("--dtype", default="float32", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-seq-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="wall time, or this process's CPU time (steadier on a shared machine with --threads 1)")
    parser.add_argument("--adaptive-config", type=json.loads, default=None,
                        help='JSON object of policy keys, e.g. \'{"warmup_batches": 2}\'')
    parser.add_argument("--disable-graphs", action="store_true", help="run the engines eagerly (default: stage graphs)")
    parser.add_argument("--hf", action="store_true", help="add transformers plain / assisted generate rows")
    parser.add_argument("--bf16-agreement", action="store_true", help="report bf16 greedy agreement")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter

    dtype = resolve_dtype(args.dtype, "cpu")
    target, draft, tokenizer = load_models(args.model, args.algorithm, dtype)
    print(f"model {args.model} ({sum(p.numel() for p in target.parameters()) / 1e6:.1f}M), draft {args.algorithm}, "
          f"{dtype}, {torch.get_num_threads()} threads, {args.max_new_tokens} new tokens, "
          f"{args.num_prompts} prompts, median of {args.repeats}, {args.clock} clock, "
          f"{'eager' if args.disable_graphs else 'stage graphs'}")
    rows = bench_engine(target, draft, tokenizer, args)
    print_table(rows)
    report = {"rows": rows}
    if args.hf and args.model != "random":
        hf_rows = bench_transformers(args.model, tokenizer, target, args)
        print()
        print_table(hf_rows)
        report["transformers"] = hf_rows
    if args.bf16_agreement:
        agreement = bf16_agreement(args)
        print("\nbf16 greedy agreement with bf16 target-only:", agreement)
        report["bf16_agreement"] = agreement
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=2)


if __name__ == "__main__":
    main()
