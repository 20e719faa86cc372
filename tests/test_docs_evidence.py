"""Every figure in README.md and docs/ cites evidence committed in the repository.

A citation is a ``results/<name>.json`` path; the file must exist, parse as a JSON object and say where it came
from (``command``, ``cpu``, ``commit``: specswap.bench.provenance). The untracked ``runs`` folder is no evidence:
a doc naming a path in it fails. Docs say what is, not how it came to be: no "session N" history."""

import json
import re
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]
REQUIRED_KEYS = ("command", "cpu", "commit")
CITATION = re.compile(r"(?<![\w/.-])results/[\w./-]+?\.json\b")
RUNS = re.compile(r"(?<![\w/.-])runs/")
HISTORY = re.compile(r"\bsessions?[ -]\d", re.IGNORECASE)


def documents(root: Path = REPOSITORY) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def evidence_problems(path: Path) -> list[str]:
    """What is wrong with one results JSON (empty when it is good evidence)."""
    if not path.is_file():
        return [f"{path} does not exist"]
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return [f"{path} is not JSON: {error}"]
    if not isinstance(data, dict):
        return [f"{path} holds a {type(data).__name__}, not a JSON object"]
    return [f"{path} has no {key!r} (needs {', '.join(REQUIRED_KEYS)})"
            for key in REQUIRED_KEYS if not isinstance(data.get(key), str) or not data[key].strip()]


def citation_problems(root: Path = REPOSITORY) -> list[str]:
    """Every bad citation in the docs under ``root``: missing or bad results JSONs, paths into runs/, history."""
    problems = []
    for document in documents(root):
        if not document.is_file():
            continue
        for number, line in enumerate(document.read_text().splitlines(), 1):
            where = f"{document.relative_to(root)}:{number}"
            for cited in CITATION.findall(line):
                problems += [f"{where}: {problem}" for problem in evidence_problems(root / cited)]
            if RUNS.search(line):
                problems.append(f"{where}: cites the untracked runs folder: {line.strip()}")
            if HISTORY.search(line):
                problems.append(f"{where}: history prose (git log holds it): {line.strip()}")
    return problems


def test_every_citation_in_the_docs_is_committed_evidence():
    problems = citation_problems()
    assert not problems, "\n".join(problems)


def test_every_committed_result_says_where_it_came_from():
    problems = [p for path in sorted((REPOSITORY / "results").glob("**/*.json")) for p in evidence_problems(path)]
    assert not problems, "\n".join(problems)


def test_no_session_history_in_the_sources():
    """Comments and docstrings give the reason for the code, not the story of how it was written."""
    hits = []
    for folder in ("python", "bench", "tools", "csrc"):
        for path in sorted((REPOSITORY / folder).rglob("*")):
            if path.suffix not in {".py", ".sh", ".cpp", ".h", ".cu", ".md", ".txt"} or not path.is_file():
                continue
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if HISTORY.search(line):
                    hits.append(f"{path.relative_to(REPOSITORY)}:{number}: {line.strip()}")
    assert not hits, "\n".join(hits)


@pytest.fixture
def fake_repository(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "results").mkdir()
    good = {"command": "specswap bench", "cpu": "Test CPU", "commit": "0" * 40, "ratios": {}}
    (tmp_path / "results" / "good.json").write_text(json.dumps(good))
    (tmp_path / "results" / "no-cpu.json").write_text(json.dumps({"command": "x", "commit": "y"}))
    (tmp_path / "results" / "broken.json").write_text("{not json")
    return tmp_path


def test_the_check_accepts_good_evidence(fake_repository):
    (fake_repository / "README.md").write_text("1.2x the best static tier (results/good.json).\n")
    (fake_repository / "docs" / "a.md").write_text("See `results/good.json`, and results/ for more.\n")
    assert citation_problems(fake_repository) == []


@pytest.mark.parametrize("text, problem", [
    ("1.1x (results/missing.json)", "does not exist"),
    ("1.1x (results/broken.json)", "is not JSON"),
    ("1.1x (results/no-cpu.json)", "has no 'cpu'"),
    ("1.1x (runs/bench-ngram.json)", "untracked runs folder"),
    ("written to `runs/bench.png`", "untracked runs folder"),
    ("Session 7: adaptive 1.1x", "history prose"),
    ("the session-3 policy", "history prose"),
])
def test_the_check_catches_bad_citations(fake_repository, text, problem):
    (fake_repository / "README.md").write_text("Fine text.\n")
    (fake_repository / "docs" / "a.md").write_text(f"Intro.\n{text}\n")
    problems = citation_problems(fake_repository)
    assert len(problems) == 1 and problem in problems[0] and problems[0].startswith("docs/a.md:2:"), problems
