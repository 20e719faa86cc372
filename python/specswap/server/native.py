"""SGLang's native API: ``POST /generate`` bodies in, SGLang's output objects out (pure functions, no I/O).

A body carries ``text`` (a string or a list of them) or ``input_ids`` (a list of ints or a list of such lists),
``sampling_params`` (one object for every prompt, or a list of one per prompt) and ``stream``. Each prompt
becomes the same ``ParsedRequest`` the OpenAI routes build, so both APIs share admission, scheduling and
aborts. An output is ``{"text", "output_ids", "meta_info"}`` with SGLang's field names; a batch answers a
list of them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from specswap.sampling import SamplingParams
from specswap.server.protocol import APIError, ParsedRequest, _integer, _number, _stop

DEFAULT_MAX_NEW_TOKENS = 128   # as SGLang
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "max_new_tokens", "stop", "ignore_eos", "sampling_seed")
# SGLang sampling parameters this server does not implement: accepted at the value that leaves sampling
# unchanged (what clients send by default), a 400 otherwise
NEUTRAL_SAMPLING = {"min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0,
                    "min_new_tokens": 0, "n": 1, "skip_special_tokens": True, "spaces_between_special_tokens": True,
                    "no_stop_trim": False, "stop_token_ids": None, "json_schema": None, "regex": None,
                    "ebnf": None, "structural_tag": None, "logit_bias": None, "custom_params": None}
UNSUPPORTED_FIELDS = ("input_embeds", "image_data", "audio_data", "video_data", "return_logprob", "lora_path")


@dataclass
class GenerateRequest:
    items: list[ParsedRequest]    # one per prompt, in order
    batched: bool                 # text / input_ids was a list of prompts: the answer is a list
    stream: bool
    param: str                    # "text" or "input_ids", for errors about the prompt


def _bad(message: str, param: str | None) -> APIError:
    return APIError(400, message, param)


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, int) and not isinstance(t, bool)
                                                          for t in value)


def _prompts(body: dict, max_prompt_chars: int) -> tuple[list[str | list[int]], bool, str]:
    text, input_ids = body.get("text"), body.get("input_ids")
    if text is not None and input_ids is not None:
        raise _bad("give either 'text' or 'input_ids', not both", "text")
    if text is not None:
        prompts, batched = ([text], False) if isinstance(text, str) else (text, True)
        if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
            raise _bad(f"'text' must be a string or a non-empty list of strings, got {text!r:.80}", "text")
        for index, prompt in enumerate(prompts):
            if len(prompt) > max_prompt_chars:
                where = f"text[{index}]" if batched else "text"
                raise APIError(400, f"{where} has {len(prompt)} characters; at most {max_prompt_chars} are accepted",
                               "text", "context_length_exceeded")
        return prompts, batched, "text"
    if input_ids is not None:
        if _is_ids(input_ids):
            return [input_ids], False, "input_ids"
        if isinstance(input_ids, list) and input_ids and all(_is_ids(ids) for ids in input_ids):
            return input_ids, True, "input_ids"
        raise _bad(f"'input_ids' must be a non-empty list of token ids or a non-empty list of such lists, got "
                   f"{input_ids!r:.80}", "input_ids")
    raise _bad("the request needs 'text' (a string or a list of strings) or 'input_ids'", "text")


def _sampling(values: Any, where: str) -> tuple[SamplingParams, str | None]:
    """SGLang's sampling_params object as SamplingParams; also the field that set max_new_tokens (or None)."""
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise _bad(f"'{where}' must be an object, got {values!r:.80}", where)
    for key, value in values.items():
        if key in SAMPLING_KEYS:
            continue
        if key in NEUTRAL_SAMPLING:
            if value is not None and value != NEUTRAL_SAMPLING[key] and value not in ([], {}):
                raise _bad(f"'{where}.{key}' is not supported by this server (only {NEUTRAL_SAMPLING[key]!r}), got "
                           f"{value!r:.80}", f"{where}.{key}")
            continue
        raise _bad(f"unknown sampling parameter '{where}.{key}'; this server takes {', '.join(SAMPLING_KEYS)}",
                   f"{where}.{key}")
    try:
        max_new_tokens = _integer(values, "max_new_tokens", DEFAULT_MAX_NEW_TOKENS, low=1)
        temperature = _number(values, "temperature", 1.0, 0.0, math.inf)
        top_p = _number(values, "top_p", 1.0, 0.0, 1.0, low_open=True)
        top_k = _integer(values, "top_k", -1, low=-1)  # SGLang: -1 = no cut (0 means the same here)
        seed = _integer(values, "sampling_seed", None)
        stop = _stop(values)
    except APIError as error:
        raise _bad(error.message, f"{where}.{error.param}") from error
    ignore_eos = values.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise _bad(f"'ignore_eos' must be a boolean, got {ignore_eos!r}", f"{where}.ignore_eos")
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                            top_k=max(top_k, 0), seed=seed, stop=stop, ignore_eos=ignore_eos)
    return params, "max_new_tokens" if values.get("max_new_tokens") is not None else None


