"""A request's life in the engine: ``Request`` (its tokens, text, stop checks and output), the outputs callers
see (``RequestOutput``, ``StepOutput``), the prompt encoding, and how joining requests are grouped for prefill."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from specswap.sampling import SamplingParams

__all__ = ["Request", "RequestOutput", "StepOutput", "encode_text", "prefill_groups", "PREFILL_TOKEN_BUDGET"]

# joining requests are prefilled together, right-padded, in groups of at most this many (padded) tokens
PREFILL_TOKEN_BUDGET = 8192


@dataclass
class RequestOutput:
    """A request's state as the engine reports it; ``finish_reason`` is None while it runs."""

    request_id: int
    prompt_token_ids: list[int]
    token_ids: list[int]                  # generated tokens only (an EOS that ended the request included)
    text: str                             # decoded tokens, cut before a matched stop string
    finish_reason: str | None             # "length" | "stop" | "abort" | "error" | None
    num_verify_rounds: int
    accept_lengths: list[int]             # accepted draft tokens per verify round, bonus excluded
    num_draft_tokens: int = 0             # drafts verified for this request over its rounds (0 with speculation off)
    error: str | None = None              # finish_reason "error": what failed while serving this request alone

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class StepOutput:
    """What one ``step()`` did: the outputs of every request that changed (running ones with their text so far;
    each finished one exactly once) and the tier its decode round ran for (the active tier: a switch the
    policy makes after the round applies from the next step)."""

    outputs: list[RequestOutput]
    tier: int

    @property
    def finished(self) -> list[RequestOutput]:
        return [output for output in self.outputs if output.finished]


@dataclass
class Request:
    """One request as the engine tracks it, from add_request() to its final output."""

    request_id: int
    prompt_ids: list[int]
    params: SamplingParams
    max_tokens: int                       # max_new_tokens capped by what fits in max_seq_len
    generator: torch.Generator | None
    slot: int | None = None
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    accept_lengths: list[int] = field(default_factory=list)
    num_draft_tokens: int = 0             # drafts verified for it over its rounds
    stop_string_hit: bool = False         # text was cut at a stop string
    error: str | None = None              # a fault while serving it alone (finish_reason "error")

    def append(self, tokens: list[int], eos_token_ids: frozenset[int], tokenizer: Any) -> int:
        """Add a round's tokens, stopping at EOS, the token budget or a stop string (sets finish_reason);
        returns how many were taken before a stop."""
        taken = 0
        params = self.params
        for token in tokens:
            self.token_ids.append(token)
            taken += 1
            if (token in eos_token_ids and not params.ignore_eos) or token in params.stop_token_ids:
                self.finish_reason = "stop"  # (masked while short of min_new_tokens: never drawn then)
                break
            if len(self.token_ids) >= self.max_tokens:
                self.finish_reason = "length"
                break
        if params.stop and tokenizer is not None and len(self.token_ids) >= params.min_new_tokens:
            self._cut_at_stop_string(tokenizer, len(tokens))
        return taken

    def _cut_at_stop_string(self, tokenizer: Any, num_new: int) -> None:
        """Cut at the first stop string that ends past the request's first ``min_new_tokens`` tokens."""
        text = tokenizer.decode(self.token_ids)
        floor = len(tokenizer.decode(self.token_ids[:self.params.min_new_tokens])) if self.params.min_new_tokens else 0
        hits = [(at, s) for s in self.params.stop if (at := text.find(s, max(floor - len(s) + 1, 0))) >= 0]
        if not hits:
            return
        cut, _ = min(hits)
        # keep the shortest token prefix whose text reaches the stop string
        for keep in range(max(len(self.token_ids) - num_new, self.params.min_new_tokens, 0), len(self.token_ids) + 1):
            prefix_text = tokenizer.decode(self.token_ids[:keep])
            if any(s in prefix_text[max(floor - len(s) + 1, 0):] for s in self.params.stop):
                del self.token_ids[keep:]
                break
        self.finish_reason = "stop"
        self.stop_string_hit = True
        self.text = text[:cut]

    def output(self, tokenizer: Any) -> RequestOutput:
        text = self.text
        if self.finish_reason is None and tokenizer is not None:
            text = tokenizer.decode(self.token_ids)
        return RequestOutput(self.request_id, list(self.prompt_ids), list(self.token_ids), text,
                             self.finish_reason, len(self.accept_lengths), list(self.accept_lengths),
                             self.num_draft_tokens, self.error)


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a string prompt, with BOS when the tokenizer has one (how the engine tokenizes)."""
    return tokenizer.encode(text, add_bos=tokenizer.bos_token_id is not None)


def prefill_groups(requests: list, token_budget: int) -> list[list]:
    """Split joining requests, in order, into groups whose padded size (count x longest prompt) fits the
    budget; a prompt longer than the budget goes alone."""
    groups: list[list] = []
    for request in requests:
        if groups:
            group = groups[-1]
            longest = max(len(request.prompt_ids), *(len(r.prompt_ids) for r in group))
            if (len(group) + 1) * longest <= token_budget:
                group.append(request)
                continue
        groups.append([request])
    return groups
