"""The phased workloads: "high" acceptance (repetitive, code-like output, greedy) and "low" acceptance
(open prose, sampled at temperature 1.0), and the workloads built from them (low, high, transition)."""

from __future__ import annotations

from dataclasses import dataclass

# Long runs of identical lines, as upstream's "high" phase: the continuation repeats what is already there,
# so drafts (and prompt lookup) are accepted almost every time. Lines that count up (squares[8], KEY_9) are
# not here: their numbers are new tokens, a moderate-acceptance workload (bench/bench_engine.py's "list").
HIGH_PROMPTS = [
    "Repeat the following line exactly, one per line, 40 times.\n" + "print('hello world')\n" * 8,
    "x = 1\n" * 6,
    "Copy this list of names again and again:\n" + "alpha, beta, gamma, delta, epsilon\n" * 6,
    "    self.a = a\n" * 3,
    "Write the same sentence ten more times.\n" + "The quick brown fox jumps over the lazy dog.\n" * 6,
    "zeros = [" + "0, " * 12,
    "for row in rows:\n" + "    total += row.value\n    count += 1\n" * 5,
    "a = []\n" * 5,
]

# Open-ended prose: every continuation is new text, so drafts are rarely right.
LOW_PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a map in a bottle.",
    "Describe, in vivid detail, a market in a city that exists only at night.",
    "Compose a letter from a retired astronaut to her younger self.",
    "Tell a fable about a fox, a clock and a river that runs backwards.",
    "Invent a recipe for a dish served at a wedding of two dragons, and explain its history.",
    "Write a diary entry of a musician who hears a melody nobody else can.",
    "Imagine the first conversation between two strangers stuck in an elevator during a storm.",
    "Describe a garden that changes its shape every time someone lies in it.",
]

PHASE_KINDS = {"high": (HIGH_PROMPTS, 0.0), "low": (LOW_PROMPTS, 1.0)}
WORKLOADS = {"low": ("low",), "high": ("high",), "transition": ("low", "high", "low", "high")}


@dataclass(frozen=True)
class Phase:
    name: str                  # "low" | "high"
    prompts: tuple[str, ...]   # one per request, in submission order
    temperature: float


def build_workload(name: str, requests_per_phase: int, low_temperature: float = 1.0) -> list[Phase]:
    """The phases of ``name``; phase i of a kind takes prompts from where the previous phase of that kind left
    off, so repeated phases do not replay identical requests."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; valid: {', '.join(WORKLOADS)}")
    if requests_per_phase < 1:
        raise ValueError(f"requests per phase must be >= 1, got {requests_per_phase}")
    offsets = {"high": 0, "low": 0}
    phases = []
    for kind in WORKLOADS[name]:
        prompts, temperature = PHASE_KINDS[kind]
        if kind == "low":
            temperature = low_temperature
        start = offsets[kind]
        chosen = tuple(prompts[(start + i) % len(prompts)] for i in range(requests_per_phase))
        offsets[kind] = start + requests_per_phase
        phases.append(Phase(kind, chosen, temperature))
    return phases
