"""Kill points meet configuration mistakes (SAFE): a run killed at a step of batch 1, then a
second consumer pointed at the same output root, then the same consumer with a re-created
checkpoint table (a new, empty store) on the same root, then the killed run's retry.

Whatever the order, the output must never lose or change what its committed records reference:
the second consumer is refused before it reads; the new store either takes the root over while
nothing is committed there yet (its batch 1 replaces only uncommitted files) or is refused; the
killed run's retry is refused once the root holds a batch of another checkpoint history. After
each case every file a committed record references exists, and the committed records hold every
produced record exactly once (EXACT, ATOM, SAFE).

Each run is a real operator process (``run_batch``, Parquet) on a Spark Connect server (warm, so
the suite stays quick), moto behind the fault proxy that holds the step's request for the kill.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path

import pytest

from airflow_kinesis_spark.sinks.parquet import committed_files
from demo.producer import put_aggregated, put_plain, verify
from tests.conftest import create_stream
from tests.reliability.harness import Consumer, fault_stack, kill_group, wait_until

pytestmark = [pytest.mark.reliability, pytest.mark.spark, pytest.mark.slow]

LEASE = 2.0

#: (kill point, what the proxy holds: operation, marker, before/after the request applies)
POINTS = {
    "after_plan_persisted": None,
    "after_report_before_commit": ("PutItem", "#CKPT#", "before"),
    "commit_ambiguous": ("UpdateItem", "SET committed_batch_id", "after"),
}


class ConnectConsumer(Consumer):
    """A harness consumer whose runs use the test's Spark Connect server."""

    def start(self, *extra: str):  # type: ignore[no-untyped-def]
        return super().start("--spark-conn-id", "spark_connect_reliability", *extra)


def outcome(consumer: Consumer) -> dict:
    """Run ``consumer`` once; its summary, or ``{"error": ...}`` when the run failed."""
    proc = consumer.start()
    proc.wait(timeout=300)
    consumer.observe()
    return json.loads(consumer.last_log().strip().splitlines()[-1])


def committed_output_rows(output: Path) -> list[tuple]:
    import pyarrow.parquet as pq

    rows: list[tuple] = []
    for uri in committed_files(str(output)):
        table = pq.read_table(uri.removeprefix("file://"),
                              columns=["shard_id", "sequence_number", "sub_sequence_number", "partition_key", "data"])  # fmt: skip
        rows.extend(zip(*table.to_pydict().values(), strict=True))
    return rows


@pytest.mark.parametrize("point", list(POINTS))
def test_kill_then_a_second_consumer_then_a_recreated_store_on_one_root(
    point, moto_endpoint, kinesis, dynamodb, unique_name, tmp_path, spark_connect_endpoint, monkeypatch
):
    host, port = spark_connect_endpoint
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT_RELIABILITY", json.dumps({"conn_type": "spark_connect", "host": host, "port": port}))
    create_stream(kinesis, unique_name, 2)
    produced = put_plain(kinesis, unique_name, [(f"10.3.{i % 7}.1", f"plain {i}".encode()) for i in range(150)])
    produced += put_aggregated(kinesis, unique_name, [(f"10.3.{i % 3}.2", f"agg {i}".encode()) for i in range(150)])
    (tmp_path / "logs").mkdir()
    with fault_stack(moto_endpoint) as proxy:
        first = ConnectConsumer(unique_name, "lake", f"{unique_name}_a", tmp_path / "out", proxy, dynamodb, tmp_path / "logs")
        proxy.hold = POINTS[point]
        proc = first.start()
        if point == "after_plan_persisted":
            reached = wait_until(lambda: first.store.head().pending_batch_id == 1, 120, proc)
        else:
            reached = proxy.held.wait(180)
        assert reached, f"{point} never reached:\n{first.last_log()[-3000:]}"
        kill_group(proc)
        proxy.hold = None
        committed_by_first = first.store.head().committed_batch_id  # 1 after the ambiguous commit, else 0

        # Mistake 1: another consumer name on the same root. Refused before it reads anything.
        other = replace(first, name="other", runs=first.runs, history=[])
        refused = outcome(other)
        assert "belongs to stream" in refused.get("error", "") and "Nothing was read or written" in refused["error"], refused
        assert other.store.head().pending_batch_id is None and other.store.head().committed_batch_id == 0

        # Mistake 2: a re-created checkpoint table (new, empty) for the same consumer and root.
        time.sleep(LEASE + 0.2)
        fresh = replace(first, table=f"{unique_name}_b", runs=other.runs, history=[])
        second = outcome(fresh)
        # Nothing in the root is committed yet (the committed record follows the checkpoint
        # commit): the new history may take the root over; its batch 1 replaces uncommitted files.
        assert second.get("status") == "committed" and second["batch_id"] == 1 and second["records"] == 300, second

        # The killed run's retry: the root holds batch 1 of the other history now.
        retry = replace(first, runs=fresh.runs)
        again = outcome(retry)
        assert "already holds batch 1" in again.get("error", "") and "ahead of the checkpoint store" in again["error"], again
        assert first.store.head().committed_batch_id == committed_by_first  # MONO: the refused history did not move

        # SAFE and EXACT on what the root's committed records reference.
        references = [u.removeprefix("file://") for u in committed_files(str(first.output))]
        assert references and all(os.path.exists(r) for r in references)
        verdict = verify(produced, committed_output_rows(first.output))
        assert verdict.ok and verdict.records_out == 300, verdict
        # A later run of the history that owns the root goes on from its checkpoints.
        more = put_plain(kinesis, unique_name, [(f"10.4.{i}.1", f"more {i}".encode()) for i in range(20)])
        later = replace(fresh, runs=retry.runs)
        summary = later.run()
        assert summary["batch_id"] == 2 and summary["records"] == 20, summary
        verdict = verify(produced + more, committed_output_rows(first.output))
        assert verdict.ok and verdict.records_out == 320, verdict
