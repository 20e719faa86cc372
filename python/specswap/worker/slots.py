"""The slot table: per-request state indexed by cache row, as device tensors a round reads and host mirrors.

A request holds one cache row (its slot) from prefill to release. The device
tensors (committed length m, x_{m-1}, x_{m-2}, sampling settings) are what a
round, eager or replayed from a graph, reads by slot index; the host lists
(lengths, tokens, params, generators, keyed seeds) are what the host-side
parts of a round read without a sync. In graph mode the device tensors have
one more row, the scratch slot that padded batch rows read and write.
"""

from __future__ import annotations

from typing import Sequence

import torch

from specswap.sampling import (KeyedDraws, KeyedNoise, KeyedRow, PlainRows, RoundSampling, SamplingParams,
                               draw_key, draw_uniform_, exponential_)


class SlotTable:
    """Per-slot request state: ``rows`` device rows (the cache rows), ``max_batch_size`` requests."""

    def __init__(self, rows: int, max_batch_size: int, device: torch.device):
        long = dict(dtype=torch.long, device=device)
        self.device = device
        self.seq_lens = torch.zeros(rows, **long)     # [S] m: committed tokens
        self.last_tokens = torch.zeros(rows, **long)  # [S] x_{m-1}
        self.prev_tokens = torch.zeros(rows, **long)  # [S] x_{m-2} (standalone step 1)
        self.temperature = torch.zeros(rows, device=device)
        self.top_p = torch.ones(rows, device=device)
        self.top_k = torch.zeros(rows, **long)
        self.host_seq_lens = [0] * max_batch_size
        self.host_tokens: list[list[int]] = [[] for _ in range(max_batch_size)]  # prompt + output: x_0..x_{m-1}
        self.params: list[SamplingParams | None] = [None] * max_batch_size
        self.generators: list[torch.Generator | None] = [None] * max_batch_size
        self.keyed_seeds = [0] * max_batch_size  # a sampled request's seed for keyed draws (sampling.position_key)
        self.prompt_lens = [0] * max_batch_size
        self.eos_token_ids: tuple[int, ...] = ()  # what min_new_tokens bans besides a request's stop_token_ids

    def admit(self, slots: Sequence[int], params: Sequence[SamplingParams],
              generators: Sequence[torch.Generator | None]) -> None:
        """Take each request's sampling settings into its slot (before its prefill)."""
        for slot, request_params, generator in zip(slots, params, generators):
            self.params[slot] = request_params
            self.generators[slot] = generator
            self.host_seq_lens[slot] = self.prompt_lens[slot] = 0  # nothing generated yet (banned_ids)
            self.temperature[slot] = request_params.temperature
            self.top_p[slot] = request_params.top_p
            self.top_k[slot] = request_params.top_k

    def commit_prefill(self, slots: Sequence[int], prompts: Sequence[Sequence[int]], slot_index: torch.Tensor,
                       prompt_lens: torch.Tensor, last_prompt_tokens: torch.Tensor, first_tokens: torch.Tensor) -> None:
        """After a prefill: m = prompt length + 1, x_{m-1} the first new token, x_{m-2} the prompt's last."""
        self.seq_lens[slot_index] = prompt_lens + 1
        self.last_tokens[slot_index] = first_tokens
        self.prev_tokens[slot_index] = last_prompt_tokens
        for slot, prompt, token in zip(slots, prompts, first_tokens.tolist()):
            self.host_seq_lens[slot] = len(prompt) + 1
            self.host_tokens[slot] = [*prompt, token]
            self.prompt_lens[slot] = len(prompt)

    def commit_round(self, slots: Sequence[int], new_tokens: Sequence[list[int]]) -> None:
        """The host mirror of a round's commit (the device side committed inside the round)."""
        for slot, tokens in zip(slots, new_tokens):
            self.host_seq_lens[slot] += len(tokens)
            self.host_tokens[slot].extend(tokens)

    def release(self, slot: int) -> None:
        self.params[slot] = None
        self.generators[slot] = None
        self.host_seq_lens[slot] = 0
        self.host_tokens[slot] = []

    def all_greedy(self, slots: Sequence[int]) -> bool:
        return all(self.params[s].greedy for s in slots)

    def banned_ids(self, slot: int) -> tuple[int, ...]:
        """The token ids a request may not draw yet: EOS (unless it ignores EOS) and its stop_token_ids while it
        has fewer than ``min_new_tokens`` tokens; () otherwise."""
        params = self.params[slot]
        if self.host_seq_lens[slot] - self.prompt_lens[slot] >= params.min_new_tokens:
            return ()
        return tuple(sorted({*params.stop_token_ids, *(() if params.ignore_eos else self.eos_token_ids)}))

    def plain_rows(self, slots: Sequence[int], drafting: bool = True) -> PlainRows | None:
        """The rows that take the target's own token this round, or None: requests with speculation off
        (``disable_speculative_decoding``, in a drafting round) and requests short of their ``min_new_tokens``
        (whose EOS and stop ids are masked, any round)."""
        rows, banned = [], []
        for row, slot in enumerate(slots):
            ids = self.banned_ids(slot)
            if ids or (drafting and self.params[slot].disable_speculative_decoding):
                if ids:
                    banned.append((len(rows), ids))
                rows.append(row)
        return PlainRows(rows, torch.tensor(rows, device=self.device), banned=tuple(banned)) if rows else None

    def plain_draws(self, plain: PlainRows, slots: Sequence[int], keyed_noise: KeyedNoise,
                    keyed_drafts: bool) -> PlainRows:
        """``plain`` with its sampled rows' draws, each as a tier-0 round of its own would make it: keyed by output
        position (deterministic drafts), else by a fresh key from the request's generator. After ``sampling``,
        which leaves these requests' generators alone."""
        members = [slots[row] for row in plain.rows]
        if all(self.params[s].greedy for s in members):
            return plain
        rows = [self._keyed_row(s, keyed_drafts) for s in members]
        index = torch.tensor(members, device=self.device)
        draws = RoundSampling(self.temperature[index], self.top_k[index], self.top_p[index],
                              any(self.params[s].needs_filter for s in members), draft_probs=None, uniforms=None,
                              residual_uniforms=None, keyed=KeyedDraws(rows, keyed_noise))
        return PlainRows(plain.rows, plain.index, draws, plain.banned)

    def sampling(self, tier, slots: Sequence[int], slot_index: torch.Tensor, keyed_noise: KeyedNoise,
                 keyed_drafts: bool) -> RoundSampling:
        """A sampled round's settings and draws [B]. ``keyed_drafts`` (deterministic drafts): draws keyed by
        output position; otherwise the generator noise the round reads, filled first. A tier-0 round verifies no
        draft, so its one token per request is a plain draw from the target's law: it is keyed too, by a key
        drawn from the request's own generator (one integer a round instead of a vocabulary of noise)."""
        batch = len(slots)
        keyed = None
        if keyed_drafts or not tier.speculative_num_steps:
            keyed = KeyedDraws([self._keyed_row(s, keyed_drafts) for s in slots], keyed_noise)
        else:
            self._draw_noise(tier, slots)
        return RoundSampling(self.temperature[slot_index], self.top_k[slot_index], self.top_p[slot_index],
                             any(self.params[s].needs_filter for s in slots),
                             draft_probs=tier.draft.draft_probs[:batch], uniforms=tier.verify.uniforms[:batch],
                             residual_uniforms=tier.verify.residual_uniforms[:batch], keyed=keyed)

    def _keyed_row(self, slot: int, by_position: bool) -> KeyedRow:
        """A request's keyed draws for this round: keyed by output position (``by_position``: deterministic
        drafts), else a tier-0 round's, keyed by a fresh key from its generator."""
        params = self.params[slot]
        if by_position:
            return KeyedRow(params.greedy, params.temperature, self.keyed_seeds[slot],
                            self.host_seq_lens[slot] - self.prompt_lens[slot])
        return KeyedRow(params.greedy, params.temperature, self._round_key(slot), 0)

    def _round_key(self, slot: int) -> int:
        """A fresh key from the request's generator (greedy rows draw nothing)."""
        if self.params[slot].greedy:
            return 0
        return draw_key(self.generators[slot])

    def _draw_noise(self, tier, slots: Sequence[int]) -> None:
        """Fill a drafting tier's random draws from each sampling request's own generator (ones for greedy rows):
        exactly the region the round reads, in this order from each request's generator."""
        batch = len(slots)
        draft, verify = tier.draft, tier.verify
        draft.draft_noise[:batch].fill_(1.0)
        verify.residual_uniforms[:batch].zero_()  # greedy rows: a one-hot law, any uniform draws its token
        for row, slot in enumerate(slots):
            if self.params[slot].greedy or self.params[slot].disable_speculative_decoding:
                continue  # no draws (a request with speculation off draws its tier-0 key in plain_draws)
            generator = self.generators[slot]
            exponential_(draft.draft_noise[row], generator)
            draw_uniform_(verify.uniforms[row], generator)
            draw_uniform_(verify.residual_uniforms[row:row + 1], generator)
