"""Engine throughput side by side: no speculation, static tiers and adaptive for one or more drafters, plus
transformers' plain and prompt-lookup generate, on four workloads.

Workloads: code prompts decoded greedily, runs of repeated lines decoded greedily (the upstream "high" phase),
list continuations decoded greedily, and prose prompts sampled at temperature 1.0 (the default four); and, where
other requests' outputs matter (SUFFIX's global tree), ``specswap bench``'s resample (each prompt 3 times at
T = 0.7, other seeds), template (one instruction, JSON out) and multiturn (a second turn over the first's answer,
its time included) prompts. Every engine's drafter state across requests (SUFFIX's global tree) is emptied before
each timed run and after the warm-up (``Engine.flush_cache``). Each comes in two prompt sets
(``--prompt-set``): ``tune``, the prompts NGRAM's lookup and the adaptive policy were tuned on, and ``report``
(the default), prompts of the same kinds written apart from that tuning, for published figures. Every
configuration runs in the same process on the same loaded weights, interleaved over repeats, the collector run
between groups of engines, outside the clocks (``timing.collect_outside_clocks``); the report gives
tokens/s and the ratio to no speculation measured in the same run, and, for greedy sets, how many outputs equal
target-only output of the same run (identical by construction in fp32; in bf16 near-tie logits may flip, see
docs/engine.md). ``--json`` writes the rows with the command, the CPU and the commit (specswap.bench.provenance).

    PYTHONPATH=python python bench/bench_engine.py --model tiny            # seconds: a smoke test
    PYTHONPATH=python python bench/bench_engine.py --model tiny --hf --repeats 3
    PYTHONPATH=python python bench/bench_engine.py --model gemma-3-270m --dtype bfloat16 --algorithm EAGLE NGRAM \
        --batch-sizes 1 --max-new-tokens 96 --num-prompts 4 --repeats 1 --threads 1 --hf --json gemma.json
    PYTHONPATH=python python bench/bench_engine.py --model gemma-3-270m --weights native --algorithm EAGLE EAGLE3 \
        --draft EAGLE3=python/specswap/zoo/weights/gemma-3-270m-eagle3 --static-steps 1 3 --batch-sizes 1 --threads 1

``--hf`` adds transformers rows at batch 1: plain ``generate``, prompt-lookup decoding
(``prompt_lookup_num_tokens=10``) and, where the zoo has a standalone draft ("<model>-draft"), assisted
generation. ``--model random`` uses randomly initialised tiny-shaped models (no checkpoint; acceptance is ~0) to
check the script itself. Tiny models are overhead-bound: speculation is not expected to win there.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from tqdm import tqdm

from specswap import algorithms as algorithms_registry
from specswap.bench import provenance
from specswap.bench.timing import collect_outside_clocks
from specswap.bench import workloads as phased
from specswap.capability import cpu_capability
from specswap.engine import Engine, encode_text, resolve_checkpoint, resolve_dtype
from specswap.loading import resolve_weights

TUNE_CODE_PROMPTS = [
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
TUNE_REPEAT_PROMPTS = [
    "x = 1\nx = 1\nx = 1\nx = 1\n",
    "print('hello')\nprint('hello')\nprint('hello')\n",
    "    self.a = a\n    self.a = a\n    self.a = a\n",
    "import os\nimport os\nimport os\nimport os\n",
    "0, 0, 0, 0, 0, 0, 0, 0, 0, 0,",
    "# -----\n# -----\n# -----\n",
    "return None\nreturn None\nreturn None\n",
    "a = []\na = []\na = []\na = []\n",
]
# list continuations: each item repeats the previous one's template with a new counter, as in SQL, HTML,
# JSON and config code (prompt lookup's home ground: it copies the template and misses only the counter).
# NGRAM's skip-one lookup and its counter extrapolation were tuned on Gemma's outputs of these.
TUNE_LIST_PROMPTS = [
    "SELECT name FROM users WHERE id = 1;\nSELECT name FROM users WHERE id = 2;\nSELECT name FROM users WHERE id = 3;\n",
    '<li><a href="/page/1">Page 1</a></li>\n<li><a href="/page/2">Page 2</a></li>\n<li><a href="/page/3">Page 3</a></li>\n',
    "self.layer1 = nn.Linear(64, 64)\nself.layer2 = nn.Linear(64, 64)\n",
    '{"id": 1, "name": "item 1", "price": 10},\n{"id": 2, "name": "item 2", "price": 20},\n',
    "INSERT INTO logs (level, message) VALUES ('info', 'step 1 done');\n"
    "INSERT INTO logs (level, message) VALUES ('info', 'step 2 done');\n",
    "    parser.add_argument('--alpha', type=int, default=1, help='the alpha value')\n"
    "    parser.add_argument('--beta', type=int, default=2, help='the beta value')\n",
    "case 1: return 'one';\ncase 2: return 'two';\ncase 3: return 'three';\n",
    "- item 1\n- item 2\n- item 3\n",
]
TUNE_PROSE_PROMPTS = [
    "The purpose of this module is",
    "This function returns",
    "Permission is hereby granted, free of charge, to any person",
    "Return a new list containing",
    "The following example shows how",
    "If the argument is omitted,",
    "This software is provided",
    "Note that the result",
]


# The report set: the same four kinds, other content, written apart from any tuning; no line of it occurs in
# the tune set (tests/bench/test_prompt_sets.py checks it). Published figures use this set.
REPORT_CODE_PROMPTS = [
    "def binary_search(items, target):\n    ",
    "from dataclasses import dataclass\n\n\n@dataclass\nclass Point:\n    ",
    "class Queue:\n    def __init__(self, maxsize=0):\n        self._data = collections.deque()\n\n"
    "    def put(self, value):\n        ",
    "while queue:\n    node = queue.pop()\n    ",
    "def write_json(path, data):\n    with open(path, 'w') as handle:\n        ",
    "    if key not in self._cache:\n        raise KeyError(",
    "def __eq__(self, other):\n        if not isinstance(other, type(self)):\n"
    "            return NotImplemented\n        return self.",
    "import argparse\n\n\ndef parse_args():\n    parser = ",
]
REPORT_REPEAT_PROMPTS = [
    "y = 0\ny = 0\ny = 0\ny = 0\n",
    "print('done')\nprint('done')\nprint('done')\n",
    "    self.b = b\n    self.b = b\n    self.b = b\n",
    "import re\nimport re\nimport re\nimport re\n",
    "1, 1, 1, 1, 1, 1, 1, 1, 1, 1,",
    "# =====\n# =====\n# =====\n",
    "pass\npass\npass\npass\n",
    "b = {}\nb = {}\nb = {}\nb = {}\n",
]
REPORT_LIST_PROMPTS = [
    "UPDATE orders SET status = 'sent' WHERE order_id = 101;\n"
    "UPDATE orders SET status = 'sent' WHERE order_id = 102;\n"
    "UPDATE orders SET status = 'sent' WHERE order_id = 103;\n",
    '<tr><td>Row 1</td><td class="cell">1</td></tr>\n<tr><td>Row 2</td><td class="cell">2</td></tr>\n',
    "self.conv1 = nn.Conv2d(32, 32, 3)\nself.conv2 = nn.Conv2d(32, 32, 3)\n",
    '{"user": 1, "email": "user1@example.com", "score": 5},\n'
    '{"user": 2, "email": "user2@example.com", "score": 10},\n',
    "logger.info('epoch 1 finished')\nlogger.info('epoch 2 finished')\nlogger.info('epoch 3 finished')\n",
    "    assert results[0] == expected[0]\n    assert results[1] == expected[1]\n",
    "## Step 1\n\nRun test 1.\n\n## Step 2\n\nRun test 2.\n\n",
    "    config.add_option('--level-1', default=1)\n    config.add_option('--level-2', default=2)\n",
]
REPORT_PROSE_PROMPTS = [
    "The main advantage of this approach is",
    "This class represents",
    "Redistribution and use in source and binary forms, with or without",
    "Raise an exception if",
    "In the example below, we",
    "When the timeout expires,",
    "The copyright holders",
    "Keep in mind that the value",
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


# prompt set -> workload -> (prompts, temperature); the cross-request kinds are specswap bench's
PROMPT_SETS = {
    "tune": {"code": (TUNE_CODE_PROMPTS, 0.0), "repeat": (TUNE_REPEAT_PROMPTS, 0.0), "list": (TUNE_LIST_PROMPTS, 0.0),
             "prose": (TUNE_PROSE_PROMPTS, 1.0)},
    "report": {"code": (REPORT_CODE_PROMPTS, 0.0), "repeat": (REPORT_REPEAT_PROMPTS, 0.0),
               "list": (REPORT_LIST_PROMPTS, 0.0), "prose": (REPORT_PROSE_PROMPTS, 1.0)},
}
for _set in PROMPT_SETS:
    PROMPT_SETS[_set].update({kind: phased.PROMPT_SETS[_set][kind] for kind in phased.CROSS_REQUEST_KINDS})
DEFAULT_PROMPT_SET = "report"
WORKLOADS = list(PROMPT_SETS[DEFAULT_PROMPT_SET])
DEFAULT_WORKLOADS = ["code", "repeat", "list", "prose"]


def workload_prompts(prompt_set: str, workload: str, num_prompts: int) -> tuple[list[str], list[str]]:
    """A workload's first ``num_prompts`` prompts (resample: each ``RESAMPLES`` times in a row) and, for
    multiturn, each one's second-turn text (else [])."""
    prompts = PROMPT_SETS[prompt_set][workload][0][:num_prompts]
    if workload == "resample":
        prompts = [prompt for prompt in prompts for _ in range(phased.RESAMPLES)]
    followups = phased.MULTITURN_FOLLOWUPS[prompt_set] if workload == "multiturn" else []
    return prompts, [followups[i % len(followups)] for i in range(len(prompts))] if followups else []


