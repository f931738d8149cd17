"""The Spark side of the feed's order (:mod:`sparktf.train.feed.order`): the rows numbered,
and each epoch's pass as one partition per training process.

:func:`numbered` gives every row its index ``_g`` (``[0, T)``, from the partitions' row
counts, :func:`partition_rows`); :func:`epochs_frame` gives epochs' rows from a
:class:`~sparktf.train.feed.order.Position` on: the rows of its order, in whole global
batches, each with its process's share; :func:`shares_frame` moves one or more epochs' rows
by one shuffle into ``N`` partitions (partition ``j`` holds process ``j``'s shares: a hash
partitioning on keys chosen so that key ``j`` lands in partition ``j``,
:func:`share_keys`), sorted by epoch and place in the order. A small table's epochs go
several to a pass: a pass costs Spark a second or two of its own, whatever its rows. Only
DataFrame operations: a Spark Connect client builds the same passes. :func:`plan_facts`
reads from the frame's physical plan what the driver's input-bound check names.
"""

from __future__ import annotations

from sparktf.errors import SparktfRuntimeError
from sparktf.train.feed.order import (
    FEISTEL_ROUNDS,
    PermutationSpec,
    Position,
    epoch_rows,
    permutation_spec,
)

__all__ = [
    "ORDER",
    "numbered",
    "partition_rows",
    "pass_frame",
    "permutation_sql",
    "plan_facts",
    "share_keys",
]

INDEX = "_sparktf_g"  # a row's index in the table
ORDER = "_sparktf_x"  # its place in the epoch's order
EPOCH = "_sparktf_e"  # the epoch (a pass may feed several)
SHARE = "_sparktf_s"  # the process whose share it is


def partition_rows(df) -> list[int]:
    """The rows of each partition of ``df`` (one Spark job; the frame's columns are not
    computed where Spark can leave them out)."""
    from pyspark.sql import functions as F

    found = {
        int(row[0]): int(row[1]) for row in df.groupBy(F.spark_partition_id()).count().collect()
    }
    parts = max(found, default=-1) + 1
    return [found.get(i, 0) for i in range(parts)]


def plan_facts(df) -> dict[str, bool]:
    """What the physical plan of ``df`` says of its cost per pass: ``cached`` (it reads a
    cached relation, ``InMemoryTableScan``) and ``python_udf`` (it runs Python code row by
    row or batch by batch, ``BatchEvalPython``, ``ArrowEvalPython``, ``MapInPandas``...).
    Empty when the plan cannot be read (no job runs: ``explain`` only plans)."""
    import contextlib
    import io

    text = io.StringIO()
    try:
        with contextlib.redirect_stdout(text):
            df.explain()
    except Exception:  # the plan is only a hint for a warning
        return {}
    plan = text.getvalue()
    python = ("EvalPython", "InPandas", "InArrow", "PythonUDTF", "FlatMapGroupsInPandas")
    return {
        "cached": "InMemoryTableScan" in plan or "InMemoryRelation" in plan,
        "python_udf": any(name in plan for name in python),
    }


def numbered(df, counts: list[int]):
    """``df`` with its rows' index ``_sparktf_g``: the rows of the partitions before, plus
    the row's place in its partition. A pass that finds more rows in a partition than were
    counted fails naming it (the plan is not deterministic)."""
    from pyspark.sql import functions as F

    offsets, total = [], 0
    for n in counts:
        offsets.append(total)
        total += n
    part = F.spark_partition_id()
    within = F.monotonically_increasing_id().bitwiseAND(F.lit((1 << 33) - 1))
    offset = F.element_at(F.array(*[F.lit(o).cast("long") for o in offsets or [0]]), part + 1)
    size = F.element_at(F.array(*[F.lit(n).cast("long") for n in counts or [0]]), part + 1)
    checked = F.when(within < size, offset + within).otherwise(
        F.raise_error(
            F.concat(
                F.lit("the DataFrame's partition "),
                part.cast("string"),
                F.lit(
                    " holds more rows than when its rows were counted: its plan is not "
                    "deterministic (cache or checkpoint the DataFrame before training on it)"
                ),
            )
        )
    )
    return df.withColumn(INDEX, checked.cast("long"))


def permutation_sql(column: str, spec: PermutationSpec, *, seed: str | None = None) -> str:
    """The SQL of epoch ``spec``'s permutation of ``column`` (a bijection of
    ``[0, rows)``: see :mod:`sparktf.train.feed.order`). ``seed``: an SQL expression of the
    epoch's seed in place of ``spec.seed`` (a pass of several epochs: each row's own);
    the rotation follows it. Every sum stays below twice ``rows`` or ``2**63``: no overflow
    under ANSI arithmetic."""
    rows, cols, grid_rows = spec.rows, spec.grid_cols, spec.grid_rows
    seed = seed or f"{spec.seed}L"
    y = f"pmod({column} + pmod({seed}, {rows}), {rows})"
    r, c = f"({y} div {cols})", f"pmod({y}, {cols})"
    for i in range(FEISTEL_ROUNDS):
        salt = f"({seed} + {7919 * (i + 1)}L)"
        if i % 2 == 0:
            c = f"pmod({c} + pmod(xxhash64({r}, {salt}), {cols}), {cols})"
        else:
            r = f"pmod({r} + pmod(xxhash64({c}, {salt}), {grid_rows}), {grid_rows})"
    return f"CASE WHEN {y} < {spec.grid} THEN {r} * {cols} + {c} ELSE {y} END"


