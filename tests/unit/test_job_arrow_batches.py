"""A Spark task hands its rows to Spark in joined Arrow record batches (``spark_scripts/kinesis_batch.py``,
``joined_batches``): consecutive small ones become one, in order, within the row and byte bounds. No JVM."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pyarrow as pa

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("kinesis_batch_arrow", ROOT / "spark_scripts" / "kinesis_batch.py")
job = importlib.util.module_from_spec(spec)
spec.loader.exec_module(job)

SCHEMA = pa.schema([("shard_id", pa.string()), ("n", pa.int64())])


def batch(shard: str, rows: int, start: int = 0) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([shard] * rows), pa.array(range(start, start + rows), pa.int64())], schema=SCHEMA)


def rows_of(batches: list[pa.RecordBatch]) -> list[tuple[str, int]]:
    return [(r["shard_id"], r["n"]) for b in batches for r in b.to_pylist()]


def test_small_batches_are_joined_in_order_within_the_row_bound():
    given = [batch(f"shard-{i}", 20, i * 20) for i in range(256)]
    out = list(job.joined_batches(iter(given), 1_000, 1 << 30))
    assert [b.num_rows for b in out] == [1_000] * 5 + [120]
    assert rows_of(out) == rows_of(given)
    assert all(b.schema == SCHEMA for b in out)


def test_a_batch_beyond_the_bounds_passes_as_it_is_after_the_pending_ones():
    big = batch("shard-big", 50)
    given = [batch("a", 3), batch("b", 4), big, batch("c", 5)]
    out = list(job.joined_batches(iter(given), 10, 1 << 30))
    assert [b.num_rows for b in out] == [7, 50, 5]
    assert out[1] is big
    assert rows_of(out) == rows_of(given)


def test_a_batch_that_fills_the_bound_is_handed_on_before_the_next_one_is_read():
    read: list[str] = []

    def produced():
        for name, rows in (("a", 4), ("b", 6), ("c", 1)):
            read.append(name)
            yield batch(name, rows)

    out = job.joined_batches(produced(), 10, 1 << 30)
    assert next(out).num_rows == 10 and read == ["a", "b"]  # "c" not read yet: nothing waits for it
    assert [b.num_rows for b in out] == [1]


def test_the_byte_bound_joins_fewer():
    given = [batch("a", 10) for _ in range(4)]
    out = list(job.joined_batches(iter(given), 1_000, 2 * given[0].nbytes))
    assert [b.num_rows for b in out] == [20, 20]


def test_nothing_in_nothing_out():
    assert list(job.joined_batches(iter([]), 10, 10)) == []