def load_models(name: str, algorithms: list[str], dtype: torch.dtype, draft_quantization: str = "auto",
                weights: str | None = None, draft_paths: dict[str, str] | None = None):
    """(target, {algorithm: draft or None}, tokenizer), loaded once and shared by every engine of the run.
    ``draft_paths``: algorithm -> draft checkpoint (EAGLE3 has no zoo default); else the zoo's."""
    draft_paths = draft_paths or {}
    from specswap.models import EagleConfig, EagleHead, LlamaConfig, LlamaForCausalLM
    from specswap.loading import resolve_draft_quantization
    # "auto" as the Engine resolves it: beside a native target, the head's linears as ggml blocks (q8_0)
    quantization = resolve_draft_quantization(draft_quantization, "EAGLE", dtype, "cpu",
                                              native_target=weights == "native")
    if name == "random":
        if draft_paths:
            raise ValueError("--model random builds its drafts; --draft needs a real model")
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=2048, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=512)
        target = LlamaForCausalLM(config).to(dtype).eval()
        drafts = {"NGRAM": None, "SUFFIX": None,
                  "EAGLE": EagleHead(EagleConfig.for_target(config), target.embed_tokens, target.lm_head),
                  "STANDALONE": LlamaForCausalLM(LlamaConfig(**{**config.__dict__, "num_hidden_layers": 1}))}
        missing = sorted(set(algorithms) - set(drafts))
        if missing:
            raise ValueError(f"--model random builds no draft for {missing}; use a real model")
        drafts = {a: drafts[a] and drafts[a].to(dtype).eval() for a in algorithms}
        for name, draft in drafts.items():
            if quantization == "int8" and algorithms_registry.algorithm(name).quantizable_draft:
                draft.quantize_int8()
        return target, drafts, ByteTokenizer(config.vocab_size)
    from specswap.loading import load_draft, load_models
    if weights is None:  # the dtype's dense weights
        weights = "bf16" if dtype == torch.bfloat16 else "fp32"
    loaded = load_models(name, speculative_algorithm="NONE", dtype=dtype, weights=weights)
    drafts = {a: load_draft(name, draft_paths.get(a), a, loaded.target,
                            quantization if algorithms_registry.algorithm(a).quantizable_draft else None)
              for a in algorithms}
    return loaded.target, drafts, loaded.tokenizer


