"""Measure how many draft tokens the tiny target accepts per verify, with greedy chain drafting.

A measurement, not the serving worker: one request at a time, plain Python loops, but on the real model layer
(static KV cache, rollback by forgetting a length). Every run is also checked against plain greedy decoding of
the target, which speculative greedy decoding must reproduce token for token.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from specswap.models import EagleHead, LlamaForCausalLM, load_eagle_head, load_model, load_tokenizer

from .data import build_corpus

DRAFT_LENGTHS = (1, 3, 7)
PROMPTS_PER_DOMAIN = 8
PROMPT_TOKENS = 64
NEW_TOKENS = 64
SLOT = torch.tensor([0])


def _step(model, ids: list[int], start: int, cache):
    """Run ``ids`` at positions start.. through ``model`` in slot 0; returns the ModelOutput."""
    return model(torch.tensor([ids]), torch.arange(start, start + len(ids))[None], cache, SLOT)


class ModelDrafter:
    """A standalone draft model: autoregressive greedy drafting with its own KV cache."""

    def __init__(self, draft: LlamaForCausalLM, capacity: int):
        self.draft, self.cache = draft, draft.make_cache(1, capacity)
        self.valid_length = 0  # cache entries at positions < valid_length match the sequence

    def propose(self, sequence: list[int], features: torch.Tensor, k: int) -> list[int]:
        length = len(sequence)
        out = _step(self.draft, sequence[self.valid_length:], self.valid_length, self.cache)
        drafts = [int(out.logits[0, -1].argmax())]
        for index in range(k - 1):
            out = _step(self.draft, [drafts[-1]], length + index, self.cache)
            drafts.append(int(out.logits[0, -1].argmax()))
        self.valid_length = length
        return drafts

    def accepted(self, old_length: int, accepted: int, k: int) -> None:
        # drafts d1..d_{k-1} were fed at positions old_length..; the accepted ones stay valid
        self.valid_length = old_length + min(accepted, k - 1)


class EagleDrafter:
    """An EAGLE head: entry q consumes (x_q, f_{q-1}); target features where known, its own while drafting."""

    def __init__(self, head: EagleHead, capacity: int):
        self.head, self.cache = head, head.make_cache(1, capacity)
        self.valid_length = 1  # entries q < valid_length were fed with the target's features

    def propose(self, sequence: list[int], features: torch.Tensor, k: int) -> list[int]:
        # features: [capacity, H]; rows 0 .. len(sequence) - 2 hold the target's hidden states
        length, start = len(sequence), self.valid_length
        out = self.head(torch.tensor([sequence[start:]]), features[start - 1:length - 1][None],
                        torch.arange(start, length)[None], self.cache, SLOT)
        drafts = [self._target_id(out.logits[0, -1])]
        hidden = out.hidden[:, -1:]
        for index in range(k - 1):
            out = self.head(torch.tensor([[drafts[-1]]]), hidden, torch.tensor([[length + index]]), self.cache, SLOT)
            drafts.append(self._target_id(out.logits[0, -1]))
            hidden = out.hidden
        self.valid_length = length
        return drafts

    def _target_id(self, logits: torch.Tensor) -> int:
        """The argmax of draft logits [Vd] as a target token id (through the token map, if the head has one)."""
        draft_id = int(logits.argmax())
        return draft_id if self.head.token_map is None else int(self.head.token_map[draft_id])

    def accepted(self, old_length: int, accepted: int, k: int) -> None:
        pass  # self-fed entries are always re-fed with the target's features next round


@dataclass
class ChainResult:
    tokens: list[int]
    accepted_per_verify: list[int]


@torch.no_grad()
def greedy(target: LlamaForCausalLM, prompt: list[int], new_tokens: int) -> list[int]:
    cache = target.make_cache(1, len(prompt) + new_tokens + 1)
    out = _step(target, prompt, 0, cache)
    tokens = [int(out.logits[0, -1].argmax())]
    while len(tokens) < new_tokens:
        out = _step(target, [tokens[-1]], len(prompt) + len(tokens) - 1, cache)
        tokens.append(int(out.logits[0, -1].argmax()))
    return tokens


@torch.no_grad()
def chain_draft(target: LlamaForCausalLM, make_drafter, prompt: list[int], new_tokens: int, k: int) -> ChainResult:
    """Greedy speculative decoding: draft k tokens, verify them in one target forward, keep the agreeing prefix."""
    capacity = len(prompt) + new_tokens + k + 2
    cache = target.make_cache(1, capacity)
    features = torch.zeros(capacity, target.config.hidden_size, dtype=target.dtype)
    drafter = make_drafter(capacity)
    out = _step(target, prompt, 0, cache)
    features[:len(prompt)] = out.hidden[0]
    sequence = prompt + [int(out.logits[0, -1].argmax())]
    accepted_counts = []
    while len(sequence) - len(prompt) < new_tokens:
        length = len(sequence)
        drafts = drafter.propose(sequence, features, k)
        out = _step(target, [sequence[-1], *drafts], length - 1, cache)       # verify: logits for L .. L + k
        choices = out.logits[0].argmax(-1).tolist()
        accepted = 0
        while accepted < k and drafts[accepted] == choices[accepted]:
            accepted += 1
        features[length - 1:length + accepted] = out.hidden[0, :accepted + 1]
        sequence += drafts[:accepted] + [choices[accepted]]
        drafter.accepted(length, accepted, k)
        accepted_counts.append(accepted)
    return ChainResult(tokens=sequence[len(prompt):len(prompt) + new_tokens], accepted_per_verify=accepted_counts)


def heldout_prompts(tokenizer_dir: Path, count: int = PROMPTS_PER_DOMAIN,
                    prompt_tokens: int = PROMPT_TOKENS) -> dict[str, list[list[int]]]:
    """``count`` evenly spaced windows of each domain's held-out token stream."""
    tokenizer = load_tokenizer(tokenizer_dir)
    corpus = build_corpus()
    prompts = {}
    for domain, splits in corpus.documents.items():
        stream: list[int] = []
        for doc in splits["heldout"]:
            stream += tokenizer.encode(doc, add_bos=True) + sorted(tokenizer.eos_token_ids)
        spacing = (len(stream) - prompt_tokens) // count
        prompts[domain] = [stream[i * spacing:i * spacing + prompt_tokens] for i in range(count)]
    return prompts


