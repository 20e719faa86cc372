"""OpenVINO GenAI's side of bench/bench_llamacpp.py, in a process of its own (the OpenVINO venv's python).

OpenVINO needs transformers 5.0.0 and a torch of its own for its exporter, so it lives in a venv of its own
(tools/setup_openvino.sh); the benchmark runs this script with that venv's python and talks to it over stdin /
stdout, one JSON object a line, as to bench/llamacpp_worker.py:

- start-up: ``python openvino_worker.py --ir DIR --threads T [--lookup-tokens K --max-ngram-size N]
  [--stop-ids 1 106]`` builds one ``openvino_genai.LLMPipeline(DIR, "CPU")`` with T inference threads, one
  stream and the latency hint, prefix caching off (no request reuses an earlier one's prompt); with K it is
  prompt-lookup decoding (``prompt_lookup=True``, ``num_assistant_tokens`` K, ``max_ngram_size`` N). It writes
  ``{"ready": true, "version": ..., "properties": ...}``;
- then each request ``{"method": "generate" | "tokenize", "args": [...], "kwargs": {...}}`` is answered with
  ``{"result": ...}``, or ``{"error": "..."}`` (the request failed; the worker goes on);
- end of input ends the worker.

``generate(prompt, max_new_tokens, temperature, seed)`` tokenizes (with <bos>), generates (greedy at
temperature 0, else sampling the whole distribution: no top-k, top-p 1, the seed as ``rng_seed``) and detokenizes,
and returns ``{"tokens", "seconds", "ids", "text", "stopped"}``: tokens counts the generated ids without a final
stop id (as llama.cpp's completion_tokens and the bench's specswap side count), ids are all of them, seconds
the worker's own time of the three steps. ``tokenize(text)`` returns the prompt's ids.
``--prompt TEXT`` instead answers one generate as one JSON line and exits (a check by hand).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Sequence

from peer_protocol import answer_channel, serve

DEFAULT_STOP_IDS = (1, 106)  # <eos>, <end_of_turn>: specswap's stop set for gemma-3-270m
MAX_BATCHED_TOKENS = 2**63 - 1  # no limit on a step's tokens (OpenVINO's latency-oriented default: SIZE_MAX)


def pipeline_properties(threads: int, lookup_tokens: int | None) -> dict[str, Any]:
    """``LLMPipeline``'s keywords besides the scheduler config: one stream of ``threads`` threads, latency hint,
    and ``prompt_lookup`` when prompt lookup runs."""
    properties: dict[str, Any] = {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY"}
    if lookup_tokens is not None:
        properties["prompt_lookup"] = True
    return properties


def generation_fields(max_new_tokens: int, temperature: float, seed: int, stop_ids: Sequence[int],
                      lookup_tokens: int | None, max_ngram_size: int) -> dict[str, Any]:
    """The ``GenerationConfig`` attributes of one request."""
    fields: dict[str, Any] = {"max_new_tokens": max_new_tokens, "stop_token_ids": set(stop_ids),
                              "eos_token_id": stop_ids[0], "do_sample": temperature > 0}
    if temperature > 0:  # the whole distribution: top_k left off (OpenVINO's default), top_p 1
        fields.update(temperature=temperature, top_p=1.0, rng_seed=seed)
    if lookup_tokens is not None:
        fields.update(num_assistant_tokens=lookup_tokens, max_ngram_size=max_ngram_size)
    return fields


def count(ids: Sequence[int], max_new_tokens: int, stop_ids: Sequence[int]) -> tuple[int, bool]:
    """(tokens without a final stop id, stopped before max_new_tokens)."""
    ended = bool(ids) and ids[-1] in stop_ids
    tokens = len(ids) - ended
    return tokens, ended or tokens < max_new_tokens


class Worker:
    """One pipeline and its tokenizer; ``answer`` serves the requests."""

    def __init__(self, args: argparse.Namespace, genai=None):
        if genai is None:
            import openvino_genai as genai  # noqa: PLC0415
        self.genai, self.args = genai, args
        self.stop_ids = tuple(args.stop_ids)
        self.properties = pipeline_properties(args.threads, args.lookup_tokens)
        # LLMPipeline's own latency-oriented scheduler (the whole prompt in one step) but prefix caching off: no
        # request starts from an earlier one's prompt, as llama.cpp resets its cache before each
        scheduler = genai.SchedulerConfig()
        scheduler.max_num_batched_tokens = MAX_BATCHED_TOKENS
        scheduler.enable_prefix_caching = False
        self.pipe = genai.LLMPipeline(args.ir, args.device, scheduler_config=scheduler, **self.properties)
        self.tokenizer = self.pipe.get_tokenizer()
        self.version = genai.__version__

    def config(self, max_new_tokens: int, temperature: float, seed: int):
        config = self.pipe.get_generation_config()
        for name, value in generation_fields(max_new_tokens, temperature, seed, self.stop_ids,
                                             self.args.lookup_tokens, self.args.max_ngram_size).items():
            setattr(config, name, value)
        return config

    def tokenize(self, text: str) -> list[int]:
        return [int(i) for i in self.tokenizer.encode(text).input_ids.data[0]]

    def generate(self, prompt: str, max_new_tokens: int, temperature: float = 0.0, seed: int = 0) -> dict:
        config = self.config(max_new_tokens, temperature, seed)
        start = time.perf_counter()
        encoded = self.tokenizer.encode(prompt)
        ids = [int(i) for i in self.pipe.generate(encoded, config).tokens[0]]
        tokens, stopped = count(ids, max_new_tokens, self.stop_ids)
        text = self.tokenizer.decode(ids[:tokens])
        seconds = time.perf_counter() - start
        return dict(tokens=tokens, seconds=seconds, ids=ids, text=text, stopped=stopped)

    def answer(self, request: dict):
        method, call_args, kwargs = request["method"], request.get("args", []), request.get("kwargs", {})
        if method == "generate":
            return self.generate(*call_args, **kwargs)
        if method == "tokenize":
            return self.tokenize(*call_args, **kwargs)
        raise ValueError(f"unknown method {method!r}; expected generate or tokenize")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ir", required=True, help="the exported IR folder (tools/export_openvino.py)")
    parser.add_argument("--threads", type=int, default=1, help="INFERENCE_NUM_THREADS")
    parser.add_argument("--device", default="CPU")
    parser.add_argument("--lookup-tokens", type=int, default=None,
                        help="prompt lookup's num_assistant_tokens (absent: plain decoding)")
    parser.add_argument("--max-ngram-size", type=int, default=3, help="prompt lookup's max_ngram_size")
    parser.add_argument("--stop-ids", type=int, nargs="+", default=list(DEFAULT_STOP_IDS))
    parser.add_argument("--prompt", help="answer one generate of this prompt and exit")
    parser.add_argument("--new-tokens", type=int, default=32, help="with --prompt: max new tokens")
    args = parser.parse_args(argv)
    for name in ("threads", "max_ngram_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1; got {getattr(args, name)}")
    if args.lookup_tokens is not None and args.lookup_tokens < 1:
        parser.error(f"--lookup-tokens must be >= 1; got {args.lookup_tokens}")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    out = answer_channel()  # OpenVINO's own prints go to stderr
    worker = Worker(args)
    if args.prompt is not None:
        out.write(json.dumps({"version": worker.version, **worker.generate(args.prompt, args.new_tokens)}) + "\n")
        return
    out.write(json.dumps({"ready": True, "version": worker.version,
                          "properties": {k: v for k, v in worker.properties.items()}}) + "\n")
    out.flush()
    serve(out, worker.answer)

if __name__ == "__main__":
    main()
