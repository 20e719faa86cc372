"""OpenAI request validation and error bodies (pure functions, no I/O); chat prompts are rendered by ``chat``."""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass
from typing import Any

from specswap.sampling import FLOAT32_MAX, FLOAT32_TINY, INT64_MAX, SamplingParams

MAX_STOP_STRINGS = 4
MAX_STOP_TOKEN_IDS = 64
INT64_MIN = -(1 << 63)
# a number field is 0 or has a magnitude in [FLOAT32_TINY, FLOAT32_MAX] (sampling's): the range the sampler's float32
# tensors hold without overflow or underflow
DEFAULT_COMPLETION_MAX_TOKENS = 16       # as OpenAI's completions endpoint
DEFAULT_CHAT_MAX_TOKENS = 256
CHAT_ROLES = ("system", "user", "assistant")


class APIError(Exception):
    """An error answered as ``{"error": {"message", "type", "param", "code"}}`` with an HTTP status."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 error_type: str = "invalid_request_error", headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.error_type = status, message, param, code, error_type
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param, "code": self.code}}


@dataclass
class ParsedRequest:
    prompt: str | list[int]               # text (the engine adds BOS) or token ids as given (chat: rendered)
    params: SamplingParams
    stream: bool
    include_usage: bool                   # stream_options.include_usage
    max_tokens_param: str | None = None   # the field that set max_new_tokens; None: a default, capped to fit
    request_timeout: float | None = None  # the request's own deadline in seconds (the server's may be shorter)


def _bad(message: str, param: str, code: str | None = None) -> APIError:
    return APIError(400, message, param, code)


MAX_JSON_DEPTH = 32   # objects and lists nested deeper in a body are a 400 (no route needs more than 5)


def _valid_text(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate ("\\ud800" in JSON): no character, not UTF-8
        return False
    return True


def check_json_body(body: Any, max_depth: int = MAX_JSON_DEPTH) -> None:
    """A 400 for a parsed body no route can take: nested deeper than ``max_depth``, or a string (a value or a key,
    anywhere) with a lone surrogate; the field is named by its top-level key, written in ASCII."""
    stack = [(body, 1, None)]
    while stack:
        value, depth, top = stack.pop()
        if depth > max_depth:
            raise APIError(400, f"the request body is nested deeper than {max_depth} levels", top, "too_deep")
        if isinstance(value, str):
            if not _valid_text(value):
                raise APIError(400, f"{ascii(top) if top else 'the body'} holds a lone surrogate: not valid Unicode "
                                    f"text", top if top is None or _valid_text(top) else ascii(top), "invalid_text")
        elif isinstance(value, dict):
            for key, item in value.items():
                if not _valid_text(key):
                    raise APIError(400, f"the key {ascii(key)} holds a lone surrogate: not valid Unicode text",
                                   ascii(key), "invalid_text")
                stack.append((item, depth + 1, key if top is None else top))
        elif isinstance(value, list):
            stack.extend((item, depth + 1, top) for item in value)


def check_float_range(value: float, name: str) -> None:
    """A 400 naming ``name`` for a finite number the sampler's float32 tensors cannot hold: past FLOAT32_MAX
    (overflow) or nonzero below FLOAT32_TINY (subnormal, or 0 after rounding)."""
    magnitude = abs(float(value))
    if magnitude > FLOAT32_MAX:
        raise _bad(f"'{name}' is too large: {value!r} is past the largest float32 ({FLOAT32_MAX:.7g})", name)
    if 0 < magnitude < FLOAT32_TINY:
        raise _bad(f"'{name}' is too small to represent: {value!r} is nonzero but below the smallest normal "
                   f"float32 ({FLOAT32_TINY:.7g}); send 0 or a larger value", name)


def check_int64(value: int, name: str) -> None:
    """A 400 naming ``name`` for an integer outside int64."""
    if not INT64_MIN <= value <= INT64_MAX:
        raise _bad(f"'{name}' must fit in a signed 64-bit integer ({INT64_MIN}..{INT64_MAX}), got {value}", name)


def _number(body: dict, name: str, default: float, low: float, high: float, low_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(f"'{name}' must be a number, got {value!r:.80}", name)
    if isinstance(value, int):
        check_int64(value, name)
    if not math.isfinite(value):
        raise _bad(f"'{name}' must be a number, got {value!r}", name)
    check_float_range(value, name)
    if value < low or value > high or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise _bad(f"'{name}' must be in {bracket}{low}, {high}], got {value!r}", name)
    return float(value)


def _integer(body: dict, name: str, default: int | None, low: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"'{name}' must be an integer, got {value!r:.80}", name)
    check_int64(value, name)
    if low is not None and value < low:
        raise _bad(f"'{name}' must be >= {low}, got {value}", name)
    return value


def check_token_ids(ids: list[int], name: str) -> None:
    """A 400 naming ``name`` for a token id outside int64 (the engine's vocabulary check names the rest)."""
    for token in ids:
        if not INT64_MIN <= token <= INT64_MAX:
            raise _bad(f"'{name}' holds token id {token}, which does not fit in a signed 64-bit integer", name)


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise _bad(f"'stop' must be a non-empty string or a list of them, got {stop!r}", "stop")
    if len(stop) > MAX_STOP_STRINGS:
        raise _bad(f"'stop' takes at most {MAX_STOP_STRINGS} strings, got {len(stop)}", "stop")
    return tuple(stop)


def request_timeout(body: dict) -> float | None:
    """The body's ``request_timeout``: seconds > 0 from arrival, or None."""
    value = body.get("request_timeout")
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        check_int64(value, "request_timeout")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise _bad(f"'request_timeout' must be a number of seconds > 0, got {value!r:.80}", "request_timeout")
    check_float_range(value, "request_timeout")
    return float(value)


def flag(body: dict, name: str, param: str | None = None, default: bool = False) -> bool:
    """A boolean field (absent or null: ``default``)."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _bad(f"'{param or name}' must be a boolean, got {value!r}", param or name)
    return value


def _unsupported(body: dict) -> None:
    n = body.get("n")
    if n is not None and n != 1:
        raise _bad(f"'n' must be 1 (one choice per request), got {n!r}", "n")
    best_of = body.get("best_of")
    if best_of is not None and best_of != 1:
        raise _bad(f"'best_of' must be 1, got {best_of!r}", "best_of")
    for name in ("logprobs", "top_logprobs", "echo", "logit_bias", "tools", "suffix"):
        if body.get(name) not in (None, False, 0, {}, []):
            raise _bad(f"'{name}' is not supported by this server", name)
    for name in ("presence_penalty", "frequency_penalty"):
        if body.get(name) not in (None, 0, 0.0):
            raise _bad(f"'{name}' is not supported (only 0)", name)
    # features a client relies on (JSON mode, tools, guided decoding, penalties): refused until built, never ignored
    response_format = body.get("response_format")
    if response_format not in (None, {"type": "text"}):
        raise _bad(f"'response_format' is not supported by this server (only {{\"type\": \"text\"}}), got "
                   f"{response_format!r:.80}", "response_format")
    if body.get("tool_choice") not in (None, "none"):
        raise _bad(f"'tool_choice' is not supported by this server (only \"none\"), got "
                   f"{body['tool_choice']!r:.80}", "tool_choice")
    for name in ("functions", "function_call", *(key for key in body if isinstance(key, str)
                                                 and key.startswith("guided_"))):
        if body.get(name) not in (None, [], {}, "none"):
            raise _bad(f"'{name}' is not supported by this server", name)
    if body.get("repetition_penalty") not in (None, 1, 1.0):
        raise _bad(f"'repetition_penalty' is not supported (only 1.0), got {body['repetition_penalty']!r:.80}",
                   "repetition_penalty")


def token_id_list(body: dict, name: str, param: str | None = None) -> tuple[int, ...]:
    """A list of token ids (absent or null: none), each within int64 and >= 0."""
    value = body.get(name)
    if value is None:
        return ()
    param = param or name
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                              for t in value):
        raise _bad(f"'{param}' must be a list of token ids (integers >= 0), got {value!r:.80}", param)
    if len(value) > MAX_STOP_TOKEN_IDS:
        raise _bad(f"'{param}' takes at most {MAX_STOP_TOKEN_IDS} token ids, got {len(value)}", param)
    check_token_ids(value, param)
    return tuple(value)


def min_tokens(body: dict, name: str, max_tokens: int, param: str | None = None) -> int:
    """vLLM's min_tokens / SGLang's min_new_tokens: an int in 0..max_tokens."""
    value = _integer(body, name, 0, low=0)
    if value > max_tokens:
        raise _bad(f"'{param or name}' ({value}) must not exceed the token budget ({max_tokens})", param or name)
    return value


def _common(body: dict, default_max_tokens: int,
            max_tokens_names: tuple[str, ...]) -> tuple[SamplingParams, bool, bool, str | None]:
    if not isinstance(body, dict):
        raise _bad(f"the request body must be a JSON object, got {type(body).__name__}", None)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad(f"'model' must be a string, got {model!r}", "model")
    _unsupported(body)
    max_tokens, max_tokens_param = default_max_tokens, None
    for name in max_tokens_names:
        if body.get(name) is not None:
            max_tokens, max_tokens_param = _integer(body, name, default_max_tokens, low=1), name
            break
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0, low_open=True)
    top_k = _integer(body, "top_k", 0, low=0)
    seed = _integer(body, "seed", None)
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _bad(f"'stream' must be a boolean, got {stream!r}", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise _bad(f"'stream_options' must be an object, got {options!r}", "stream_options")
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise _bad(f"'stream_options.include_usage' must be a boolean, got {include_usage!r}", "stream_options")
    ignore_eos = flag(body, "ignore_eos")  # vLLM's extension, which benchmarks send: run to max_tokens
    params = SamplingParams(max_new_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                            seed=seed, stop=_stop(body), ignore_eos=ignore_eos,
                            disable_speculative_decoding=flag(body, "disable_speculative_decoding"),
                            suffix_cache_output=flag(body, "suffix_cache_output", default=True),
                            min_new_tokens=min_tokens(body, "min_tokens", max_tokens),
                            stop_token_ids=token_id_list(body, "stop_token_ids"))
    return params, stream, include_usage, max_tokens_param


def parse_completion(body: Any, max_prompt_chars: int) -> ParsedRequest:
    """POST /v1/completions: ``prompt`` is a string, a list of token ids, or a list holding one of those."""
    params, stream, include_usage, max_tokens_param = _common(body, DEFAULT_COMPLETION_MAX_TOKENS, ("max_tokens",))
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise _bad("'prompt' must not be empty (as vLLM answers)", "prompt")
        if len(prompt) > max_prompt_chars:
            raise _bad(f"the prompt has {len(prompt)} characters; at most {max_prompt_chars} are accepted "
                       f"(--max-prompt-chars)", "prompt", "context_length_exceeded")
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        check_token_ids(prompt, "prompt")
        if len(prompt) > max_prompt_chars:
            raise _bad(f"the prompt has {len(prompt)} token ids; at most {max_prompt_chars} are accepted "
                       f"(--max-prompt-chars)", "prompt", "context_length_exceeded")
    elif isinstance(prompt, list) and len(prompt) > 1:
        raise _bad("one prompt per request: send a string or a list of token ids, not a batch", "prompt")
    else:
        raise _bad(f"'prompt' must be a string or a non-empty list of token ids, got {prompt!r:.80}", "prompt")
    return ParsedRequest(prompt, params, stream, include_usage, max_tokens_param, request_timeout(body))


def _message_text(content: Any, index: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        parts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise _bad(f"messages[{index}].content: only text parts are supported, got {part!r:.80}", "messages")
            parts.append(part["text"])
        return "".join(parts)
    raise _bad(f"messages[{index}].content must be a string or a list of text parts, got {content!r:.80}", "messages")


def parse_messages(body: dict) -> list[tuple[str, str]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad(f"'messages' must be a non-empty list, got {messages!r:.80}", "messages")
    parsed = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _bad(f"messages[{index}] must be an object, got {message!r:.80}", "messages")
        role = message.get("role")
        if role == "developer":
            role = "system"
        if role not in CHAT_ROLES:
            raise _bad(f"messages[{index}].role must be one of {', '.join(CHAT_ROLES)}, got {role!r}", "messages")
        parsed.append((role, _message_text(message.get("content"), index)))
    return parsed


def parse_chat(body: Any, tokenizer: Any, max_prompt_chars: int) -> ParsedRequest:
    """POST /v1/chat/completions; ``max_completion_tokens`` is accepted as OpenAI's newer name for max_tokens.

    The conversation is rendered with the model's own chat template (``chat.chat_prompt_ids``) and sent as token
    ids; a model without a template, or a template that refuses the conversation, is a 400."""
    from .chat import ChatTemplateError, chat_prompt_ids  # noqa: PLC0415

    params, stream, include_usage, max_tokens_param = _common(body, DEFAULT_CHAT_MAX_TOKENS,
                                                              ("max_completion_tokens", "max_tokens"))
    messages = [{"role": role, "content": text} for role, text in parse_messages(body)]
    if tokenizer is None:
        raise _bad("chat needs a tokenizer with a chat template; this server has no tokenizer", "messages",
                   "no_chat_template")
    try:
        text, prompt_ids = chat_prompt_ids(tokenizer, messages)
    except ChatTemplateError as error:
        code = "no_chat_template" if getattr(tokenizer, "chat_template", None) is None else "chat_template_error"
        raise _bad(str(error), "messages", code) from error
    if len(text) > max_prompt_chars:
        raise _bad(f"the conversation has {len(text)} characters; at most {max_prompt_chars} are accepted "
                   f"(--max-prompt-chars)", "messages", "context_length_exceeded")
    return ParsedRequest(prompt_ids, params, stream, include_usage, max_tokens_param, request_timeout(body))


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def finish_reason(reason: str | None) -> str | None:
    """Finish reasons as OpenAI's finish_reason: "stop", "length", and the server's own "abort" (the client left,
    or /abort_request), "timeout" (past its deadline) and "shutdown" (aborted when the drain timed out)."""
    return reason


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def stream_safe_length(text: str, stops: tuple[str, ...], finished: bool) -> int:
    """How much of ``text`` may be streamed now: hold back a trailing partial UTF-8 character (decoded as
    U+FFFD) and any suffix that could still grow into a stop string (the engine cuts stop strings at the end)."""
    if finished:
        return len(text)
    end = len(text)
    while end > 0 and text[end - 1] == "\ufffd":
        end -= 1
    hold = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, end), 0, -1):
            if text[end - size:end] == stop[:size]:
                hold = max(hold, size)
                break
    return end - hold
