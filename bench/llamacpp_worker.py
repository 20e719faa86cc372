"""llama.cpp's side of bench/bench_llamacpp.py, in a process of its own.

llama-cpp-python carries its own build of ggml; specswap loads libggml-python's. Two ggml builds in one process
crashed at the first generation on a 2-core Intel Xeon (a general protection fault in libggml-cpu.so), so the
benchmark runs llama.cpp here, in a child that imports llama_cpp and nothing of specswap or torch, and talks to it
over stdin / stdout, one JSON object a line:

- start-up: ``python llamacpp_worker.py --gguf F --threads T --n-ctx N --seed S [--lookup-tokens K]`` builds one
  ``llama_cpp.Llama`` (with ``LlamaPromptLookupDecoding(num_pred_tokens=K)`` as its draft model when K is given)
  and writes ``{"ready": true, "version": ...}``;
- then each request ``{"method": "reset" | "create_completion" | "tokenize", "args": [...], "kwargs": {...}}``
  is answered with ``{"result": ...}``, or ``{"error": "..."}`` (the request failed; the worker goes on);
- end of input ends the worker.

``tokenize`` takes the text as a string (sent as UTF-8 bytes to llama.cpp) and returns the token ids.
"""

from __future__ import annotations

import argparse
import json

from peer_protocol import answer_channel, serve


def build(args: argparse.Namespace):
    import llama_cpp  # noqa: PLC0415
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding  # noqa: PLC0415

    draft = None if args.lookup_tokens is None else LlamaPromptLookupDecoding(num_pred_tokens=args.lookup_tokens)
    # with a draft model llama-cpp-python keeps every row's logits (it forces logits_all) in a scores buffer of
    # n_batch rows unless logits_all=True is passed, which sizes it n_ctx: ask for it outright
    llm = llama_cpp.Llama(model_path=args.gguf, n_threads=args.threads, n_threads_batch=args.threads,
                          n_ctx=args.n_ctx, n_batch=args.n_ctx, seed=args.seed, verbose=False, draft_model=draft,
                          logits_all=draft is not None)
    return llm, llama_cpp.__version__


def answer(llm, request: dict):
    method, call_args, kwargs = request["method"], request.get("args", []), request.get("kwargs", {})
    if method == "reset":
        return llm.reset()
    if method == "create_completion":
        return llm.create_completion(*call_args, **kwargs)
    if method == "tokenize":
        text, *rest = call_args
        return list(llm.tokenize(text.encode("utf-8"), *rest, **kwargs))
    raise ValueError(f"unknown method {method!r}; expected reset, create_completion or tokenize")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--n-ctx", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lookup-tokens", type=int, default=None, help="prompt lookup's num_pred_tokens")
    args = parser.parse_args(argv)
    out = answer_channel()  # llama.cpp's own prints go to stderr
    llm, version = build(args)
    out.write(json.dumps({"ready": True, "version": version}) + "\n")
    out.flush()
    serve(out, lambda request: answer(llm, request))

if __name__ == "__main__":
    main()
