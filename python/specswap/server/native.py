"""SGLang's native API: ``POST /generate`` bodies in, SGLang's output objects out (pure functions, no I/O).

A body carries ``text`` (a string or a list of them) or ``input_ids`` (a list of ints or a list of such lists),
``sampling_params`` (one object for every prompt, or a list of one per prompt), ``stream``, ``rid`` (a string, or
one per prompt of a batch) and ``request_timeout``. Other SGLang fields are accepted at the value that changes
nothing; an unknown key is a 400 naming it. Each prompt becomes the same ``ParsedRequest`` the OpenAI routes
build, so both APIs share admission, scheduling and aborts. An output is ``{"text", "output_ids", "meta_info"}``
with SGLang's field names; a batch answers a list of them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from specswap.sampling import SamplingParams
from specswap.server.protocol import (APIError, ParsedRequest, _integer, _number, _stop, check_token_ids, flag,
                                     min_tokens, request_timeout, token_id_list)

DEFAULT_MAX_NEW_TOKENS = 128   # as SGLang
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "max_new_tokens", "min_new_tokens", "stop", "stop_token_ids",
                 "ignore_eos", "sampling_seed", "disable_speculative_decoding", "suffix_cache_output")
# SGLang sampling parameters this server does not implement: accepted at the value that leaves sampling
# unchanged (what clients send by default), a 400 otherwise
NEUTRAL_SAMPLING = {"min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0,
                    "n": 1, "skip_special_tokens": True, "spaces_between_special_tokens": True,
                    "no_stop_trim": False, "json_schema": None, "regex": None,
                    "ebnf": None, "structural_tag": None, "logit_bias": None, "custom_params": None}
UNSUPPORTED_FIELDS = ("input_embeds", "image_data", "audio_data", "video_data", "return_logprob", "lora_path")
BODY_KEYS = ("text", "input_ids", "sampling_params", "stream", "rid", "request_timeout")
# SGLang's other GenerateReqInput fields: each accepted at the values listed (what clients send by default, or
# bookkeeping that changes no output; None always), a 400 otherwise
NEUTRAL_BODY = {"logprob_start_len": (-1,), "top_logprobs_num": (0,), "token_ids_logprob": ([],),
                "return_text_in_logprobs": (False, True), "log_metrics": (False, True),
                "return_hidden_states": (False,), "return_routed_experts": (False,), "return_entropy": (False,),
                "return_bytes": (False,), "require_reasoning": (False,), "use_audio_in_video": (False,),
                "background": (False,), "no_logs": (False, True), "modalities": ([],), "session_params": ({},),
                "lora_id": (), "custom_logit_processor": (), "bootstrap_host": (), "bootstrap_port": (),
                "bootstrap_room": (), "data_parallel_rank": (), "routed_dp_rank": (), "priority": (),
                "conversation_id": "any", "extra_key": "any", "custom_labels": "any", "routing_key": "any",
                "model": "any"}  # sglang-router adds "model": null (or the name it routed by) to every body


@dataclass
class GenerateRequest:
    items: list[ParsedRequest]    # one per prompt, in order
    batched: bool                 # text / input_ids was a list of prompts: the answer is a list
    stream: bool
    param: str                    # "text" or "input_ids", for errors about the prompt
    rids: list[str] | None = None  # the body's rid (one per prompt), or None: generated


def _bad(message: str, param: str | None) -> APIError:
    return APIError(400, message, param)


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, int) and not isinstance(t, bool)
                                                          for t in value)


def _check_lengths(prompts: list, batched: bool, field: str, unit: str, limit: int) -> None:
    """A 400 naming the first prompt longer than ``limit`` (--max-prompt-chars) and where it is."""
    for index, prompt in enumerate(prompts):
        if len(prompt) > limit:
            where = f"{field}[{index}]" if batched else field
            raise APIError(400, f"{where} has {len(prompt)} {unit}; at most {limit} are accepted "
                                f"(--max-prompt-chars)", field, "context_length_exceeded")


def _prompts(body: dict, max_prompt_chars: int) -> tuple[list[str | list[int]], bool, str]:
    text, input_ids = body.get("text"), body.get("input_ids")
    if text is not None and input_ids is not None:
        raise _bad("give either 'text' or 'input_ids', not both", "text")
    if text is not None:
        prompts, batched = ([text], False) if isinstance(text, str) else (text, True)
        if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
            raise _bad(f"'text' must be a string or a non-empty list of strings, got {text!r:.80}", "text")
        if not all(prompts):
            raise _bad("'text' must not be empty (a batch's every prompt too)", "text")
        _check_lengths(prompts, batched, "text", "characters", max_prompt_chars)
        return prompts, batched, "text"
    if input_ids is not None:
        if _is_ids(input_ids):
            prompts, batched = [input_ids], False
        elif isinstance(input_ids, list) and input_ids and all(_is_ids(ids) for ids in input_ids):
            prompts, batched = input_ids, True
        else:
            prompts = None
        if prompts is not None:
            _check_lengths(prompts, batched, "input_ids", "token ids", max_prompt_chars)
            for ids in prompts:
                check_token_ids(ids, "input_ids")
            return prompts, batched, "input_ids"
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
        least = min_tokens(values, "min_new_tokens", max_new_tokens)
        stop_ids = token_id_list(values, "stop_token_ids")
    except APIError as error:
        raise _bad(error.message, f"{where}.{error.param}") from error
    ignore_eos = flag(values, "ignore_eos", f"{where}.ignore_eos")
    disable = flag(values, "disable_speculative_decoding", f"{where}.disable_speculative_decoding")
    cache_output = flag(values, "suffix_cache_output", f"{where}.suffix_cache_output", default=True)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                            top_k=max(top_k, 0), seed=seed, stop=stop, ignore_eos=ignore_eos,
                            disable_speculative_decoding=disable, min_new_tokens=least, stop_token_ids=stop_ids,
                            suffix_cache_output=cache_output)
    return params, "max_new_tokens" if values.get("max_new_tokens") is not None else None


def _body_keys(body: dict) -> None:
    """A 400 naming the first key that is unknown, unsupported, or set to a value this server cannot honour."""
    for key, value in body.items():
        if key not in BODY_KEYS and key not in UNSUPPORTED_FIELDS and key not in NEUTRAL_BODY:
            raise _bad(f"unknown field '{key}'; /generate takes {', '.join(BODY_KEYS)} (and SGLang's other fields "
                       f"at their defaults)", key)
        if key in BODY_KEYS or value is None:
            continue
        if key in UNSUPPORTED_FIELDS:
            if value is False:
                continue
            raise _bad(f"'{key}' is not supported by this server", key)
        if key in NEUTRAL_BODY:
            allowed = NEUTRAL_BODY[key]
            if allowed == "any" or any(value == a and type(value) is type(a) for a in allowed):
                continue
        raise _bad(f"'{key}' is not supported by this server (only "
                   f"{', '.join(repr(a) for a in (None, *allowed))}), got {value!r:.80}", key)


def _rids(body: dict, count: int, batched: bool) -> list[str] | None:
    rid = body.get("rid")
    if rid is None:
        return None
    if batched and isinstance(rid, list):
        if len(rid) != count or not all(isinstance(r, str) and r for r in rid):
            raise _bad(f"'rid' for a batch of {count} must be a list of {count} non-empty strings, got {rid!r:.80}",
                       "rid")
        if len(set(rid)) != count:
            raise _bad("'rid' has duplicates; every prompt of a batch needs its own", "rid")
        return list(rid)
    if batched:
        raise _bad(f"'rid' for a batch must be a list of one string per prompt, got {rid!r:.80}", "rid")
    if not isinstance(rid, str) or not rid:
        raise _bad(f"'rid' must be a non-empty string, got {rid!r:.80}", "rid")
    return [rid]


def parse_generate(body: Any, max_prompt_chars: int,
                   max_prompts: int | None = None) -> GenerateRequest:
    """POST /generate: one ParsedRequest per prompt, or a 400 naming the bad field. ``max_prompts``: the most
    prompts one body may carry (``--max-prompts-per-request``)."""
    if not isinstance(body, dict):
        raise _bad(f"the request body must be a JSON object, got {type(body).__name__}", None)
    _body_keys(body)
    prompts, batched, param = _prompts(body, max_prompt_chars)
    if max_prompts is not None and len(prompts) > max_prompts:
        raise APIError(400, f"the batch has {len(prompts)} prompts; at most {max_prompts} are accepted per request "
                            f"(--max-prompts-per-request)", param, "too_many_prompts")
    rids = _rids(body, len(prompts), batched)
    timeout = request_timeout(body)
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
    items = [ParsedRequest(prompt, params, stream, False, max_tokens_param, timeout)
             for prompt, (params, max_tokens_param) in zip(prompts, parsed)]
    return GenerateRequest(items, batched, stream, param, rids)


ABORT_REASONS = ("abort", "timeout", "shutdown")   # the server's reasons for ending a request early


def finish_reason(reason: str | None, token_ids: Sequence[int], text: str, params: SamplingParams,
                  eos_token_ids: frozenset[int], decode: Callable[[list[int]], str] | None,
                  message: str | None = None) -> dict | None:
    """SGLang's finish_reason object: {"type": "length", "length": N}, {"type": "stop", "matched": <EOS id or
    stop string>}, {"type": "abort", "message": ...} (the client left, /abort_request, a deadline or the drain:
    ``message`` says which); None while running."""
    if reason is None:
        return None
    if reason == "length":
        return {"type": "length", "length": len(token_ids)}
    if reason == "stop":
        if token_ids and ((token_ids[-1] in eos_token_ids and not params.ignore_eos)
                          or token_ids[-1] in params.stop_token_ids):
            return {"type": "stop", "matched": token_ids[-1]}
        # a stop string: the engine cut the text where it begins, so the full decode carries it right after
        tail = decode(list(token_ids))[len(text):] if decode is not None else ""
        matched = next((stop for stop in params.stop if tail.startswith(stop)), None)
        return {"type": "stop", "matched": matched}
    if reason in ABORT_REASONS:
        return {"type": "abort", "message": message or "the request was aborted"}
    return {"type": reason, "message": message or reason}


def meta_info(request_id: str, update, reason: dict | None, latency: float,
              speculative: bool, max_steps: int) -> dict[str, Any]:
    """SGLang's meta_info for one request: token counts, finish reason, and with speculation the per-request
    verify count and acceptance as SGLang computes them: ``spec_accept_token_num`` accepted draft tokens,
    ``spec_draft_token_num`` drafts verified (each round's tier, summed), ``spec_accept_rate`` their ratio,
    ``spec_accept_length`` completion tokens per verify (the bonus and the prefill token counted)."""
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
                    spec_accept_token_num=correct, spec_draft_token_num=update.proposed_drafts,
                    spec_num_correct_drafts=correct, spec_num_proposed_drafts=update.proposed_drafts,
                    spec_correct_drafts_histogram=histogram, spec_accept_histogram=histogram)
    return info
