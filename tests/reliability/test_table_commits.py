"""Table outputs under kill -9: before, during (ambiguous) and after the table commit, and two
concurrent runs. Each run is a real operator process (``run_batch``) on a Spark Connect server
(warm, so the suite stays quick), moto behind the fault proxy, a real Iceberg table (pyiceberg,
SQL catalog on SQLite) or Delta table (deltalake) on local files.

After every kill the next run must leave each produced record in the table exactly once, one
snapshot / version holding the batch, and the checkpoints committed (EXACT, ATOM, MONO).
"""

from __future__ import annotations

import json
import time

import pyarrow as pa
import pytest

from demo.producer import put_aggregated, put_plain, verify
from tests.conftest import create_stream
from tests.reliability.fault_proxy import FaultProxy
from tests.reliability.harness import Consumer, kill_group

pytestmark = [pytest.mark.reliability, pytest.mark.spark, pytest.mark.slow]

LEASE = 2.0
KEYS = ("shard_id", "sequence_number", "sub_sequence_number", "partition_key", "data")


class TableConsumer(Consumer):
    """A harness consumer whose output is a table: its rows and its commits are the table's."""

    output_format: str = "iceberg"
    args: tuple[str, ...] = ()

    def start(self, *extra: str):  # type: ignore[no-untyped-def]
        return super().start(*self.args, *extra)

    def table_rows(self) -> list[tuple]:
        data = self._read()[0]
        return list(zip(*(data.column(c).to_pylist() for c in KEYS), strict=True)) if data is not None else []

    def commits(self) -> list[str]:
        """The batch ids of the table's snapshots (Iceberg) or versions (Delta), in order."""
        return self._read()[1]

    def _read(self):  # type: ignore[no-untyped-def]
        if self.output_format == "iceberg":
            from pyiceberg.catalog.sql import SqlCatalog
            from pyiceberg.exceptions import NoSuchTableError

            try:
                table = SqlCatalog("default", uri=f"sqlite:///{self.output.parent}/catalog.db").load_table("lake.events")
            except NoSuchTableError:
                return None, []
            return table.scan().to_arrow(), [s.summary.additional_properties.get("kinesis-spark.batch-id")
                                             for s in table.metadata.snapshots]  # fmt: skip
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            table = DeltaTable(str(self.output))
        except TableNotFoundError:
            return None, []
        return pa.table(table.to_pyarrow_table()), [c.get("kinesis-spark.batch-id") for c in reversed(table.history())]

    def check_table(self, produced) -> None:  # type: ignore[no-untyped-def]
        self.observe()
        verdict = verify(produced, self.table_rows())
        assert verdict.ok, verdict
        commits = [c for c in self.commits() if c]
        assert len(commits) == len(set(commits)), f"a batch was committed to the table twice: {commits}"
        assert self.store.head().pending_batch_id is None


@pytest.fixture
def table_consumer(request, moto_endpoint, kinesis, dynamodb, unique_name, tmp_path, spark_connect_endpoint, monkeypatch):
    host, port = spark_connect_endpoint
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT_RELIABILITY", json.dumps({"conn_type": "spark_connect", "host": host, "port": port}))
    create_stream(kinesis, unique_name, 2)
    proxy = FaultProxy(moto_endpoint).start()
    (tmp_path / "logs").mkdir()
    output_format = request.param
    consumer = TableConsumer(unique_name, "tables", f"{unique_name}_t", tmp_path / "table", proxy, dynamodb, tmp_path / "logs")
    consumer.output_format = output_format
    consumer.args = ("--output-format", output_format, "--spark-conn-id", "spark_connect_reliability", "--lease", str(LEASE),
                     *(("--table-name", "lake.events", "--catalog-uri", f"sqlite:///{tmp_path}/catalog.db")
                       if output_format == "iceberg" else ()))  # fmt: skip
    produced = put_plain(kinesis, unique_name, [(f"10.3.{i % 7}.1", f"first {i}".encode()) for i in range(60)])
    consumer.run()  # batch 1: the table exists
    produced += put_aggregated(kinesis, unique_name, [(f"10.3.{i % 3}.2", f"second {i}".encode()) for i in range(60)])
    produced += put_plain(kinesis, unique_name, [(f"10.3.{i % 5}.3", f"second plain {i}".encode()) for i in range(30)])
    yield consumer, produced, kinesis
    proxy.stop()


