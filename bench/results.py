"""The benchmarks' results page: one table of goals from the result files of one run.

    .venv/bin/python bench/results.py [--results bench/results] [--since EPOCH_SECONDS]
        [--output bench/RESULTS.md] [--names convert read ...] [--expect NAME ...]
        [--stack auto|TEXT] [--note TEXT] [--wall-s SECONDS --took NAME=SECONDS ...]
        [--keep DIR]

Takes the newest ``<name>-<time>.json`` of each benchmark in ``--results`` (``--since``: only
files written after that time), prints the goals table (benchmark, goal, value, target, met)
and writes it to ``--output`` as a markdown page: when the run finished, the machine it ran
on (from the result files' ``machine`` objects), the software stack, how many rounds each
benchmark ran (its ``rounds``, ``rounds_max`` and ``budget_s``: bench/common.RoundBudget),
the table, how many goals were met and which files it came from. ``bench/all.sh`` calls it
after a run; ``bench/gpu.sh`` for its GPU results. ``--wall-s`` (bench/all.sh, after a run
of every benchmark) first writes the result ``all-<time>.json`` with the goal ``all.wall_s``
(the whole run's wall time, at most :data:`WALL_GOAL_S`) and each benchmark's seconds
(``--took``). ``--keep DIR`` copies the result files of the page into ``DIR`` (to be
committed) and makes the page from there. Exits 1 when a benchmark named by ``--expect`` has
no result.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from importlib import metadata
from pathlib import Path

__all__ = [
    "BENCHMARKS",
    "STACK_PACKAGES",
    "WALL_GOAL_S",
    "keep",
    "latest",
    "machine_line",
    "main",
    "page",
    "rounds_line",
    "rows",
    "stack_line",
    "write_wall",
]

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ("convert", "read", "feed", "train", "predict", "all")
# bench/all.sh's whole run, every benchmark at its sizes, on a 2-core machine.
WALL_GOAL_S = 900
STACK_PACKAGES = ("pyspark", "pyarrow", "numpy", "pandas", "tensorflow", "petastorm")
# <name>-<YYYYmmdd>[-<HHMMSS>].json, as bench/common.write_results names a result.
RESULT_FILE = re.compile(r"^(?P<name>.+?)-(?P<stamp>\d{8}(?:-\d{6})?)\.json$")
HEADER = ("benchmark", "goal", "value", "target", "met")


def latest(results: Path, since: float = 0.0, names: Iterable[str] = BENCHMARKS) -> dict:
    """``{name: path}``: the newest result file of each benchmark in ``names`` found in
    ``results`` (by the time in its name), ignoring files modified before ``since``."""
    wanted = set(names)
    found: dict[str, Path] = {}
    for path in sorted(results.glob("*.json")):
        match = RESULT_FILE.match(path.name)
        if match is None or match["name"] not in wanted or path.stat().st_mtime < since:
            continue
        name = match["name"]
        if name not in found or match["stamp"] > RESULT_FILE.match(found[name].name)["stamp"]:
            found[name] = path
    return found


def _machine() -> dict:
    """The machine, shaped as bench/common.machine() records it (without its imports)."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    return {
        "cpu": cpu or "unknown CPU",
        "cpus": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "memory_gib": round(memory / 2**30, 1),
    }


def write_wall(results: Path, wall_s: float, took: Mapping[str, float]) -> Path:
    """Writes ``results/all-<time>.json``: the goal ``all.wall_s`` (``wall_s``, the whole
    run, at most :data:`WALL_GOAL_S`) and ``took`` (``{benchmark: seconds}``), shaped as
    bench/common.write_results writes a result. Returns its path."""
    now = datetime.now()
    result = {
        "benchmark": "all",
        "goals": {
            "all.wall_s": {
                "value": round(float(wall_s), 1),
                "goal": WALL_GOAL_S,
                "op": "<=",
                "met": wall_s <= WALL_GOAL_S,
            }
        },
        "seconds": {name: round(float(s), 1) for name, s in took.items()},
        "machine": _machine(),
        "finished_at": now.strftime("%Y-%m-%d %H:%M:%S"),
    }
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"all-{now.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


