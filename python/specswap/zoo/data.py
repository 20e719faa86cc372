"""Offline training text for the tiny zoo: CPython stdlib sources (code) and licence texts + docstrings (prose).

Everything comes from files already on the machine, read in sorted order, so the same machine always builds
the same corpus. A document goes to the held-out split when a hash of its name says so (1 in HOLDOUT_EVERY).
"""

from __future__ import annotations

import ast
import hashlib
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

HOLDOUT_EVERY = 20
SKIPPED_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__", "lib2to3"}
LICENCE_DIR = Path("/usr/share/common-licenses")
DOC_DIR = Path("/usr/share/doc")
MIN_PROSE_CHARS = 160
MIN_DOCSTRING_CHARS = 200


@dataclass
class Corpus:
    """Documents by domain ("code", "prose") and split ("train", "heldout")."""

    documents: dict[str, dict[str, list[str]]] = field(default_factory=lambda: {
        "code": {"train": [], "heldout": []}, "prose": {"train": [], "heldout": []}})

    def add(self, domain: str, name: str, text: str) -> None:
        self.documents[domain][split_of(name)].append(text)

    def summary(self) -> dict[str, dict[str, dict[str, int]]]:
        return {domain: {split: {"documents": len(docs), "chars": sum(map(len, docs))}
                         for split, docs in splits.items()} for domain, splits in self.documents.items()}

    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        for domain in sorted(self.documents):
            for split in sorted(self.documents[domain]):
                for doc in self.documents[domain][split]:
                    digest.update(doc.encode("utf-8", "replace"))
        return digest.hexdigest()[:16]


def split_of(name: str) -> str:
    bucket = int(hashlib.sha1(name.encode()).hexdigest(), 16) % HOLDOUT_EVERY
    return "heldout" if bucket == 0 else "train"


def stdlib_sources(stdlib: Path | None = None) -> list[Path]:
    """The standard library's .py files outside test directories, sorted by relative path."""
    root = Path(stdlib or sysconfig.get_paths()["stdlib"])
    return sorted((p for p in root.rglob("*.py") if not SKIPPED_DIRS & set(p.relative_to(root).parts[:-1])),
                  key=lambda p: p.relative_to(root).as_posix())


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def docstrings(source: str) -> list[str]:
    """Module, class and function docstrings long enough to be prose."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc and len(doc) >= MIN_DOCSTRING_CHARS:
                found.append(doc)
    return found


def looks_like_prose(paragraph: str) -> bool:
    letters = sum(c.isalpha() or c.isspace() for c in paragraph)
    return len(paragraph) >= MIN_PROSE_CHARS and letters / len(paragraph) > 0.85 and not paragraph.startswith(
        ("Files:", "Copyright:", "Format:", "Upstream-"))


def licence_paragraphs() -> list[tuple[str, str]]:
    """(name, paragraph) from the common licences and every package's copyright file, first occurrence only."""
    files = sorted(p for p in LICENCE_DIR.glob("*") if p.is_file())
    files += sorted(DOC_DIR.glob("*/copyright"))
    seen: set[str] = set()
    paragraphs = []
    for file in files:
        text = read_text(file)
        if text is None:
            continue
        for index, raw in enumerate(text.split("\n\n")):
            # Debian copyright files indent licence text by one space and use " ." for blank lines
            paragraph = "\n".join(line.strip() for line in raw.strip("\n").splitlines() if line.strip() != ".")
            key = " ".join(paragraph.split())
            if looks_like_prose(paragraph) and key not in seen:
                seen.add(key)
                paragraphs.append((f"{file}#{index}", paragraph))
    return paragraphs


def build_corpus(stdlib: Path | None = None) -> Corpus:
    corpus = Corpus()
    root = Path(stdlib or sysconfig.get_paths()["stdlib"])
    for path in stdlib_sources(root):
        source = read_text(path)
        if not source or not source.strip():
            continue
        name = path.relative_to(root).as_posix()
        corpus.add("code", name, source)
        for index, doc in enumerate(docstrings(source)):
            corpus.add("prose", f"{name}#doc{index}", doc)
    for name, paragraph in licence_paragraphs():
        corpus.add("prose", name, paragraph)
    return corpus