def configurations(algorithms: list[str], static_steps: list[int], adaptive_config,
                   ngram_copy: bool = False) -> dict[str, dict]:
    """name -> Engine keyword arguments. ``ngram_copy``: NGRAM's static tiers again with counters copied, not
    extrapolated (``Engine(ngram_numbers=False)``), as "<prefix>copy-<k>"."""
    configs = {"no-spec": dict(speculative_algorithm=None)}
    for algorithm in algorithms:
        prefix = f"{algorithm.lower()} " if len(algorithms) > 1 else ""
        for steps in static_steps:
            configs[f"{prefix}static-{steps}"] = dict(speculative_algorithm=algorithm, speculative_num_steps=steps)
        if ngram_copy and algorithms_registry.algorithm(algorithm).number_tokens:
            for steps in static_steps:
                configs[f"{prefix}copy-{steps}"] = dict(speculative_algorithm=algorithm, speculative_num_steps=steps,
                                                        ngram_numbers=False)
        configs[f"{prefix}adaptive"] = dict(speculative_algorithm=algorithm, speculative_num_steps=3,
                                            speculative_adaptive=True, speculative_adaptive_config=adaptive_config)
    return configs


CLOCK = time.perf_counter  # set by --clock


class EngineRunner:
    """One configuration: generate the prompts, return (tokens, seconds, accepted, rounds, token lists)."""

    def __init__(self, engine: Engine, ignore_eos: bool = False):
        self.engine = engine
        self.ignore_eos = ignore_eos

    def __call__(self, prompts, max_new_tokens: int, temperature: float, seed: int, flush: bool = True):
        if flush:  # SUFFIX: a run starts with an empty global tree
            self.engine.flush_cache()
        start = CLOCK()
        results = self.engine.generate(prompts, max_new_tokens, temperature=temperature, seed=seed,
                                       ignore_eos=self.ignore_eos)
        seconds = CLOCK() - start
        return (sum(len(r.token_ids) for r in results), seconds, sum(sum(r.accept_lengths) for r in results),
                sum(r.num_verify_rounds for r in results), [r.token_ids for r in results])