def keep(files: Mapping[str, Path], directory: Path) -> dict:
    """Copies ``files`` (``{name: path}``) into ``directory``; returns ``{name: copy}``."""
    directory.mkdir(parents=True, exist_ok=True)
    kept = {}
    for name, path in files.items():
        kept[name] = directory / path.name
        shutil.copy2(path, kept[name])
    return kept


def _took(text: str) -> tuple[str, float]:
    name, sep, seconds = text.partition("=")
    try:
        if not sep or not name:
            raise ValueError(text)
        return name, float(seconds)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NAME=SECONDS, got {text!r}") from None


def _target(goal: Mapping) -> str:
    op = {">=": "≥", "<=": "≤"}.get(goal.get("op", ">="), goal.get("op", ""))
    return f"{op} {goal['goal']}"


def _shown_value(goal: Mapping) -> str:
    """The value with three significant digits, or four when three would read as the goal
    itself although it is not met."""
    if goal.get("value") is None:
        return "not measured"
    text = f"{goal['value']:.3g}"
    if not goal["met"] and float(text) == float(goal["goal"]):
        text = f"{goal['value']:.4g}"
    return text


def rows(results: Mapping[str, Mapping], names: Iterable[str] = BENCHMARKS) -> list[tuple]:
    """The table's rows ``(benchmark, goal, value, target, met)`` from the ``"goals"``
    objects of ``results`` (``{name: result JSON}``), benchmarks in the order of ``names``;
    a value of None reads "not measured"."""
    table = []
    for name in names:
        if name not in results:
            continue
        for goal_name, goal in (results[name].get("goals") or {}).items():
            value = _shown_value(goal)
            table.append((name, goal_name, value, _target(goal), "yes" if goal["met"] else "no"))
    return table


def machine_line(results: Mapping[str, Mapping]) -> str:
    """The machine the results were measured on, from their ``machine`` objects (CPU model,
    cores, memory; the load average of the last result, taken as the run ended)."""
    machines = [r["machine"] for r in results.values() if isinstance(r.get("machine"), dict)]
    if not machines:
        return "not recorded in the result files"
    first, last = machines[0], machines[-1]
    parts = [
        first.get("platform") or "",
        str(first.get("cpu", "unknown CPU")),
        f"{first.get('cpus', '?')} CPU cores",
        f"{first.get('memory_gib', '?')} GiB memory",
    ]
    if "load_average_1m" in last:
        parts.append(f"load average {last['load_average_1m']} at the end")
    return ", ".join(p for p in parts if p)


def rounds_line(results: Mapping[str, Mapping]) -> str:
    """How many rounds each benchmark ran, from its result's ``rounds`` (with ``rounds_max``
    when fewer ran, and ``budget_s`` when it had a budget); "" when no result records them."""
    parts = []
    for name, result in results.items():
        ran = result.get("rounds")
        if not isinstance(ran, int) or isinstance(ran, bool):
            continue
        text = f"{name} {ran}"
        most = result.get("rounds_max")
        if isinstance(most, int) and most != ran:
            text += f" of at most {most}"
        if isinstance(result.get("budget_s"), (int, float)):
            text += f" (budget {result['budget_s']:g} s)"
        parts.append(text)
    return ", ".join(parts)


def stack_line(packages: Sequence[str] = STACK_PACKAGES) -> str:
    """The installed versions of ``packages`` (and Python), as measured with: the stack of
    the interpreter that runs this script, which ``bench/all.sh`` also ran the benchmarks
    with. A package not installed reads "-"."""
    parts = [f"Python {sys.version.split()[0]}"]
    for name in packages:
        try:
            parts.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            parts.append(f"{name} -")
    return ", ".join(parts)


