"""Where a benchmark figure came from: the command, the CPU and the commit, stamped into every benchmark JSON.

The docs cite only JSONs under ``results/`` that carry these three keys (tests/test_docs_evidence.py), so a
figure can be traced to the command that made it, the machine it ran on and the code it measured.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

from specswap.capability import cpu_capability

_REPOSITORY = Path(__file__).resolve().parents[3]


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command as typed: ``argv`` (default ``sys.argv``) joined, each word quoted where the shell needs it."""
    return " ".join(shlex.quote(word) for word in (sys.argv if argv is None else argv))


def cpu_line() -> str:
    """One line naming this CPU and what it runs natively (AVX2, AVX-512, native bf16, AMX, any override):
    ``specswap.capability.cpu_capability().describe()``."""
    return cpu_capability().describe()


def git_commit(directory: str | Path = _REPOSITORY) -> str:
    """``git rev-parse HEAD`` of the checkout holding ``directory``, with ``-dirty`` when tracked files differ
    from it, those under ``results/`` aside (benchmark outputs: a run that rewrites one file there leaves the
    code it measures unchanged for the next); ``"unknown"`` outside a git checkout (an installed wheel) or
    without git."""
    try:
        head = subprocess.run(["git", "-C", str(directory), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "-C", str(directory), "status", "--porcelain", "--untracked-files=no", "--",
                                ":(top)", ":(top,exclude)results"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    commit = head.stdout.strip()
    return f"{commit}-dirty" if dirty.returncode == 0 and dirty.stdout.strip() else commit


def stamp(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """``{"command", "cpu", "cpu_capability", "commit"}`` for a benchmark JSON (merge it into the report's top
    level): ``cpu`` is the capability line, ``cpu_capability`` its fields."""
    return {"command": command_line(argv), "cpu": cpu_line(), "cpu_capability": cpu_capability().as_dict(),
            "commit": git_commit()}


def write_report(path: str | Path, report: dict[str, Any]) -> None:
    """A benchmark report as indented JSON at ``path``, its folder made if missing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
