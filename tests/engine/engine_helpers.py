"""A character tokenizer for stop strings and text; the random models come from tests/worker."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "worker"))
from spec_helpers import attention_pair, random_eagle_head, random_target  # noqa: E402,F401


class CharTokenizer:
    """Token id = character code - 30 (0 = BOS, 1 = EOS; ids 2..63): enough to test stop strings and text."""

    bos_token_id = 0
    eos_token_ids = {1}
    vocab_size = 64

    def encode(self, text, add_bos=False):
        ids = [min(max(ord(c) - 30, 2), 63) for c in text]
        return [0, *ids] if add_bos else ids

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i + 30) for i in ids if i >= 2)


def finish_all(engine, ids=(), finished=None):
    """Step until nothing is unfinished; every finished output by request id: those the steps returned, with
    those that finished inside a generate() (the next step() returns them, so one more runs at the end)."""
    finished = {} if finished is None else finished
    while True:
        finished.update((output.request_id, output) for output in engine.step().finished)
        if not engine.has_unfinished():
            break
    missing = [request_id for request_id in ids if request_id not in finished]
    assert not missing, f"requests {missing} never finished"
    return finished