def measure_acceptance(target_dir: Path, eagle_dir: Path, draft_dir: Path,
                       draft_lengths: tuple[int, ...] = DRAFT_LENGTHS, new_tokens: int = NEW_TOKENS) -> dict:
    """Accepted draft tokens per verify for each drafter, domain and k (greedy), on held-out prompts."""
    target = load_model(target_dir)
    drafters = {
        "eagle": lambda capacity, head=load_eagle_head(eagle_dir, target): EagleDrafter(head, capacity),
        "draft": lambda capacity, draft=load_model(draft_dir): ModelDrafter(draft, capacity),
    }
    prompts = heldout_prompts(target_dir)
    results: dict = {"method": f"greedy chain drafting, {PROMPTS_PER_DOMAIN} held-out prompts per domain of "
                               f"{PROMPT_TOKENS} tokens, {new_tokens} new tokens each; accepted = draft tokens "
                               "accepted per target verify (tokens per verify = accepted + 1)"}
    lossless = True
    for domain, domain_prompts in prompts.items():
        references = [greedy(target, prompt, new_tokens) for prompt in domain_prompts]
        for name, make_drafter in drafters.items():
            for k in draft_lengths:
                counts: list[int] = []
                for prompt, reference in zip(domain_prompts, references):
                    result = chain_draft(target, make_drafter, prompt, new_tokens, k)
                    lossless &= result.tokens == reference
                    counts += result.accepted_per_verify
                results.setdefault(name, {}).setdefault(domain, {})[f"k={k}"] = {
                    "accepted_per_verify": round(sum(counts) / len(counts), 3),
                    "acceptance_rate": round(sum(counts) / (k * len(counts)), 3), "verifies": len(counts)}
    results["matches_plain_greedy"] = lossless
    return results