def parse_generate(body: Any, max_prompt_chars: int) -> GenerateRequest:
    """POST /generate: one ParsedRequest per prompt, or a 400 naming the bad field."""
    if not isinstance(body, dict):
        raise _bad(f"the request body must be a JSON object, got {type(body).__name__}", None)
    for name in UNSUPPORTED_FIELDS:
        if body.get(name) not in (None, False):
            raise _bad(f"'{name}' is not supported by this server", name)
    prompts, batched, param = _prompts(body, max_prompt_chars)
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _bad(f"'stream' must be a boolean, got {stream!r}", "stream")
    sampling = body.get("sampling_params")
    if isinstance(sampling, list):
        if not batched or len(sampling) != len(prompts):
            raise _bad(f"a list of sampling_params needs one object per prompt: {len(prompts)} prompt(s), "
                       f"{len(sampling)} object(s)", "sampling_params")
        parsed = [_sampling(values, f"sampling_params[{i}]") for i, values in enumerate(sampling)]
    else:
        parsed = [_sampling(sampling, "sampling_params")] * len(prompts)
    items = [ParsedRequest(prompt, params, stream, False, max_tokens_param)
             for prompt, (params, max_tokens_param) in zip(prompts, parsed)]
    return GenerateRequest(items, batched, stream, param)


def finish_reason(reason: str | None, token_ids: Sequence[int], text: str, params: SamplingParams,
                  eos_token_ids: frozenset[int], decode: Callable[[list[int]], str] | None) -> dict | None:
    """SGLang's finish_reason object: {"type": "length", "length": N}, {"type": "stop", "matched": <EOS id or
    stop string>}, {"type": "abort", "message": ...}; None while running."""
    if reason is None:
        return None
    if reason == "length":
        return {"type": "length", "length": len(token_ids)}
    if reason == "stop":
        if token_ids and token_ids[-1] in eos_token_ids and not params.ignore_eos:
            return {"type": "stop", "matched": token_ids[-1]}
        # a stop string: the engine cut the text where it begins, so the full decode carries it right after
        tail = decode(list(token_ids))[len(text):] if decode is not None else ""
        matched = next((stop for stop in params.stop if tail.startswith(stop)), None)
        return {"type": "stop", "matched": matched}
    return {"type": reason, "message": "the request was aborted" if reason == "abort" else reason}


def meta_info(request_id: str, update, reason: dict | None, latency: float,
              speculative: bool, max_steps: int) -> dict[str, Any]:
    """SGLang's meta_info for one request: token counts, finish reason, and with speculation the per-request
    verify count and acceptance (``spec_accept_length`` counts the bonus token, as SGLang's does)."""
    completion = len(update.token_ids)
    info: dict[str, Any] = {"id": request_id, "finish_reason": reason, "prompt_tokens": update.prompt_tokens,
                            "completion_tokens": completion, "cached_tokens": 0, "e2e_latency": latency}
    if speculative:
        accepts = update.accept_lengths
        verifies, correct = len(accepts), sum(accepts)
        histogram = [0] * (max(max_steps, max(accepts, default=0)) + 1)  # verifies by accepted drafts
        for accepted in accepts:
            histogram[accepted] += 1
        info.update(spec_verify_ct=verifies, spec_accept_length=completion / verifies if verifies else 0.0,
                    spec_accept_rate=correct / update.proposed_drafts if update.proposed_drafts else 0.0,
                    spec_num_correct_drafts=correct, spec_num_proposed_drafts=update.proposed_drafts,
                    spec_correct_drafts_histogram=histogram, spec_accept_histogram=histogram)
    return info