def _finished(results: Mapping[str, Mapping]) -> str:
    stamps = sorted(str(r["finished_at"]) for r in results.values() if r.get("finished_at"))
    return stamps[-1] if stamps else "not recorded"


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def page(
    files: Mapping[str, Path],
    names: Sequence[str] = BENCHMARKS,
    *,
    stack: str,
    note: str = "",
) -> str:
    """The markdown page for the result files ``files`` (``{name: path}``, as
    :func:`latest` returns). ``stack`` is the software the run used; ``note`` a paragraph
    under the table (sizes, wall time). Raises ``ValueError`` for a file that is not JSON."""
    results = {}
    for name in names:
        if name in files:
            try:
                results[name] = json.loads(files[name].read_text())
            except json.JSONDecodeError as exc:
                raise ValueError(f"{files[name]}: not a result file ({exc})") from None
    table = rows(results, names)
    met = sum(r[4] == "yes" for r in table)
    directories = sorted({_shown(files[n].parent) for n in results})
    lines = [
        "# Benchmark results",
        "",
        "Written by `bench/all.sh` (through `bench/results.py`) from the result files of one "
        "run. What each benchmark measures, the measuring contract and how to run them: "
        "[bench/README.md](README.md).",
        "",
        f"- **Finished:** {_finished(results)} (the machine's clock)",
        f"- **Machine:** {machine_line(results)}",
        f"- **Stack:** {stack}",
        *([f"- **Rounds run:** {ran}"] if (ran := rounds_line(results)) else []),
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
        *(f"| {' | '.join(r)} |" for r in table),
        "",
        f"{met} of {len(table)} goals met. Result files (in {', '.join(directories) or '-'}): "
        + ", ".join(f"`{files[n].name}`" for n in names if n in results)
        + ".",
    ]
    if note:
        lines += ["", note]
    return "\n".join(lines) + "\n"


def _print_table(files: Mapping[str, Path], names: Sequence[str]) -> None:
    table = rows({n: json.loads(p.read_text()) for n, p in files.items()}, names)
    widths = [max(len(r[i]) for r in [HEADER, *table]) for i in range(len(HEADER))]
    for r in [HEADER, *table]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    print(f"{sum(r[4] == 'yes' for r in table)} of {len(table)} goals met")


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module's docstring); returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--results", default=str(ROOT / "bench" / "results"), help="result files")
    p.add_argument("--since", type=float, default=0.0, help="only results written after this")
    p.add_argument("--output", default=None, help="write the markdown page here")
    p.add_argument(
        "--names",
        nargs="+",
        default=list(BENCHMARKS),
        help="benchmarks to table, in order (default: %(default)s; bench/gpu.sh's are "
        "train-gpu-fp32, train-gpu-bf16, predict-gpu)",
    )
    p.add_argument("--expect", nargs="*", default=[], help="names that must have a result")
    p.add_argument(
        "--stack",
        default="auto",
        help="the software the run used; 'auto' (default): this interpreter's versions of "
        + ", ".join(STACK_PACKAGES),
    )
    p.add_argument("--note", default="", help="a paragraph under the table (sizes, wall time)")
    p.add_argument(
        "--wall-s",
        type=float,
        default=None,
        help=f"first write all-<time>.json: the run's wall time, goal <= {WALL_GOAL_S} s",
    )
    p.add_argument(
        "--took",
        type=_took,
        nargs="*",
        default=[],
        metavar="NAME=SECONDS",
        help="each benchmark's seconds, recorded with --wall-s",
    )
    p.add_argument("--keep", default=None, help="copy the page's result files here, page from them")
    args = p.parse_args(argv)
    if args.wall_s is not None:
        write_wall(Path(args.results), args.wall_s, dict(args.took))
    files = latest(Path(args.results), args.since, args.names)
    if args.keep:
        files = keep(files, Path(args.keep))
    _print_table(files, args.names)
    if args.output:
        stack = stack_line() if args.stack == "auto" else args.stack
        Path(args.output).write_text(page(files, args.names, stack=stack, note=args.note))
        print(f"written to {args.output}", file=sys.stderr)
    missing = [n for n in args.expect if n not in files]
    if missing:
        print(f"no results for: {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
