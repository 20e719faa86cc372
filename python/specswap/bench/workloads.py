"""The phased workloads: "high" acceptance (repetitive, code-like output, greedy) and "low" acceptance
(open prose, sampled at temperature 1.0), and the workloads built from them (low, high, transition).

Three kinds where drafts from other requests' outputs matter (SUFFIX's global tree): "resample" (each prompt
sampled RESAMPLES times in a row at temperature 0.7, other seeds: best-of-n, self-consistency), "template" (one
instruction over many inputs, JSON out, greedy) and "multiturn" (a first turn, then a second request that holds
it and its answer and asks to rewrite or extend the answer, greedy). Workloads "resample", "template",
"multiturn", and "mixed" (resample, high, template, low).

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

# resample: short tasks sampled several times (best-of-n); code and worked arithmetic
TUNE_RESAMPLE_PROMPTS = [
    "def is_prime(n):\n    ",
    "Q: A train travels 60 km in 45 minutes. What is its speed in km/h? Think step by step.\nA:",
    "def reverse_words(sentence):\n    ",
    "Q: Tom has 3 boxes of 12 pencils and gives away 7. How many pencils are left? Think step by step.\nA:",
]
REPORT_RESAMPLE_PROMPTS = [
    "def count_vowels(text):\n    ",
    "Question: Pens cost 2 dollars for 3. What do 18 pens cost? Work it out step by step.\nAnswer:",
    "def flatten(nested):\n    ",
    "Question: A tank of 240 litres drains 15 litres a minute. When is it empty? Work it out step by step.\n"
    "Answer:",
]
RESAMPLES = 3  # samples of each resample prompt, one after another


def _template(instruction: str, example: str, inputs: list[str], cue: str) -> list[str]:
    return [f"{instruction}\n{example}\nText: {text}\n{cue}" for text in inputs]


# template: one instruction and worked example over many inputs, structured (JSON) output
TUNE_TEMPLATE_PROMPTS = _template(
    'Extract the person\'s name, age and city from the text as JSON with the keys "name", "age" and "city".',
    'Example: "Anna Berg, 29, moved to Oslo last year." -> {"name": "Anna Berg", "age": 29, "city": "Oslo"}',
    ["Carlos Ruiz is 41 and lives in Madrid.", "At 35, Mei Chen opened a bakery in Taipei.",
     "Jonas Weber (52) commutes to Munich.", "Priya Nair, aged 27, studies in Chennai.",
     "The mayor of Lyon, Paul Girard, turned 60.", "Sara Olsen, 33, paints murals in Bergen.",
     "In Nairobi, 45-year-old David Otieno runs a clinic.", "Lena Kovac is a 38-year-old pilot from Zagreb."],
    "JSON:")
REPORT_TEMPLATE_PROMPTS = _template(
    'Turn the order below into JSON with the keys "product", "quantity" and "price".',
    'Sample: "Two lamps at 19.99 each" gives {"product": "lamp", "quantity": 2, "price": 19.99}',
    ["Five notebooks, 3.50 apiece.", "One espresso machine for 249.00.", "Twelve pencils at 0.40 each.",
     "Three rugs priced 85.00 each.", "Seven mugs, each 6.25.", "A single bicycle at 410.00.",
     "Four desk chairs costing 129.90 each.", "Nine candles for 2.75 each."],
    "Output:")

# multiturn: a first turn; its second turn (MULTITURN_FOLLOWUPS, by position) holds it and the answer
TUNE_MULTITURN_PROMPTS = [
    "Write a Python function that returns the factorial of n.\n",
    "Explain in three sentences what a hash table is.\n",
    "Write a Python class for a bank account with deposit and withdraw methods.\n",
    "List five tips for writing clear emails.\n",
]
REPORT_MULTITURN_PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome.\n",
    "Describe in three sentences how a binary search works.\n",
    "Write a Python class for a shopping cart with add and total methods.\n",
    "Give five tips for a good night's sleep.\n",
]
MULTITURN_FOLLOWUPS = {
    "tune": ["\n\nRewrite the code above with type hints and a docstring.\n",
             "\n\nNow rewrite that explanation for a ten-year-old.\n"],
    "report": ["\n\nImprove the answer above: keep it, and add comments and an example of its use.\n",
               "\n\nExtend the answer above with two more points, repeating it first.\n"],
}

PROMPT_SETS = {
    "tune": {"high": (TUNE_HIGH_PROMPTS, 0.0), "low": (TUNE_LOW_PROMPTS, 1.0),
             "resample": (TUNE_RESAMPLE_PROMPTS, 0.7), "template": (TUNE_TEMPLATE_PROMPTS, 0.0),
             "multiturn": (TUNE_MULTITURN_PROMPTS, 0.0)},
    "report": {"high": (REPORT_HIGH_PROMPTS, 0.0), "low": (REPORT_LOW_PROMPTS, 1.0),
               "resample": (REPORT_RESAMPLE_PROMPTS, 0.7), "template": (REPORT_TEMPLATE_PROMPTS, 0.0),
               "multiturn": (REPORT_MULTITURN_PROMPTS, 0.0)},
}
DEFAULT_PROMPT_SET = "report"
WORKLOADS = {"low": ("low",), "high": ("high",), "transition": ("low", "high", "low", "high"),
             "resample": ("resample",), "template": ("template",), "multiturn": ("multiturn",),
             "mixed": ("resample", "high", "template", "low")}
# the kinds whose drafts come from other requests too: a run of them starts every mode with an empty global tree
CROSS_REQUEST_KINDS = ("resample", "template", "multiturn")


@dataclass(frozen=True)
class Phase:
    name: str                  # a kind: "low", "high", "resample", "template", "multiturn"
    prompts: tuple[str, ...]   # one per request, in submission order
    temperature: float
    # multiturn: per prompt, the second turn's text after the first turn's answer (its request: prompt + answer +
    # follow-up, sent once the first finished); empty: no second turn
    followups: tuple[str, ...] = ()

    @property
    def num_requests(self) -> int:
        return len(self.prompts) + sum(1 for followup in self.followups if followup)

    def second_turn(self, index: int, answer: str) -> str | None:
        """The request that follows request ``index`` once it answered ``answer`` (None: none)."""
        if index >= len(self.followups) or not self.followups[index]:
            return None
        return self.prompts[index] + answer + self.followups[index]


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
    offsets = dict.fromkeys(kinds, 0)
    phases = []
    for kind in WORKLOADS[name]:
        prompts, temperature = kinds[kind]
        if kind == "low":
            temperature = low_temperature
        start, copies = offsets[kind], RESAMPLES if kind == "resample" else 1  # resample: each prompt 3 times
        indexes = [(start + i // copies) % len(prompts) for i in range(requests_per_phase)]
        offsets[kind] = start + -(-requests_per_phase // copies)
        followups = ()
        if kind == "multiturn":
            turns = MULTITURN_FOLLOWUPS[prompt_set]
            followups = tuple(turns[index % len(turns)] for index in indexes)
        phases.append(Phase(kind, tuple(prompts[index] for index in indexes), temperature, followups))
    return phases
