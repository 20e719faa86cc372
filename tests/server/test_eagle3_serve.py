"""`specswap serve --speculative-algorithm EAGLE3 --speculative-draft-model-path DIR` on the tiny target with a
randomly initialised EAGLE-3 head written in SpecForge's layout, answering the openai client; its greedy text is
the target's alone (NONE) text."""

import sys
from pathlib import Path

import openai

from server_helpers import serve_subprocess

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "worker"))
from eagle3_helpers import write_random_eagle3  # noqa: E402

API_KEY = "k"
PROMPT = "def fibonacci(n):\n    "


def _complete(arguments):
    with serve_subprocess([*arguments, "--threads", "1", "--max-batch-size", "2", "--api-key", API_KEY,
                           "--dtype", "float32", "--disable-cuda-graph"],
                          headers={"Authorization": f"Bearer {API_KEY}"}) as (_, url):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
        result = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0)
        return result.choices[0].text, result.usage.completion_tokens


def test_serve_eagle3_from_a_checkpoint_directory_answers_the_openai_client(tmp_path):
    from specswap.loading import load_models
    target = load_models("tiny", speculative_algorithm="NONE", dtype="float32").target
    write_random_eagle3(target, tmp_path / "head", seed=4, token_map=list(range(0, 2048, 2)), scale=0.5)
    text, tokens = _complete(["--model", "tiny", "--speculative-algorithm", "EAGLE3",
                              "--speculative-draft-model-path", str(tmp_path / "head"),
                              "--speculative-adaptive"])
    assert tokens >= 1 and text
    assert (text, tokens) == _complete(["--model", "tiny", "--speculative-algorithm", "NONE"])