POINTS = ["before_table_commit", "during_table_commit", "after_table_commit"]


@pytest.mark.parametrize("table_consumer", ["iceberg", "delta"], indirect=True)
@pytest.mark.parametrize("point", POINTS)
def test_kill_around_the_table_commit_reruns_to_exactly_once(point, table_consumer):
    consumer, produced, _ = table_consumer
    proxy = consumer.proxy
    before = consumer.commits()
    extra: tuple[str, ...] = ()
    if point == "before_table_commit":  # the report write applied, its answer held: the table commit comes next
        proxy.hold = ("UpdateItem", "SET pending_report_owner", "after")
    elif point == "after_table_commit":  # the table holds batch 2; the checkpoint write is held
        proxy.hold = ("PutItem", "#CKPT#", "before")
    else:  # the library's commit applied and the process died inside the call
        extra = ("--die-after-table-commit",)
    proc = consumer.start(*extra)
    if point == "during_table_commit":
        assert proc.wait(timeout=300) != 0
        assert "table commit applied; killing this process" in consumer.last_log()
    else:
        assert proxy.held.wait(300), f"{point} never reached:\n{consumer.last_log()[-3000:]}"
        kill_group(proc)
        proxy.hold = None
    head = consumer.store.head()
    assert head.committed_batch_id == 1 and head.pending_batch_id == 2  # ATOM: the checkpoints did not move
    in_table = consumer.commits()
    if point == "before_table_commit":
        assert in_table == before  # nothing of batch 2 in the table
    else:
        assert [c for c in in_table if c] == [*[c for c in before if c], "2"]  # the table commit applied

    time.sleep(LEASE + 0.2)  # the killed run's lease expires
    summary = consumer.run()
    assert summary["status"] == "committed" and summary["batch_id"] == 2 and summary["reused_plan"], summary
    assert summary["table"]["already_committed"] is (point != "before_table_commit")
    assert "committing without re-running Spark" in consumer.last_log()  # the report was recorded: no second job
    consumer.check_table(produced)
    assert [c for c in consumer.commits() if c] == [*[c for c in before if c], "2"]  # one commit of batch 2


@pytest.mark.parametrize("table_consumer", ["iceberg", "delta"], indirect=True)
def test_two_concurrent_runs_make_one_table_commit_and_one_clear_conflict(table_consumer):
    """Run A is held after its table commit (before its checkpoint write) and stalls past its
    lease; run B takes the batch over, finds it in the table (no second table commit) and commits
    the checkpoints; when A resumes, its checkpoint commit fails naming the conflict."""
    consumer, produced, _ = table_consumer
    proxy = consumer.proxy
    before = [c for c in consumer.commits() if c]
    proxy.hold = ("PutItem", "#CKPT#", "before")
    a = consumer.start()
    assert proxy.held.wait(300), consumer.last_log()[-3000:]
    a_log = consumer.log_dir / f"run{consumer.runs:03d}.log"
    time.sleep(LEASE + 0.2)
    b = consumer.run()  # B: the same consumer, while A is stalled
    assert b["status"] == "committed" and b["batch_id"] == 2 and b["table"]["already_committed"], b
    proxy._release.set()  # A's held write is dropped; its retry meets B's commit
    assert a.wait(timeout=120) == 1
    outcome = json.loads(a_log.read_text().strip().splitlines()[-1])
    assert any(name in outcome["error"] for name in ("CheckpointConflictError", "AirflowFailException")), outcome
    assert "batch 2" in outcome["error"] or "Batch 2" in outcome["error"], outcome
    consumer.check_table(produced)
    assert [c for c in consumer.commits() if c] == [*before, "2"]  # exactly one table commit of batch 2
