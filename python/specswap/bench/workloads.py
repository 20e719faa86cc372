"""The phased workloads: "high" acceptance (repetitive, code-like output, greedy) and "low" acceptance
(open prose, sampled at temperature 1.0), and the workloads built from them (low, high, transition).

Two prompt sets of the same kinds. ``tune``: the prompts the adaptive policy's constants were set on (the
phase-change bar, the requests a phase change waits for, the acceptance memory); figures on them flatter the
policy. ``report`` (the default): prompts written apart from that tuning, which published figures use."""

from __future__ import annotations

from dataclasses import dataclass

# Long runs of identical lines, as upstream's "high" phase: the continuation repeats what is already there,
# so drafts (and prompt lookup) are accepted almost every time. Lines that count up (squares[8], KEY_9) are
# not here: their numbers are new tokens, a moderate-acceptance workload (bench/bench_engine.py's "list").
TUNE_HIGH_PROMPTS = [
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
TUNE_LOW_PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a map in a bottle.",
    "Describe, in vivid detail, a market in a city that exists only at night.",
    "Compose a letter from a retired astronaut to her younger self.",
    "Tell a fable about a fox, a clock and a river that runs backwards.",
    "Invent a recipe for a dish served at a wedding of two dragons, and explain its history.",
    "Write a diary entry of a musician who hears a melody nobody else can.",
    "Imagine the first conversation between two strangers stuck in an elevator during a storm.",
    "Describe a garden that changes its shape every time someone lies in it.",
]

# The same two kinds, other content: no line of these occurs in the tuning set (tests/bench checks it).
REPORT_HIGH_PROMPTS = [
    "Repeat the next line exactly, one per line, 30 times.\n" + "print('good morning')\n" * 8,
    "y = 2\n" * 6,
    "Copy this list of colours again and again:\n" + "red, green, blue, yellow, purple\n" * 6,
    "    self.count = 0\n" * 3,
    "Say this sentence again, eight more times.\n"
    + "A journey of a thousand miles begins with a single step.\n" * 6,
    "ones = [" + "1, " * 12,
    "for item in items:\n" + "    result.append(item)\n    seen += 1\n" * 5,
    "d = {}\n" * 5,
]

REPORT_LOW_PROMPTS = [
    "Write a short story about a clockmaker who builds a clock that runs on music.",
    "Describe, in rich detail, a library whose books rewrite themselves at dawn.",
    "Compose a letter from a deep-sea diver to the whale she once followed.",
    "Tell a parable about a crow, a lantern and a mountain that walks.",
    "Invent a festival held on a moon with two suns, and explain its customs.",
    "Write the journal of a cartographer mapping an island that keeps moving.",
    "Imagine a dialogue between a retired pirate and a young beekeeper on a night train.",
    "Describe a city where every street sings when it rains.",
]

PROMPT_SETS = {
    "tune": {"high": (TUNE_HIGH_PROMPTS, 0.0), "low": (TUNE_LOW_PROMPTS, 1.0)},
    "report": {"high": (REPORT_HIGH_PROMPTS, 0.0), "low": (REPORT_LOW_PROMPTS, 1.0)},
}
DEFAULT_PROMPT_SET = "report"
WORKLOADS = {"low": ("low",), "high": ("high",), "transition": ("low", "high", "low", "high")}


@dataclass(frozen=True)
class Phase:
    name: str                  # "low" | "high"
    prompts: tuple[str, ...]   # one per request, in submission order
    temperature: float


def build_workload(name: str, requests_per_phase: int, low_temperature: float = 1.0,
                   prompt_set: str = DEFAULT_PROMPT_SET) -> list[Phase]:
    """The phases of ``name`` over ``prompt_set``'s prompts; phase i of a kind takes prompts from where the
    previous phase of that kind left off, so repeated phases do not replay identical requests."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; valid: {', '.join(WORKLOADS)}")
    if prompt_set not in PROMPT_SETS:
        raise ValueError(f"unknown prompt set {prompt_set!r}; valid: {', '.join(PROMPT_SETS)}")
    if requests_per_phase < 1:
        raise ValueError(f"requests per phase must be >= 1, got {requests_per_phase}")
    kinds = PROMPT_SETS[prompt_set]
    offsets = {"high": 0, "low": 0}
    phases = []
    for kind in WORKLOADS[name]:
        prompts, temperature = kinds[kind]
        if kind == "low":
            temperature = low_temperature
        start = offsets[kind]
        chosen = tuple(prompts[(start + i) % len(prompts)] for i in range(requests_per_phase))
        offsets[kind] = start + requests_per_phase
        phases.append(Phase(kind, chosen, temperature))
    return phases
