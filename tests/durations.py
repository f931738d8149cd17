"""Rewrites tests/durations.json (the seconds of each test module, read by
tests/conftest.py to start the longest modules first) from the ``--durations=0`` report of a
whole-suite run: ``PYTEST_ADDOPTS=--durations=0 bash .ci/run > report.txt``, then
``python tests/durations.py report.txt``. Modules not in the report keep their old figure."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

DURATIONS = Path(__file__).resolve().parent / "durations.json"
LINE = re.compile(r"^([0-9.]+)s (?:call|setup|teardown)\s+(tests/\S+?)\.py::", re.M)


def load() -> dict[str, float]:
    """The measured seconds of each module (``tests.test_x``); empty without the file."""
    try:
        return json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}


def module_seconds(report: str) -> dict[str, float]:
    """Seconds per test module (``tests.test_x``) in a ``--durations`` report."""
    seconds: dict[str, float] = {}
    for took, path in LINE.findall(report):
        name = path.replace("/", ".")
        seconds[name] = seconds.get(name, 0.0) + float(took)
    return seconds


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    measured = module_seconds(Path(argv[0]).read_text())
    if not measured:
        print(f"no --durations lines in {argv[0]}", file=sys.stderr)
        return 1
    known = load()
    known.update({name: round(took) for name, took in measured.items()})
    ordered = dict(sorted(known.items(), key=lambda kv: (-kv[1], kv[0])))
    DURATIONS.write_text(json.dumps(ordered, indent=1) + "\n")
    print(f"{len(measured)} modules measured, {len(ordered)} in {DURATIONS}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
