"""One goals table from the benchmarks' results (the contract's ``"goals"`` objects).

    .venv/bin/python bench/goals.py [--since EPOCH_SECONDS] [--markdown bench/results/goals.md]

Takes the newest ``bench/results/<name>-*.json`` of each benchmark (``--since``: only files
written after that time), prints one table (benchmark goal, value, goal, met) and, with
``--markdown``, writes it as a markdown table headed by the date and the machine. Exits 1
when a benchmark expected by ``--expect`` has no result.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

BENCHMARKS = ("convert", "read", "feed", "train", "predict")


def latest(results: Path, since: float, names=BENCHMARKS) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in sorted(results.glob("*.json")):
        name = path.name.rsplit("-", 2)[0]
        if name not in names or path.stat().st_mtime < since:
            continue
        if name not in found or path.name > found[name].name:
            found[name] = path
    return found


def rows(files: dict[str, Path], names=BENCHMARKS) -> list[tuple[str, str, str, str, str]]:
    table = []
    for name in names:
        if name not in files:
            continue
        goals = json.loads(files[name].read_text()).get("goals") or {}
        for goal_name, g in goals.items():
            value = "not measured" if g.get("value") is None else f"{g['value']:.3g}"
            op = {">=": "≥", "<=": "≤"}.get(g.get("op", ">="), g.get("op", ""))
            table.append((name, goal_name, value, f"{op} {g['goal']}", "yes" if g["met"] else "no"))
    return table


def machine_line() -> str:
    m = common.machine()
    return (
        f"{platform.machine()} Linux ({m['cpu']}), {m['cpus']} CPU cores, "
        f"{m['memory_gib']} GiB memory, "
        f"load average {m['load_average_1m']} at the end, Python {platform.python_version()}"
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--results", default=str(common.RESULTS), help="results directory")
    p.add_argument("--since", type=float, default=0.0, help="only results written after this")
    p.add_argument("--markdown", default=None, help="also write the table here (markdown)")
    p.add_argument(
        "--names",
        nargs="+",
        default=list(BENCHMARKS),
        help="result names to table, in order (default: %(default)s; bench/gpu.sh's are "
        "train-gpu-fp32, train-gpu-bf16, predict-gpu)",
    )
    p.add_argument("--expect", nargs="*", default=[], help="names that must have a result")
    p.add_argument("--note", default="", help="a line under the table (e.g. sizes, wall time)")
    args = p.parse_args(argv)
    files = latest(Path(args.results), args.since, args.names)
    table = rows(files, args.names)
    header = ("benchmark", "goal", "value", "target", "met")
    widths = [max(len(r[i]) for r in [header, *table]) for i in range(len(header))]
    for r in [header, *table]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    met = sum(r[4] == "yes" for r in table)
    print(f"{met} of {len(table)} goals met")
    if args.markdown:
        now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        lines = [
            f"Goals from one `bench/all.sh` run, {now}; machine: {machine_line()}.",
            "",
            "| benchmark | goal | value | target | met |",
            "|---|---|---|---|---|",
            *(f"| {' | '.join(r)} |" for r in table),
            "",
            f"{met} of {len(table)} goals met. Results: "
            + ", ".join(f"`{files[n].name}`" for n in args.names if n in files)
            + ".",
        ]
        if args.note:
            lines += ["", args.note]
        Path(args.markdown).write_text("\n".join(lines) + "\n")
        print(f"written to {args.markdown}", file=sys.stderr)
    missing = [n for n in args.expect if n not in files]
    if missing:
        print(f"no results for: {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