def share_keys(spark, parts: int) -> list[int]:
    """For each ``j < parts`` a long key that Spark's hash partitioning into ``parts``
    partitions sends to partition ``j`` (``pmod(hash(key), parts) == j``: the partitioning
    ``repartition(parts, col)`` uses), found by Spark itself."""
    from pyspark.sql import functions as F

    keys: dict[int, int] = {}
    span = 64 * parts
    while len(keys) < parts:
        frame = spark.range(span - 64 * parts, span).select(
            "id", F.pmod(F.hash("id"), F.lit(parts)).alias("j")
        )
        for row in frame.groupBy("j").agg(F.min("id").alias("id")).collect():
            keys.setdefault(int(row["j"]), int(row["id"]))
        span += 64 * parts
        if span > 1 << 24:
            raise SparktfRuntimeError(f"no hash keys found for {parts} partitions")
    return [keys[j] for j in range(parts)]


def epochs_frame(
    rows_frame, *, rows: int, first: Position, epochs: int, batch: int, parts: int,
    seed: int, shuffle: bool,
):  # fmt: skip
    """The rows of ``epochs`` epochs from the position ``first`` on (the rest of its epoch,
    then whole epochs), in whole global batches of ``batch`` rows (:func:`numbered` rows,
    each epoch permuted with its own seed from ``seed`` when ``shuffle``), each row with its
    epoch (``_sparktf_e``), its place in its epoch's order (``_sparktf_x``) and its
    process's share among ``parts`` (``_sparktf_s``). Several epochs are one plan: the rows
    crossed with the epochs' numbers. Returns the frame and the rows of each epoch."""
    from pyspark.sql import functions as F

    numbers = list(range(first.epoch, first.epoch + epochs))
    counts = [epoch_rows(rows, first.cursor if e == first.epoch else 0, batch) for e in numbers]
    frame = rows_frame
    if epochs == 1:
        frame = frame.withColumn(EPOCH, F.lit(first.epoch).cast("long"))
    else:
        spark = rows_frame.sparkSession
        frame = frame.crossJoin(spark.range(first.epoch, first.epoch + epochs).toDF(EPOCH))
    if shuffle:
        seeds = [permutation_spec(rows, seed, e).seed for e in numbers]
        offset = f"{EPOCH} - {first.epoch}L + 1"
        epoch_seed = (
            f"{seeds[0]}L"
            if epochs == 1
            else f"element_at(array({', '.join(f'{x}L' for x in seeds)}), CAST({offset} AS INT))"
        )
        spec = permutation_spec(rows, seed, first.epoch)  # the grid is every epoch's
        order = F.expr(permutation_sql(INDEX, spec, seed=epoch_seed))
    else:
        order = F.col(INDEX)
    cursor = F.when(F.col(EPOCH) == first.epoch, F.lit(first.cursor)).otherwise(F.lit(0))
    end = F.when(F.col(EPOCH) == first.epoch, F.lit(first.cursor + counts[0])).otherwise(
        F.lit(counts[-1] if epochs > 1 else counts[0])
    )
    frame = frame.withColumn(ORDER, order)
    frame = frame.where((F.col(ORDER) >= cursor) & (F.col(ORDER) < end))
    share = F.pmod(F.col(ORDER) - cursor, F.lit(parts))
    return frame.withColumn(SHARE, share.cast("int")), counts


def shares_frame(frame, keys: list[int]):
    """One pass of the feed over an :func:`epochs_frame`: one partition per process
    (``len(keys)``, :func:`share_keys`), each holding its shares of the epochs one after
    the other, each share in its epoch's order."""
    from pyspark.sql import functions as F

    key = F.element_at(F.array(*[F.lit(k).cast("long") for k in keys]), F.col(SHARE) + 1)
    frame = frame.repartition(len(keys), key).sortWithinPartitions(EPOCH, ORDER)
    return frame.drop(INDEX, ORDER, EPOCH, SHARE)


def pass_frame(
    rows_frame,
    *,
    rows: int,
    position: Position,
    batch: int,
    keys: list[int],
    seed: int,
    shuffle: bool,
):
    """The pass of the epoch ``position`` stands in (see :func:`epochs_frame` and
    :func:`shares_frame`); returns the frame and the rows it feeds."""
    frame, counts = epochs_frame(
        rows_frame, rows=rows, first=position, epochs=1, batch=batch, parts=len(keys),
        seed=seed, shuffle=shuffle,
    )  # fmt: skip
    return shares_frame(frame, keys), counts[0]
