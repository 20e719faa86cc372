"""Sampling and lossless speculative acceptance.

Everything here is a small pure function over batched tensors. Greedy decoding
is not a separate code path: a row with temperature 0 gets a one-hot
distribution at the argmax, and speculative sampling over one-hot
distributions *is* greedy acceptance (accept while the draft equals the
target argmax, then emit the target argmax). Sampling draws come from
caller-owned noise buffers filled from each request's own generator, so the
functions never touch a global RNG and never sync with the host. Keyed draws
(position_key / KeyedNoise / sample_keyed / accept_keyed, for deterministic
drafts) take their noise from a counter-based hash of (request seed, output
position, vocabulary entry), so a position's token does not depend on how many
positions a round verified. ``accept`` is the one entry point a decode round
calls: greedy, keyed or full-law acceptance, by the ``Verifier`` it is given.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

__all__ = [
    "SamplingParams",
    "logits_to_probs",
    "sample_from_probs",
    "sample_from_cdf",
    "accept_draft_tokens",
    "accept_greedy",
    "position_key",
    "KeyedNoise",
    "sample_keyed",
    "accept_keyed",
    "accept_greedy_tree",
    "accept_keyed_tree", "accept_tree_law",
    "keyed_draws",
    "accept",
    "Verifier",
    "RoundSampling",
    "KeyedDraws",
    "KeyedRow",
]


TEMPERATURE_FLOOR = 1e-6                  # a temperature below it is greedy, as SGLang treats tiny temperatures
FLOAT32_MAX = 3.4028234663852886e38       # the sampler's tensors are float32: larger temperatures are taken as this
FLOAT32_TINY = 1.1754943508222875e-38     # and smaller top_p as this (the top token alone, as any tiny top_p keeps)
INT64_MAX = (1 << 63) - 1
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)  # what torch.Generator.manual_seed takes


def _int(value, name: str, low: int, high: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be {what}, got {value!r:.80}")
    return value


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling parameters, validated on construction; the sampler is total over what validates.

    temperature 0 means greedy (so does any temperature below ``TEMPERATURE_FLOOR``); top_k 0 means no top-k cut;
    top_p 1.0 means no nucleus cut. ``seed`` seeds the request's own generator (None: random).
    ``stop`` holds stop strings and ``stop_token_ids`` token ids that end the request as EOS does; generation also
    stops at the model's EOS unless ``ignore_eos`` (as vLLM's benchmarks use it: every request runs to
    ``max_new_tokens``, so throughput compares equal work). ``min_new_tokens``: EOS and ``stop_token_ids`` cannot
    be drawn (their logits are masked) and stop strings are not matched before this many tokens (vLLM's
    ``min_tokens``; the request decodes one token a round until then). ``disable_speculative_decoding`` (SGLang's
    name): this request verifies no drafts; it decodes one token a round inside a speculating batch, as tier 0
    would, and the policy does not count it.
    """

    max_new_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    disable_speculative_decoding: bool = False
    # SUFFIX: whether this request's output joins the global suffix tree other requests draft from (False keeps
    # it out: one client's text then never shapes another's drafts; its own tree still serves it)
    suffix_cache_output: bool = True
    min_new_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int):
            raise ValueError(f"max_new_tokens must be an int >= 1, got {self.max_new_tokens!r:.80}")
        if not 1 <= self.max_new_tokens <= INT64_MAX:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        temperature = self.temperature
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
                or not math.isfinite(_as_float(temperature)) or temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r:.80}")
        temperature = _as_float(temperature)
        object.__setattr__(self, "temperature", 0.0 if temperature < TEMPERATURE_FLOOR
                           else min(temperature, FLOAT32_MAX))
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)) \
                or not 0.0 < _as_float(self.top_p) <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r:.80}")
        object.__setattr__(self, "top_p", max(float(self.top_p), FLOAT32_TINY))
        _int(self.top_k, "top_k", 0, INT64_MAX, "an int >= 0 (0 = off) that fits in int64")
        if self.seed is not None:
            _int(self.seed, "seed", *SEED_RANGE, f"an int in {SEED_RANGE[0]}..{SEED_RANGE[1]} or None")
        stop = self.stop
        if isinstance(stop, str):
            stop = (stop,)
        stop = tuple(stop or ())
        for s in stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop must be non-empty strings, got {s!r}")
        object.__setattr__(self, "stop", stop)
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")
        if not isinstance(self.disable_speculative_decoding, bool):
            raise ValueError(f"disable_speculative_decoding must be a bool, got {self.disable_speculative_decoding!r}")
        if not isinstance(self.suffix_cache_output, bool):
            raise ValueError(f"suffix_cache_output must be a bool, got {self.suffix_cache_output!r}")
        _int(self.min_new_tokens, "min_new_tokens", 0, INT64_MAX, "an int >= 0")
        ids = self.stop_token_ids
        if not isinstance(ids, (list, tuple)):
            raise ValueError(f"stop_token_ids must be a list of token ids, got {ids!r:.80}")
        object.__setattr__(self, "stop_token_ids",
                           tuple(_int(t, "stop_token_ids", 0, INT64_MAX, "token ids >= 0") for t in ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def needs_filter(self) -> bool:
        return self.temperature > 0 and (self.top_k > 0 or self.top_p < 1.0)


def _as_float(value: int | float) -> float:
    """``value`` as a float; an int too large for one is infinite (then refused), never an OverflowError."""
    try:
        return float(value)
    except OverflowError:
        return math.inf


def logits_to_probs(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    apply_filters: bool = True,
) -> torch.Tensor:
    """Turn logits into the distribution each row samples from.

    logits: [N, V]; temperature, top_p: [N] float; top_k: [N] int64 (0 = off).
    Rows with temperature 0 get one-hot at the argmax. Top-k is applied before
    top-p (top-p renormalises what top-k kept), as transformers does.
    ``apply_filters`` False skips the sort when the caller knows no row filters.
    Returns probs: [N, V] float32.
    """
    greedy = temperature <= 0  # [N]
    scaled = logits.float() / torch.where(greedy, 1.0, temperature.float()).unsqueeze(-1)  # [N, V]
    if apply_filters:
        vocab_size = scaled.shape[-1]
        sorted_logits, sorted_index = scaled.sort(dim=-1, descending=True)  # [N, V]
        rank = torch.arange(vocab_size, device=logits.device)  # [V]
        keep_k = torch.where(top_k > 0, top_k, vocab_size).unsqueeze(-1)  # [N, 1]
        sorted_logits = sorted_logits.masked_fill(rank >= keep_k, -math.inf)
        sorted_probs = sorted_logits.softmax(dim=-1)  # [N, V]
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # [N, V]
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        sorted_logits = sorted_logits.masked_fill(mass_before >= top_p.float().unsqueeze(-1), -math.inf)
        scaled = torch.empty_like(scaled).scatter_(-1, sorted_index, sorted_logits)
    probs = scaled.softmax(dim=-1)  # [N, V]
    one_hot = torch.zeros_like(probs).scatter_(-1, argmax(logits).unsqueeze(-1), 1.0)
    return torch.where(greedy.unsqueeze(-1), one_hot, probs)


def argmax(x: torch.Tensor) -> torch.Tensor:
    """Index of the largest value along the last dim, the first one on ties, NaN counting as largest: exactly
    ``x.argmax(-1)``, but through ``max``, whose CPU kernel is the cheaper one in bf16: the verify of every
    round and every baseline step pays it. A contiguous fp32 CPU tensor takes ``torch.ops.specswap.argmax_rows``
    (csrc/cpu_ops/sampling_scans.cpp), the same indices in one pass per row."""
    rows = _extension_op("argmax_rows")
    if (rows is not None and x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() >= 1
            and x.shape[-1] > 0 and x.is_contiguous()):
        return rows(x)
    return x.max(dim=-1).indices


_EXTENSION_OPS: dict[str, Callable | None] = {}


def _extension_op(name: str) -> Callable | None:
    """torch.ops.specswap.<name> (csrc/cpu_ops/sampling_scans.cpp), or None without the extension."""
    if name not in _EXTENSION_OPS:
        try:
            from . import _core  # noqa: F401, PLC0415  (registers torch.ops.specswap)
            _EXTENSION_OPS[name] = getattr(torch.ops.specswap, name)
        except (ImportError, AttributeError, RuntimeError):
            _EXTENSION_OPS[name] = None
    return _EXTENSION_OPS[name]


# Draws from a request's own generator: these three are the only code that draws from one
# (tests/worker/test_request_draws.py checks). A request's generator lives on its engine's device, and torch
# refuses a draw that puts a CUDA generator's numbers into a CPU tensor, so each draw is made on the
# generator's device.

def _check_generator_device(out: torch.Tensor, generator: torch.Generator | None) -> None:
    if generator is not None and generator.device.type != out.device.type:
        raise ValueError(f"a draw into a {out.device} tensor from a {generator.device} generator; a request's draws "
                         f"are made on its generator's device")


def draw_key(generator: torch.Generator | None) -> int:
    """A fresh 62-bit key (a keyed draw's seed) from ``generator``, drawn on the generator's device (None: torch's
    global CPU generator)."""
    device = generator.device if generator is not None else torch.device("cpu")
    return int(torch.randint(2 ** 62, (), generator=generator, device=device))


def draw_uniform_(out: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Fill ``out`` with U[0, 1) draws in place from ``generator`` (on ``out``'s device, which must be the
    generator's)."""
    _check_generator_device(out, generator)
    return out.uniform_(generator=generator)


def exponential_(noise: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Fill ``noise`` with Exp(1) draws in place, as -log(U) with U uniform in [0, 1): the law of
    ``Tensor.exponential_`` for one pass of uniforms and a log, cheaper than torch's own on CPU, which a sampled
    round pays per request. U = 0 gives +inf: that entry can then never be drawn (probability 2^-24 per entry),
    never the reverse."""
    return draw_uniform_(noise, generator).log_().neg_()


def sample_from_probs(probs: torch.Tensor, exponential_noise: torch.Tensor) -> torch.Tensor:
    """Draw one token per row: argmax(p / E) with E ~ Exp(1) is an exact categorical draw.

    probs: [..., V]; exponential_noise: [..., V], positive (all ones for greedy
    rows: a one-hot row then returns its hot index). Returns [...] int64.
    """
    return argmax(probs / exponential_noise)


def sample_from_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Draw one token per row by inverting its cumulative law at one uniform: an exact categorical draw (to
    fp32 rounding of the running sum, as torch.multinomial) for one uniform instead of a noise per entry (a
    running sum is one cheap pass; a vocabulary of Exp(1) noise is a log per entry).

    probs: [B, V] non-negative, each row with positive mass (unnormalised is fine); uniforms: [B] in [0, 1).
    An entry of zero probability is never drawn; a one-hot row returns its hot index for any uniform.
    Returns [B] int64.
    """
    cdf = probs.float().cumsum(dim=-1)                                   # [B, V]
    total = cdf[:, -1:].contiguous()                                     # [B, 1]
    drawn = torch.searchsorted(cdf, uniforms.unsqueeze(-1) * total, right=True)
    # u * total rounded up to the total would land past the end: the last entry with mass instead
    last = torch.searchsorted(cdf, total, right=False)
    return torch.minimum(drawn, last).squeeze(-1)


_MASK64 = (1 << 64) - 1
# SplitMix64 (Steele et al., "Fast splittable pseudorandom number generators", 2014): output number n is
# mix((n * GOLDEN) mod 2^64); GOLDEN is odd and mix is a bijection, so distinct counters give distinct outputs
_GOLDEN = 0x9E3779B97F4A7C15
_MIX_STEPS = ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB))
KEYED_VOCAB_LIMIT = 1 << 24  # counters one position owns: vocabularies up to 2^24 entries


def _signed64(value: int) -> int:
    """A 64-bit word as the int64 that holds the same bits (torch's integer tensors are signed)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _mix64(z: int) -> int:
    """SplitMix64's finaliser on a 64-bit word (a bijection)."""
    for shift, multiplier in _MIX_STEPS:
        z = ((z ^ (z >> shift)) * multiplier) & _MASK64
    return z ^ (z >> 31)


def position_key(seed: int, position: int) -> int:
    """The first counter of a request's keyed draw at one output position: entry v of the vocabulary reads
    SplitMix64 output number key + v (KeyedNoise). The seed (all 64 bits; generate seeds prompt i with seed + i)
    is mixed into a random-looking start and each position owns the next 2^24 counters, so within a request no
    two (position, entry) pairs ever read the same output, and two requests share outputs only when their mixed
    seeds land within 2^24 x (positions) of each other: about 2^-22 for two requests of 2^17 positions."""
    if position < 0:
        raise ValueError(f"position must be >= 0, got {position}")
    start = _mix64(((seed + 1) * _GOLDEN) & _MASK64)
    return (start + position * KEYED_VOCAB_LIMIT) & _MASK64


class KeyedNoise:
    """Scratch for keyed draws over a ``vocab_size``-entry vocabulary: counter-based noise, no generator state.

    ``uniform(key)`` gives entry v the top 24 bits of SplitMix64 output number key + v, as a float in [0, 1) on
    the 2^-24 grid that ``Tensor.uniform_`` uses. Every bit of the 64-bit key counts (a torch CPU generator's
    ``manual_seed`` keeps only the low 32 bits: seeds 2^32 apart give the same stream), the draws are the same
    bits on every device, and the work is in-place integer ops on buffers made here (int64 multiplies wrap as
    uint64 ones would), so it costs what ``uniform_``'s generator costs.
    """

    def __init__(self, vocab_size: int, device: torch.device | str | None = None):
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or not 1 <= vocab_size <= KEYED_VOCAB_LIMIT:
            raise ValueError(f"vocab_size must be an int in 1..{KEYED_VOCAB_LIMIT} for keyed draws, got {vocab_size!r}")
        self._steps = torch.arange(vocab_size, dtype=torch.int64, device=device).mul_(_signed64(_GOLDEN))  # v * G
        self._word = torch.empty(vocab_size, dtype=torch.int64, device=device)
        self._shifted = torch.empty(vocab_size, dtype=torch.int64, device=device)
        self.noise = torch.empty(vocab_size, dtype=torch.float32, device=device)

    def uniform(self, key: int) -> torch.Tensor:
        """Fill and return ``self.noise`` [V] with the key's uniforms (overwritten by the next call)."""
        word, shifted = self._word, self._shifted
        torch.add(self._steps, _signed64(((key & _MASK64) * _GOLDEN) & _MASK64), out=word)  # (key + v) * G
        for shift, multiplier in _MIX_STEPS:
            # z ^= z >> shift as a logical shift (the arithmetic one's sign copies masked off), then z *= m
            torch.bitwise_right_shift(word, shift, out=shifted).bitwise_and_((1 << (64 - shift)) - 1)
            word.bitwise_xor_(shifted).mul_(_signed64(multiplier))
        # the top 24 bits; SplitMix64's last step (z ^= z >> 31) leaves them as they are
        word.bitwise_right_shift_(40).bitwise_and_((1 << 24) - 1)
        return torch.mul(word, 2.0 ** -24, out=self.noise)

    def uniform_at(self, key: int, entries: torch.Tensor) -> torch.Tensor:
        """``uniform(key)[entries]`` with the same integer and float operations, computed for those entries only."""
        word = entries.to(torch.int64).mul(_signed64(_GOLDEN)).add_(_signed64(((key & _MASK64) * _GOLDEN) & _MASK64))
        for shift, multiplier in _MIX_STEPS:
            word.bitwise_xor_(torch.bitwise_right_shift(word, shift).bitwise_and_((1 << (64 - shift)) - 1))
            word.mul_(_signed64(multiplier))
        word.bitwise_right_shift_(40).bitwise_and_((1 << 24) - 1)
        return word.mul(2.0 ** -24).to(torch.float32)


# The largest Gumbel noise a keyed draw can add: -log(-log(u)) for u = 1 - 2^-24, the largest uniform on the grid,
# is 16.64; a little more covers the rounding of the sums compared against it
_KEYED_NOISE_BOUND = 17.0


def _gumbel_(uniforms: torch.Tensor) -> torch.Tensor:
    """-log E with E = -log U, in place: the Gumbel noise of the uniforms (the same float operations everywhere)."""
    return uniforms.log_().neg_().log_().neg_()


def _row_scans(row: torch.Tensor) -> tuple | None:
    """(first_argmax, indices_at_least) of specswap._C (csrc/cpu_ops/sampling_scans.cpp): the same results as
    ``row.max(-1).indices`` and ``torch.nonzero(row >= threshold)``, in one pass each, for a contiguous fp32 CPU
    row; None for any other row or without the extension."""
    scans = (_extension_op("first_argmax"), _extension_op("indices_at_least"))
    usable = row.device.type == "cpu" and row.dtype == torch.float32 and row.dim() == 1 and row.is_contiguous()
    return scans if usable and None not in scans else None


def sample_keyed(log_weights: torch.Tensor, key: int, keyed: KeyedNoise) -> int:
    """One draw from softmax(log_weights) by the Gumbel-max rule, its noise a function of ``key`` alone:
    argmax(log w_v - log E_v), E_v = -log U_v with U = keyed.uniform(key) (the exponential race of
    sample_from_probs, in log space). Logits that differ a little move the draw only when the two best
    perturbed scores are that close: about the total-variation distance of the two laws, not more.

    log_weights: [V] float32, unnormalised (-inf: never drawn); ``keyed``: its scratch, overwritten.
    """
    # Only an entry within the noise's range of one perturbed score can win: every other one stays below it
    # whatever its own noise. So the noise is drawn for those entries alone (the same bits uniform(key) gives
    # them), and the draw, first index on a tie, is the one the whole vocabulary's scores give.
    scans = _row_scans(log_weights)
    top = scans[0](log_weights) if scans else int(argmax(log_weights))
    best = float(_gumbel_(keyed.uniform_at(key, torch.tensor([top], device=log_weights.device)))[0])
    threshold = float(log_weights[top]) + best - _KEYED_NOISE_BOUND
    entries = None
    if math.isfinite(threshold):
        # ascending: ties go to the first
        entries = scans[1](log_weights, threshold) if scans else torch.nonzero(log_weights >= threshold).squeeze(-1)
    if entries is None or 8 * entries.numel() > log_weights.numel():
        # a flat law (or no finite score): most entries can win, and the whole vocabulary's noise is cheaper
        scores = _gumbel_(keyed.uniform(key)).add_(log_weights)  # log w - log E
        return int(argmax(scores))
    scores = _gumbel_(keyed.uniform_at(key, entries)).add_(log_weights[entries])
    return int(entries[argmax(scores)])


def accept_keyed(draw: Callable[[int], int], draft_tokens: Sequence[int]) -> tuple[int, int]:
    """Lossless acceptance of deterministic drafts (prompt lookup) against the target's own draws.

    ``draw(i)``: the target's draw at verified position i (an exact sample of p_i, keyed by the output
    position). Drafts are accepted while they equal the draws; the draw where they stop (or after the last
    draft) is emitted. For a one-hot draft this accepts d with probability p(d) and otherwise emits p without
    d, the law of accept_draft_tokens; but the token emitted at output position n is always the draw keyed by
    n, so a request's text does not depend on its drafts, its tier or its batch. Draws past the first mismatch
    are never made. Returns (accepted drafts, emitted token).
    """
    for index, draft in enumerate(draft_tokens):
        token = draw(index)
        if token != draft:
            return index, token
    return len(draft_tokens), draw(len(draft_tokens))


def accept_draft_tokens(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    uniforms: torch.Tensor,
    residual_uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lossless speculative sampling for a top-1 chain (Leviathan et al. / Chen et al.).

    target_probs: [B, k+1, V] target distributions after [last, d1..dk];
    draft_probs: [B, k, V] the distributions d1..dk were drawn from, in target
    vocabulary (zero outside a reduced draft vocabulary); draft_tokens: [B, k];
    uniforms: [B, k] in [0, 1); residual_uniforms: [B] in [0, 1).
    Draft i is accepted with probability min(1, p/q); the first rejection
    emits a draw from normalised max(0, p - q); when all k are accepted the
    bonus token is drawn from p at position k. Every emitted token is then
    distributed exactly as the target's.
    Returns (accept_lengths [B] int64, accepted draft tokens, bonus excluded;
    next_tokens [B] int64, the correction or bonus token).
    """
    batch_size, num_draft, _ = draft_probs.shape
    rows = torch.arange(batch_size, device=target_probs.device)
    if num_draft == 0:
        accept_lengths = torch.zeros(batch_size, dtype=torch.long, device=target_probs.device)
        return accept_lengths, sample_from_cdf(target_probs[:, 0], residual_uniforms)
    index = draft_tokens.unsqueeze(-1)  # [B, k, 1]
    p_of_draft = target_probs[:, :num_draft].gather(-1, index).squeeze(-1)  # [B, k]
    q_of_draft = draft_probs.gather(-1, index).squeeze(-1)  # [B, k]
    accepted = uniforms * q_of_draft < p_of_draft  # u < p / q without dividing by q
    accept_lengths = accepted.long().cumprod(dim=-1).sum(dim=-1)  # [B]
    p_at = target_probs[rows, accept_lengths]  # [B, V]
    q_at = draft_probs[rows, accept_lengths.clamp(max=num_draft - 1)]  # [B, V]
    return accept_lengths, _draw_after_stop(p_at, q_at, accept_lengths == num_draft, residual_uniforms)


def _draw_after_stop(p_at: torch.Tensor, q_at: torch.Tensor, all_accepted: torch.Tensor,
                     residual_uniforms: torch.Tensor) -> torch.Tensor:
    """The token emitted where a chain stops: a bonus draw from p when every draft was accepted, else a draw
    from normalised max(0, p - q). p_at, q_at: [B, V]; all_accepted: [B] bool. Returns [B] int64."""
    residual = torch.where(all_accepted.unsqueeze(-1), p_at, (p_at - q_at).clamp(min=0))  # [B, V]
    # p == q exactly leaves no residual mass; p itself is then the right law.
    residual = torch.where(residual.sum(dim=-1, keepdim=True) > 0, residual, p_at)
    return sample_from_cdf(residual, residual_uniforms)


def accept_from_logits(
    target_logits: torch.Tensor,
    temperature: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    uniforms: torch.Tensor,
    residual_uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``accept_draft_tokens`` for rows without top-k/top-p, straight from the target's logits.

    The same test and the same draws (u < p/q, then the residual's law inverted at one uniform), with p = softmax(logits / T) (one-hot
    at the argmax for T = 0), but the target's law is only built where it is read: p of each draft token through
    a log-sum-exp per position, and one full row at the position each request stops. On a 262k vocabulary this
    replaces [B, k+1, V] float tensors by [B, V].

    target_logits: [B, k+1, V]; temperature: [B] (<= 0: greedy row); draft_tokens: [B, k]; draft_probs:
    [B, k, V] laws the drafts were drawn from; uniforms: [B, k]; residual_uniforms: [B] in [0, 1).
    Returns (accept_lengths [B], next_tokens [B]).

    On the CPU with fp32 logits and draft laws this is ``torch.ops.specswap.accept_chain``
    (csrc/cpu_ops/sampling_scans.cpp: a position's normaliser only where the chain gets to, the stop row's
    residual and its running sum in one pass each, where torch makes about eleven),
    elsewhere ``accept_from_logits_torch``; their decisions and draws agree but where rounding puts a uniform
    on a boundary.
    """
    chain = _extension_op("accept_chain")
    if (chain is not None and target_logits.device.type == "cpu" and target_logits.dtype == torch.float32
            and draft_probs.dtype == torch.float32):
        return chain(target_logits.contiguous(), temperature.float().contiguous(), draft_tokens.contiguous(),
                     draft_probs.contiguous(), uniforms.float().contiguous(), residual_uniforms.float().contiguous())
    return accept_from_logits_torch(target_logits, temperature, draft_tokens, draft_probs, uniforms,
                                    residual_uniforms)


def accept_from_logits_torch(
    target_logits: torch.Tensor,
    temperature: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    uniforms: torch.Tensor,
    residual_uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``accept_from_logits`` in torch's operators, on any device (the arguments and result are its)."""
    batch_size, positions, vocab_size = target_logits.shape
    num_draft = positions - 1
    rows = torch.arange(batch_size, device=target_logits.device)
    greedy = (temperature <= 0).unsqueeze(-1)                                                 # [B, 1]
    scaled = target_logits.float() / torch.where(greedy, 1.0, temperature.float().unsqueeze(-1)).unsqueeze(-1)
    log_norm = scaled.logsumexp(dim=-1)                                                       # [B, k+1]
    top = argmax(target_logits) if bool(greedy.any()) else None                               # [B, k+1]
    if num_draft:
        index = draft_tokens.unsqueeze(-1)                                                    # [B, k, 1]
        p_of_draft = (scaled[:, :num_draft].gather(-1, index).squeeze(-1) - log_norm[:, :num_draft]).exp()
        if top is not None:
            p_of_draft = torch.where(greedy, (draft_tokens == top[:, :num_draft]).float(), p_of_draft)
        q_of_draft = draft_probs.gather(-1, index).squeeze(-1)                                # [B, k]
        accepted = uniforms * q_of_draft < p_of_draft
        accept_lengths = accepted.long().cumprod(dim=-1).sum(dim=-1)                          # [B]
    else:
        accept_lengths = torch.zeros(batch_size, dtype=torch.long, device=target_logits.device)
    p_at = (scaled[rows, accept_lengths] - log_norm[rows, accept_lengths].unsqueeze(-1)).exp()  # [B, V]
    if top is not None:
        one_hot = torch.zeros_like(p_at).scatter_(-1, top[rows, accept_lengths].unsqueeze(-1), 1.0)
        p_at = torch.where(greedy, one_hot, p_at)
    if not num_draft:
        return accept_lengths, sample_from_cdf(p_at, residual_uniforms)
    q_at = draft_probs[rows, accept_lengths.clamp(max=num_draft - 1)]                         # [B, V]
    return accept_lengths, _draw_after_stop(p_at, q_at, accept_lengths == num_draft, residual_uniforms)


def accept_greedy(target_logits: torch.Tensor, draft_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The all-greedy batch shortcut of accept_draft_tokens (same result, no distributions built).

    target_logits: [B, k+1, V]; draft_tokens: [B, k]. Accept the longest prefix equal to the target argmax,
    then emit the target argmax. Returns (accept_lengths [B], next_tokens [B]).
    """
    num_draft = draft_tokens.shape[1]
    target_argmax = argmax(target_logits)  # [B, k+1]
    matches = draft_tokens == target_argmax[:, :num_draft]  # [B, k]
    accept_lengths = matches.long().cumprod(dim=-1).sum(dim=-1)  # [B]
    return accept_lengths, target_argmax.gather(1, accept_lengths.unsqueeze(-1)).squeeze(-1)


def accept_greedy_tree(target_logits: torch.Tensor, node_tokens: torch.Tensor, parents: torch.Tensor,
                       ancestors: torch.Tensor, depth_rank: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy acceptance over a draft tree: the deepest node whose every non-root ancestor (itself included)
    is the target's argmax after its parent, then the target's argmax after that node.

    target_logits: [B, T, V] after each node; node_tokens: [B, T] (node 0, the root, is x_{m-1});
    parents: [T] or [B, T] (the root's own index for the root); ancestors: [T, T] or [B, T, T] float, 1 where the
    column is a non-root ancestor-or-self of the row; depth_rank: [T] or [B, T] distinct ranks ordering nodes
    by depth. A chain gives accept_greedy's result. No host sync. Returns (last accepted node [B], next_tokens
    [B]).
    """
    target_argmax = argmax(target_logits)                                   # [B, T]
    batch, nodes = target_argmax.shape
    expected = target_argmax.gather(1, parents.expand(batch, nodes))        # [B, T] the argmax after the parent
    misses = (node_tokens != expected).to(ancestors.dtype)                  # [B, T]
    ancestors = ancestors.expand(batch, nodes, nodes)
    accepted = torch.bmm(ancestors, misses.unsqueeze(-1)).squeeze(-1) == 0  # [B, T]; the root always
    last = (accepted * depth_rank).argmax(dim=-1)                           # [B]
    return last, target_argmax.gather(1, last.unsqueeze(-1)).squeeze(-1)


def accept_keyed_tree(draw: Callable[[int], int], node_tokens: Sequence[int],
                      children: Sequence[Sequence[int]]) -> tuple[list[int], int]:
    """accept_keyed over a draft tree: from the root, follow the child whose token is the target's draw after
    the current node (``draw(node)``, keyed by that node's output position) until none is; that draw is
    emitted. Returns (the accepted path of node indices, root first; the emitted token)."""
    path = [0]
    while True:
        token = draw(path[-1])
        child = next((c for c in children[path[-1]] if node_tokens[c] == token), None)
        if child is None:
            return path, token
        path.append(child)


def accept_tree_law(target_law: Callable[[int], torch.Tensor], node_tokens: Sequence[int],
                    children: Sequence[Sequence[int]], child_law: Callable[[int], torch.Tensor | None],
                    uniforms: Sequence[float], residual_uniform: float) -> tuple[list[int], int]:
    """Multi-draft speculative sampling down a draft tree (SpecInfer's and EAGLE-2's recursive rejection):
    at the current node with target law p, try each child c in turn: accept it with probability
    min(1, p(c) / q_c(c)), q_c the law its token was drawn from; on rejection p becomes the normalised residual
    max(p - q_c, 0) and the next sibling is tried. An accepted child becomes the current node; when every
    child is rejected (or the node is a leaf) the emitted token is drawn from p. The emitted path follows the
    target's law exactly whenever each child is drawn from its q_c given the siblings tried before it (children
    drawn independently from one law, or a point mass: ``child_law(c)`` None, a top-k child, where the rule
    accepts with p(c) and removes c from p).

    ``target_law(node)``: the target's law [V] after that node; ``uniforms``: one per child tried (the tries
    along a path never exceed the nodes); ``residual_uniform``: the final draw. Returns (the accepted path of
    node indices, root first; the emitted token).
    """
    path, tries = [0], 0
    while True:
        law = target_law(path[-1]).double()
        for child in children[path[-1]]:
            token, draft = node_tokens[child], child_law(child)
            ratio = law[token] if draft is None else law[token] / draft[token].double()
            accepted = uniforms[tries] < ratio
            tries += 1
            if accepted:
                path.append(child)
                break
            law = _tree_residual(law, token, draft)
        else:
            uniform = torch.tensor([residual_uniform], dtype=torch.float32, device=law.device)
            return path, int(sample_from_cdf(law.unsqueeze(0), uniform)[0])


def _tree_residual(law: torch.Tensor, token: int, draft: torch.Tensor | None) -> torch.Tensor:
    """max(p - q, 0), normalised (q a point mass at ``token`` when None); p itself if nothing is left (p <= q
    everywhere: then the child was accepted with probability one)."""
    if draft is None:
        residual = law.clone()
        residual[token] = 0.0
    else:
        residual = (law - draft.double()).clamp_min(0.0)
    total = residual.sum()
    return residual / total if total > 0 else law


# ---- the one acceptance entry point of a decode round ---------------------------------------------------


class KeyedRow(NamedTuple):
    """One request's keyed draws: greedy rows take the argmax; others draw output position start + i."""

    greedy: bool
    temperature: float
    seed: int
    start: int  # output tokens before this round's first verified position


@dataclass
class KeyedDraws:
    """A round's keyed draws (deterministic drafts: NGRAM, target-only): a row per request, the noise scratch."""

    rows: list[KeyedRow]
    noise: KeyedNoise


@dataclass
class RoundSampling:
    """What a sampled (not all-greedy) round's acceptance reads, per row [B]: the sampling settings, and either
    the generator draws (draft laws, uniforms, residual noise) or keyed draws."""

    temperature: torch.Tensor       # [B]
    top_k: torch.Tensor             # [B]
    top_p: torch.Tensor             # [B]
    apply_filters: bool             # any row has top-k / top-p
    draft_probs: torch.Tensor       # [B, k, V] the laws the drafts were drawn from (written while drafting)
    uniforms: torch.Tensor          # [B, k]
    residual_uniforms: torch.Tensor  # [B] in [0, 1): the draw where the chain stops
    keyed: KeyedDraws | None = None


@dataclass
class PlainRows:
    """The requests of a drafting round that verify no draft (``disable_speculative_decoding``): each takes the
    target's token after x_{m-1} (verified position 0), drawn as a tier-0 round draws it: the argmax for greedy
    rows, else keyed draws (``draws``, built by the slot table from each request's own keys)."""

    rows: list[int]                  # their rows in the batch
    index: torch.Tensor              # [P] the same rows, on the device
    draws: RoundSampling | None = None  # their settings [P] and keyed draws; None: all greedy
    banned: tuple[tuple[int, tuple[int, ...]], ...] = ()  # (i, ids): ids the i-th of them may not draw (min tokens)


def take_plain_tokens(plain: PlainRows, logits: torch.Tensor, accept_lengths: torch.Tensor,
                      next_tokens: torch.Tensor) -> None:
    """Set a = 0 and the target's own token at verified position 0 for ``plain``'s rows, in place.
    logits: [B, T, V]; accept_lengths, next_tokens: [B]."""
    first = logits[plain.index, :1]                                                   # [P, 1, V] (a copy)
    for i, ids in plain.banned:  # a request short of its min_new_tokens: EOS and its stop ids have no mass
        first[i, 0, list(ids)] = -math.inf
    if plain.draws is None:
        tokens = argmax(first[:, 0])                                                  # [P]
    else:
        tokens = torch.tensor([draw(0) for draw in keyed_draws(first, plain.draws)], device=logits.device)
    accept_lengths[plain.index] = 0
    next_tokens[plain.index] = tokens


@dataclass(frozen=True)
class Verifier:
    """The acceptance rules a round verifies with; the defaults are the lossless ones. A test injects a biased
    rule here to show the law tests catch it. ``from_logits``: ``full_law``'s shortcut for rounds without
    top-k/top-p, straight from the logits (None: always build the target law and call ``full_law``)."""

    full_law: Callable = accept_draft_tokens
    from_logits: Callable | None = accept_from_logits
    keyed: Callable = accept_keyed
    keyed_tree: Callable = accept_keyed_tree
    tree_law: Callable = accept_tree_law


LOSSLESS = Verifier()


def accept(verifier: Verifier, target_logits: torch.Tensor, draft_tokens: torch.Tensor,
           sampling: RoundSampling | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Accept a verified chain: greedy for an all-greedy round (``sampling`` None: argmax in, argmax out), keyed
    draws for deterministic drafts, else the full law (from the logits where no row filters).

    target_logits: [B, k+1, V]; draft_tokens: [B, k]. Returns (accept_lengths [B], next_tokens [B]).
    """
    if sampling is None:
        return accept_greedy(target_logits, draft_tokens)
    if sampling.keyed is not None:
        return _accept_keyed_rows(verifier.keyed, target_logits, draft_tokens, sampling)
    if not sampling.apply_filters and verifier.from_logits is not None:
        return verifier.from_logits(target_logits, sampling.temperature, draft_tokens, sampling.draft_probs,
                                    sampling.uniforms, sampling.residual_uniforms)
    batch, positions, _ = target_logits.shape
    target_probs = logits_to_probs(
        target_logits.reshape(batch * positions, -1), sampling.temperature.repeat_interleave(positions),
        sampling.top_k.repeat_interleave(positions), sampling.top_p.repeat_interleave(positions),
        sampling.apply_filters,
    ).view(batch, positions, -1)                                                      # [B, k+1, V]
    return verifier.full_law(target_probs, sampling.draft_probs, draft_tokens, sampling.uniforms,
                             sampling.residual_uniforms)


def _accept_keyed_rows(accept_row: Callable, logits: torch.Tensor, draft_tokens: torch.Tensor,
                       sampling: RoundSampling) -> tuple[torch.Tensor, torch.Tensor]:
    """``accept_row`` (accept_keyed) per request on logits [B, k+1, V]: draws keyed by output position for
    sampled rows, the argmax for greedy ones. Host-side per request (a sampled round syncs anyway)."""
    drafts = draft_tokens.tolist()
    accepted, tokens = [], []
    for row, draw in enumerate(keyed_draws(logits, sampling)):
        row_accepted, token = accept_row(draw, drafts[row])
        accepted.append(row_accepted)
        tokens.append(token)
    return torch.tensor(accepted, device=logits.device), torch.tensor(tokens, device=logits.device)


def keyed_draws(logits: torch.Tensor, sampling: RoundSampling,
                depths: Sequence[int] | Sequence[Sequence[int]] | None = None) -> list[Callable[[int], int]]:
    """One ``draw(i)`` per request over logits [B, T, V]: the target's token after verified token i, the argmax
    for greedy rows, else keyed by output position start + depths[i] (a chain's depths are 0..T-1; per row:
    a list of lists)."""
    temperature, top_k, top_p, apply_filters = sampling.temperature, sampling.top_k, sampling.top_p, \
        sampling.apply_filters
    noise = sampling.keyed.noise
    draws = []
    per_row = depths is not None and len(depths) > 0 and isinstance(depths[0], (list, tuple))
    for row, keyed in enumerate(sampling.keyed.rows):
        if keyed.greedy:
            draws.append(argmax(logits[row]).tolist().__getitem__)
            continue

        def draw(i: int, row: int = row, keyed: KeyedRow = keyed,
                 row_depths: Sequence[int] | None = depths[row] if per_row else depths) -> int:
            if apply_filters:
                log_weights = logits_to_probs(logits[row, i:i + 1], temperature[row:row + 1],
                                              top_k[row:row + 1], top_p[row:row + 1], True)[0].log()
            else:
                log_weights = logits[row, i].float() / keyed.temperature
            depth = i if row_depths is None else row_depths[i]
            return sample_keyed(log_weights, position_key(keyed.seed, keyed.start + depth), noise)
        draws.append(draw)
    return draws