class TransformersRunner:
    """transformers' generate on the same weights and prompts, batch 1, one prompt at a time."""

    def __init__(self, model, encode, **generate_kwargs):
        self.model, self.encode, self.kwargs = model, encode, generate_kwargs

    def __call__(self, prompts, max_new_tokens: int, temperature: float, seed: int, flush: bool = True):
        tokens, seconds, outputs = 0, 0.0, []
        for index, prompt in enumerate(prompts):
            ids = torch.tensor([self.encode(prompt)])
            sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else \
                dict(do_sample=False)
            torch.manual_seed(seed + index)
            start = CLOCK()
            with torch.no_grad():
                out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                          **sampling, **self.kwargs)
            seconds += CLOCK() - start
            tokens += out.shape[1] - ids.shape[1]
            outputs.append(out[0, ids.shape[1]:].tolist())
        return tokens, seconds, 0, 0, outputs


def transformers_runners(name: str, dtype: torch.dtype, encode) -> dict[str, TransformersRunner]:
    """Plain generate, prompt lookup (10 tokens) and, where the zoo has a standalone draft, assisted generate."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(resolve_checkpoint(name, dtype), dtype=dtype).eval()
    runners = {"hf generate": TransformersRunner(model, encode),
               "hf prompt-lookup": TransformersRunner(model, encode, prompt_lookup_num_tokens=10)}
    try:
        draft_path = resolve_checkpoint(f"{name}-draft")
    except ValueError:
        return runners
    draft = AutoModelForCausalLM.from_pretrained(draft_path, dtype=dtype).eval()
    draft.generation_config.num_assistant_tokens_schedule = "heuristic"
    runners["hf assisted (heuristic)"] = TransformersRunner(model, encode, assistant_model=draft)
    return runners


def two_turns(runner, decode, prompts, followups, max_new_tokens: int, temperature: float, seed: int):
    """A multiturn run: the first turns, then each second turn (prompt + answer + follow-up) in one more run of
    the same runner; tokens, time, acceptance and outputs summed over both."""
    first = runner(prompts, max_new_tokens, temperature, seed)
    second_prompts = [p + decode(tokens) + f for p, tokens, f in zip(prompts, first[4], followups)]
    # the second turns may draft from the first turns' outputs: the global tree is kept
    second = runner(second_prompts, max_new_tokens, temperature, seed + len(prompts), flush=False)
    return (*(a + b for a, b in zip(first[:4], second[:4])), first[4] + second[4])


def agreement(outputs: list[list[int]], reference: list[list[int]]) -> str:
    """'identical/total, mean common prefix' of outputs against target-only ones."""
    identical = sum(a == b for a, b in zip(outputs, reference))
    prefixes = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                for a, b in zip(outputs, reference)]
    return f"{identical}/{len(reference)} (prefix {statistics.mean(prefixes):.0f})"


def bench(target, drafts, tokenizer, args) -> list[dict]:
    rows = []
    configs = configurations(args.algorithm, args.static_steps, args.adaptive_config, args.ngram_copy)
    hf = transformers_runners(args.model, target.dtype, lambda text: encode_text(tokenizer, text)) \
        if args.hf and args.model != "random" else {}
    temperatures = len(args.temperatures) if args.temperatures else 1
    runs_total = len(args.workloads) * temperatures * args.repeats * sum(len(configs) + (len(hf) if b == 1 else 0)
                                                                         for b in args.batch_sizes)
    bar = tqdm(total=runs_total, desc="bench", unit="run", dynamic_ncols=True)
    for workload, temperature in ((w, t) for w in args.workloads
                                  for t in (args.temperatures or [PROMPT_SETS[args.prompt_set][w][1]])):
        prompts, followups = workload_prompts(args.prompt_set, workload, args.num_prompts)
        for batch_size in args.batch_sizes:
            runners = {name: EngineRunner(Engine(target, drafts.get(kwargs["speculative_algorithm"]),
                                                 tokenizer=tokenizer, max_batch_size=batch_size,
                                                 max_seq_len=args.max_seq_len, disable_graphs=args.disable_graphs,
                                                 **kwargs), ignore_eos=args.ignore_eos)
                       for name, kwargs in configs.items()}
            if batch_size == 1:
                runners.update(hf)
            for runner in runners.values():  # warm-up
                runner(prompts[:batch_size], 4, temperature, 0)
            collect_outside_clocks()  # the last group's engines, this one's start-up
            runs = {name: [] for name in runners}
            for repeat in range(args.repeats):  # interleaved, so drift hits every configuration alike
                for name, runner in runners.items():
                    bar.set_postfix_str(f"{workload} b={batch_size} {name}")
                    runs[name].append(two_turns(runner, tokenizer.decode, prompts, followups, args.max_new_tokens,
                                                temperature, repeat) if followups else
                                      runner(prompts, args.max_new_tokens, temperature, repeat))
                    bar.update(1)
            speeds = {name: [tokens / seconds for tokens, seconds, *_ in r] for name, r in runs.items()}
            base = statistics.median(speeds["no-spec"])
            for name, runner in runners.items():
                speed = statistics.median(speeds[name])
                accepted, rounds = sum(r[2] for r in runs[name]), sum(r[3] for r in runs[name])
                row = dict(workload=workload, temperature=temperature, batch_size=batch_size, config=name,
                           tokens_per_second=round(speed, 1), ratio=round(speed / base, 3))
                if rounds:
                    row["accepted_per_verify"] = round(accepted / rounds, 2)
                if isinstance(runner, EngineRunner) and runner.engine.speculative_algorithm is not None:
                    stats = runner.engine.stats()
                    row.update(final_tier=stats["current_steps"], rounds_per_tier=stats["rounds_per_tier"])
                keyed = isinstance(runner, EngineRunner) and runner.engine.keyed_sampling
                if name != "no-spec" and (temperature == 0.0 or keyed):  # keyed sampling: the same seeded draws
                    row["agreement"] = agreement(runs[name][0][4], runs["no-spec"][0][4])
                rows.append(row)
    bar.close()
    return rows


def best_versus_transformers(rows: list[dict]) -> list[dict]:
    """Per prompt set at batch 1: the best specswap configuration against the best transformers one."""
    summary = []
    for workload in dict.fromkeys(r["workload"] for r in rows):
        ours = [r for r in rows if r["workload"] == workload and r["batch_size"] == 1 and not r["config"].startswith("hf")]
        theirs = [r for r in rows if r["workload"] == workload and r["config"].startswith("hf")]
        if not ours or not theirs:
            continue
        best, rival = max(ours, key=lambda r: r["tokens_per_second"]), max(theirs, key=lambda r: r["tokens_per_second"])
        summary.append(dict(workload=workload, best_specswap=best["config"], ratio=best["ratio"],
                            best_transformers=rival["config"], transformers_ratio=rival["ratio"],
                            specswap_over_transformers=round(best["tokens_per_second"] / rival["tokens_per_second"], 3)))
    return summary


def print_table(rows: list[dict]) -> None:
    columns = list(dict.fromkeys(c for r in rows for c in r))
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(str(row.get(c, "")).ljust(widths[c]) for c in columns))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="zoo name, gemma-3-270m or checkpoint directory, or 'random'")
    parser.add_argument("--draft", action="append", default=[], metavar="ALGORITHM=DIR",
                        help="a draft checkpoint for one algorithm, e.g. EAGLE3=DIR (an EAGLE-3 head, which has no "
                             "zoo default); others default to the zoo's <model>-eagle / <model>-draft")
    parser.add_argument("--algorithm", nargs="+", default=["EAGLE"],
                        choices=[name for name in algorithms_registry.NAMES
                                 if algorithms_registry.algorithm(name).name is not None],  # the drafters
                        help="one or more drafters, each with its static tiers and adaptive")
    parser.add_argument("--static-steps", type=int, nargs="+", default=[1, 3, 7])
    parser.add_argument("--workloads", nargs="+", default=DEFAULT_WORKLOADS, choices=WORKLOADS,
                        help=f"default: {' '.join(DEFAULT_WORKLOADS)}; resample, template and multiturn are where "
                             f"SUFFIX's global tree matters")
    parser.add_argument("--temperatures", type=float, nargs="+", default=None,
                        help="run every workload at each of these temperatures (default: the workload's own: "
                             "0 for code, repeat and list, 1 for prose)")
    parser.add_argument("--prompt-set", default=DEFAULT_PROMPT_SET, choices=list(PROMPT_SETS),
                        help="report: prompts kept apart from tuning (for published figures); tune: the prompts "
                             "NGRAM's lookup and the policy were tuned on (docs/bench.md)")
    parser.add_argument("--dtype", default="float32", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--weights", choices=["native", "bf16", "fp32"], default=None,
                        help="native: a GGUF model's own blocks (ggml kernels, activations in --dtype); default: "
                             "the dense weights of --dtype")
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
    parser.add_argument("--ignore-eos", action="store_true",
                        help="engines run every prompt to --max-new-tokens (equal work per configuration: an output "
                             "that leaves greedy at a bf16 near-tie and hits EOS early cannot shrink the batch); "
                             "transformers rows still stop at EOS")
    parser.add_argument("--draft-quantization", default="auto", choices=["auto", "none", "int8", "q8_0"],
                        help="EAGLE head weights: int8 weight-only, q8_0 blocks (native targets) or as stored (auto: "
                             "as the Engine, q8_0 beside a native target, int8 in bf16 on CPU)")
    parser.add_argument("--ngram-copy", action="store_true",
                        help="also run NGRAM's static tiers with numbers copied instead of extrapolated (copy-K)")
    parser.add_argument("--disable-graphs", action="store_true", help="run the engines eagerly (default: stage graphs)")
    parser.add_argument("--hf", action="store_true",
                        help="add transformers rows at batch 1: plain, prompt lookup, assisted (where a draft exists)")
    parser.add_argument("--json", help="also write the rows, the command, the CPU and the commit to this file")
    return parser


def main() -> None:
    args = build_parser().parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter

    print(cpu_capability().describe(), flush=True)
    # native weights: activations as the Engine runs them ("auto": fp32), not --dtype's dense default
    dtype = resolve_weights("native", args.model, args.dtype, "cpu")[1] if args.weights == "native" else \
        resolve_dtype(args.dtype, "cpu")
    draft_paths = dict(item.split("=", 1) for item in args.draft)
    unknown = sorted(set(draft_paths) - set(args.algorithm))
    if unknown or not all("=" in item for item in args.draft):
        raise SystemExit(f"--draft takes ALGORITHM=DIR for an algorithm in --algorithm; got {args.draft}")
    target, drafts, tokenizer = load_models(args.model, args.algorithm, dtype, args.draft_quantization, args.weights,
                                            draft_paths)
    print(f"model {args.model} ({sum(p.numel() for p in target.parameters()) / 1e6:.1f}M), "
          f"drafts {'/'.join(args.algorithm)}, {dtype}, {torch.get_num_threads()} threads, "
          f"{args.max_new_tokens} new tokens, {args.num_prompts} {args.prompt_set} prompts, median of {args.repeats}, "
          f"{args.clock} clock, {'eager' if args.disable_graphs else 'stage graphs'}"
          f"{', int8 EAGLE head' if getattr(drafts.get('EAGLE'), '_draft_lm_scales', None) is not None else ''}",
          flush=True)
    rows = bench(target, drafts, tokenizer, args)
    print_table(rows)
    report = {**provenance.stamp(), "prompt_set": args.prompt_set, "args": vars(args), "rows": rows,
              "drafter_state": "emptied before every timed run (a multiturn run's second turns keep its first's)"}
    summary = best_versus_transformers(rows)
    if summary:
        print()
        print_table(summary)
        report["best_versus_transformers"] = summary
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=2)


if __name__ == "__main__":
    main()
