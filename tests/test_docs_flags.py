"""docs/serving.md's flag table is `specswap serve`'s parser: every flag (aliases included) has a row, every row
names a flag the parser has, and a row's default column holds the parser's default where it has one."""

import argparse
import re
from pathlib import Path

from specswap.cli import build_parser

SERVING = Path(__file__).resolve().parents[1] / "docs" / "serving.md"
FLAG = re.compile(r"`(--[a-z0-9-]+)`")


def serve_parser() -> argparse.ArgumentParser:
    subparsers = next(action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction))
    return subparsers.choices["serve"]


def flag_table(text: str) -> dict[str, str]:
    """Each flag of the "## Flags" section's table, with its row's default column."""
    section = text.split("\n## Flags\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 3:
            for flag in FLAG.findall(cells[0]):
                rows[flag] = cells[1]
    return rows


def written_default(default: object) -> str:
    if isinstance(default, float):
        return f"{default:g}"
    return str(default)


def problems(parser: argparse.ArgumentParser, rows: dict[str, str]) -> list[str]:
    found = []
    flags = set()
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        for flag in action.option_strings:
            flags.add(flag)
            if flag not in rows:
                found.append(f"{flag} is missing from serving.md's flag table")
            elif action.default not in (None, False) and written_default(action.default) not in rows[flag]:
                found.append(f"{flag}: the table's default {rows[flag]!r} is not the parser's {action.default!r}")
    found += [f"{flag} is in serving.md's flag table but not a serve flag" for flag in rows if flag not in flags]
    return found


def test_every_serve_flag_is_in_the_flag_table_with_its_default():
    assert problems(serve_parser(), flag_table(SERVING.read_text())) == []


def test_the_check_catches_a_missing_flag_a_wrong_default_and_a_stale_row():
    parser = serve_parser()
    rows = flag_table(SERVING.read_text())
    missing = {flag: default for flag, default in rows.items() if flag != "--header-timeout"}
    assert problems(parser, missing) == ["--header-timeout is missing from serving.md's flag table"]
    wrong = {**rows, "--port": "8000"}
    assert problems(parser, wrong) == ["--port: the table's default '8000' is not the parser's 30000"]
    stale = {**rows, "--no-such-flag": "1"}
    assert problems(parser, stale) == ["--no-such-flag is in serving.md's flag table but not a serve flag"]
