"""Leftovers (``sinks.leftovers``, ``kinesis-spark leftovers``) on real outputs: Parquet folders with
committed records, Iceberg tables (pyiceberg, SQL catalog on SQLite) and Delta tables (deltalake),
with files written as the Spark job lays them out (pyarrow writes them here: no Spark) and
committed with the sinks themselves. Scenarios: superseded attempts of a batch, killed drivers'
staging folders, window re-runs. After every removal each committed reference still exists and
the output reads back identical; the pending batch's folder and the files of every snapshot stay.

The staging sweep after a checkpoint commit runs through the real protocol (moto over HTTP)."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from deltalake import DeltaTable

from airflow_kinesis_spark.cli import main as cli
from airflow_kinesis_spark.core.job import staging_location
from airflow_kinesis_spark.core.planner import BatchPlan
from airflow_kinesis_spark.core.positions import format_timestamp
from airflow_kinesis_spark.core.locations import planned_output_location
from airflow_kinesis_spark.core.protocol import IncrementalSettings, run_incremental
from airflow_kinesis_spark.core.schema import arrow_schema
from airflow_kinesis_spark.sinks.build import build_sink
from airflow_kinesis_spark.sinks.leftovers import find_leftovers, remove_leftovers, scan_leftovers
from airflow_kinesis_spark.sinks.parquet import committed_files
from tests.conftest import create_stream
from tests.helpers import InProcessJob, read_plan

pytestmark = pytest.mark.integration

DAY = datetime(2026, 11, 20, tzinfo=timezone.utc)
STREAM, CONSUMER = "clicks", "lake"


# -- outputs as the job and the sinks make them ---------------------------------------------


def rows(first: int, count: int, *, delta: bool, start: datetime | None = None) -> pa.Table:
    """``count`` rows with sequence numbers from ``first``, one a second from ``start``."""
    start = start or DAY + timedelta(minutes=first)
    columns = {
        "stream_name": [STREAM] * count, "shard_id": ["shardId-000000000000"] * count,
        "sequence_number": [f"{first + i:010d}" for i in range(count)], "sub_sequence_number": [None] * count,
        "partition_key": ["k"] * count, "explicit_hash_key": [None] * count,
        "approximate_arrival_timestamp": [start + timedelta(seconds=i) for i in range(count)], "data": [b"x" * 100] * count,
    }  # fmt: skip
    table = pa.table(columns, schema=arrow_schema())
    return table.append_column("arrival_date", pa.array([DAY.date()] * count, pa.date32())) if delta else table


def write_files(folder: Path, table: pa.Table, files: int = 1) -> list[Path]:
    """``table`` split into ``files`` Parquet files under ``folder/_p0=<day>`` (as the job writes
    one partition per file), each with the ``.crc`` file Hadoop's local file system writes."""
    part = folder / f"_p0={DAY.date().isoformat()}"
    part.mkdir(parents=True, exist_ok=True)
    paths = []
    step = -(-table.num_rows // files)
    for i in range(files):
        path = part / f"part-{i:05d}-{folder.name[-8:]}.snappy.parquet"
        pq.write_table(table.slice(i * step, step), path)
        (part / f".{path.name}.crc").write_bytes(b"crc")
        paths.append(path)
    return paths


def make_plan(root: Path, batch_id: int, *, created: datetime | None = None, table: bool = True) -> BatchPlan:
    plan = BatchPlan(batch_id=batch_id, stream_name=STREAM, consumer_name=CONSUMER, cutoff=DAY + timedelta(days=1),
                     created_at=created or DAY + timedelta(minutes=batch_id), ranges=(), checkpoints={}, output_location="",
                     checkpoint_table="ckpt")  # fmt: skip
    return replace(plan, output_location=planned_output_location(str(root), plan, build_sink("delta", str(root)) if table else None))


def window_plan(root: Path, start: datetime, end: datetime, run: str) -> BatchPlan:
    from airflow_kinesis_spark.core.locations import window_output_location

    return BatchPlan(batch_id=0, stream_name=STREAM, consumer_name=CONSUMER, cutoff=end, created_at=DAY, ranges=(),
                     checkpoints={}, output_location=f"{window_output_location(str(root), start, end)}/run={run}", mode="window",
                     window_start=start)  # fmt: skip


def run_name(when: datetime, suffix: str) -> str:
    return f"{format_timestamp(when).replace(':', '').replace('-', '')}-{suffix}"


def catalog(tmp_path: Path) -> dict[str, str]:
    return {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/warehouse"}


def table_sink(output_format: str, root: Path, tmp_path: Path):
    if output_format == "iceberg":
        return build_sink("iceberg", str(root), table="lake.clicks", catalog_properties=catalog(tmp_path))
    return build_sink("delta", str(root))


def references(sink) -> set[str]:
    """Every data file of every snapshot (Iceberg) or version (Delta) or committed record (Parquet)."""
    if sink.format == "parquet":
        return set(committed_files(sink.batch_root))
    if sink.format == "iceberg":
        table = sink.load()
        return {t.file.file_path.removeprefix("file://") for s in table.metadata.snapshots
                for t in table.scan(snapshot_id=s.snapshot_id).plan_files()}  # fmt: skip
    latest = DeltaTable(sink.uri).version()
    return {u.removeprefix("file://") for v in range(latest + 1) for u in DeltaTable(sink.uri, version=v).file_uris()}


def read_back(sink) -> list[tuple]:
    if sink.format == "parquet":
        table = pa.concat_tables([pq.read_table(f) for f in committed_files(sink.batch_root)])
    elif sink.format == "iceberg":
        table = sink.load().scan().to_arrow()
    else:
        table = pa.table(DeltaTable(sink.uri).to_pyarrow_table())
    return sorted(zip(table.column("sequence_number").to_pylist(), table.column("approximate_arrival_timestamp").to_pylist(),
                      strict=True))  # fmt: skip


def snapshot_state(sink) -> dict[str, list[tuple]]:
    """The rows of every snapshot / version (time travel), to compare before and after a removal."""
    if sink.format == "iceberg":
        table = sink.load()
        return {str(s.snapshot_id): sorted(table.scan(snapshot_id=s.snapshot_id).to_arrow().column("sequence_number").to_pylist())
                for s in table.metadata.snapshots}  # fmt: skip
    if sink.format == "delta":
        latest = DeltaTable(sink.uri).version()
        return {str(v): sorted(pa.table(DeltaTable(sink.uri, version=v).to_pyarrow_table()).column("sequence_number").to_pylist())
                for v in range(latest + 1)}  # fmt: skip
    return {}


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def assert_intact_after_removal(sink, before_rows, before_snapshots) -> None:
    refs = references(sink)
    missing = [r for r in refs if not os.path.exists(r)]
    assert refs and not missing, missing[:3]
    assert read_back(sink) == before_rows
    assert snapshot_state(sink) == before_snapshots


# -- tables -----------------------------------------------------------------------------------


@pytest.mark.parametrize("output_format", ["iceberg", "delta"])
def test_superseded_attempts_and_killed_drivers_of_a_table_are_removed_and_nothing_committed_is(output_format, tmp_path):
    """Batch 1 committed; batch 2 had an attempt of another plan (superseded: its checkpoints were
    discarded and re-planned) before the committed one; batch 3 committed; batch 4 is pending
    (published, not committed yet), and its driver's staging folder is live. Killed drivers left
    staging folders of batches 1 and 3. Only the dead attempt and the dead staging folders go."""
    root = tmp_path / "out"
    sink = table_sink(output_format, root, tmp_path)
    delta = output_format == "delta"
    plans = {}
    for batch_id in (1, 2, 3):
        plans[batch_id] = make_plan(root, batch_id)
        write_files(Path(plans[batch_id].output_location), rows(batch_id * 100, 30, delta=delta), files=2)
        assert not sink.commit_batch(plans[batch_id], []).already_committed
    dead = make_plan(root, 2, created=DAY)  # batch 2's first plan, superseded before its job's files were committed
    write_files(Path(dead.output_location), rows(200, 30, delta=delta), files=2)
    pending = make_plan(root, 4)
    write_files(Path(pending.output_location), rows(400, 30, delta=delta))
    killed = {b: Path(staging_location(plans[b].output_location, f"driver-{b}")) for b in (1, 3)}
    live = Path(staging_location(pending.output_location, "driver-4"))
    for folder in [*killed.values(), live]:
        write_files(folder, rows(900, 5, delta=delta))
    before_rows, before_snapshots, before_tree = read_back(sink), snapshot_state(sink), tree(root)

    scan = scan_leftovers(sink, STREAM, CONSUMER, min_age=0)
    assert scan.latest_batch_id == 3
    found = {item.path: item for item in scan.leftovers}
    assert set(found) == {dead.output_location, *map(str, killed.values())}, sorted(found)
    assert all(item.folder for item in found.values())
    size = sum(f.stat().st_size for f in Path(dead.output_location).rglob("*") if f.is_file())
    assert found[dead.output_location].size == size and "batch 2" in found[dead.output_location].reason
    assert tree(root) == before_tree  # a scan removes nothing

    removed = remove_leftovers(sink, scan.leftovers, STREAM, CONSUMER, min_age=0)
    assert {item.path for item in removed} == set(found)
    assert not Path(dead.output_location).exists() and not any(p.exists() for p in killed.values())
    assert Path(pending.output_location).is_dir() and live.is_dir()  # the pending batch and its live driver: kept
    assert_intact_after_removal(sink, before_rows, before_snapshots)
    gone = tuple(os.path.relpath(path, root) + "/" for path in found)
    assert tree(root) == {p for p in before_tree if not p.startswith(gone)}  # nothing else touched
    assert find_leftovers(sink, STREAM, CONSUMER, min_age=0) == []

    # The pending batch commits later: its folder is intact, and then its staging folder is a leftover.
    assert not sink.commit_batch(pending, []).already_committed
    assert [item.path for item in find_leftovers(sink, STREAM, CONSUMER, min_age=0)] == [str(live)]


@pytest.mark.parametrize("output_format", ["iceberg", "delta"])
def test_window_reruns_keep_every_snapshots_files_and_lose_only_unreferenced_runs(output_format, tmp_path):
    """A window run three times: runs 1 and 2 committed (each replacing the window's rows), run 3
    published and killed before its table commit; a killed driver's staging folder too. Runs 1 and 2
    are in the table's history (time travel): kept. Run 3 and the staging folder go once older than
    the minimum age; not before. For Iceberg, once the older snapshots are expired
    (``table.maintenance.expire_snapshots()``), run 1's files go too."""
    root = tmp_path / "out"
    sink = table_sink(output_format, root, tmp_path)
    delta = output_format == "delta"
    batch = make_plan(root, 1)
    write_files(Path(batch.output_location), rows(0, 40, delta=delta, start=DAY - timedelta(hours=2)))
    sink.commit_batch(batch, [])
    start, end = DAY, DAY + timedelta(hours=1)
    runs = [window_plan(root, start, end, run_name(DAY + timedelta(hours=2, minutes=i), f"0000000{i}")) for i in (1, 2, 3)]
    for i, run in enumerate(runs):
        write_files(Path(run.output_location), rows(1000, 60, delta=delta, start=start), files=2)  # the same rows each run
        if i < 2:
            sink.commit_window(run, [])
    staging = Path(staging_location(runs[2].output_location, "killed-driver"))
    write_files(staging, rows(1000, 60, delta=delta, start=start))
    before_rows, before_snapshots = read_back(sink), snapshot_state(sink)
    assert len(before_rows) == 100

    if output_format == "iceberg":  # another table (a wrong --table or catalog) references none of the runs: no run counts
        other = build_sink("iceberg", str(root), table="lake.other", catalog_properties=catalog(tmp_path))
        assert [item.path for item in find_leftovers(other, STREAM, CONSUMER, min_age=0)] == [str(staging)]  # never referenced
    young = scan_leftovers(sink, STREAM, CONSUMER)  # just written: a window run may still commit them
    assert young.leftovers == () and any(runs[2].output_location.rsplit("/", 1)[1] in note for note in young.kept)
    later = datetime.now(timezone.utc) + timedelta(days=2)
    found = find_leftovers(sink, STREAM, CONSUMER, now=later)
    assert sorted(item.path for item in found) == sorted([runs[2].output_location, str(staging)])
    remove_leftovers(sink, found, STREAM, CONSUMER, now=later)
    assert Path(runs[0].output_location).is_dir() and Path(runs[1].output_location).is_dir()  # in the table's history
    assert not Path(runs[2].output_location).exists() and not staging.exists()
    assert_intact_after_removal(sink, before_rows, before_snapshots)

    if output_format == "iceberg":
        table = sink.load()
        table.maintenance.expire_snapshots().older_than(datetime.now(timezone.utc) + timedelta(seconds=1)).commit()
        assert len(sink.load().metadata.snapshots) == 1  # the current one (the branch head) stays
        found = find_leftovers(sink, STREAM, CONSUMER, now=later)
        assert [item.path for item in found] == [runs[0].output_location], found
        remove_leftovers(sink, found, STREAM, CONSUMER, now=later)
        assert read_back(sink) == before_rows and all(os.path.exists(r) for r in references(sink))


def test_delta_references_survive_log_cleanup_through_the_checkpoint(tmp_path):
    """Once the log's commit files are cleaned up (``cleanup_metadata`` after a checkpoint), the
    checkpoint holds the current files, the tombstones of removed ones (vacuum's business) and the
    consumer's transaction: a window run replaced by a re-run stays, and so does the latest batch."""
    root = tmp_path / "out"
    sink = table_sink("delta", root, tmp_path)
    batch = make_plan(root, 1)
    write_files(Path(batch.output_location), rows(0, 30, delta=True, start=DAY - timedelta(hours=2)))
    sink.commit_batch(batch, [])
    start, end = DAY, DAY + timedelta(hours=1)
    runs = [window_plan(root, start, end, run_name(DAY + timedelta(hours=2, minutes=i), f"0000000{i}")) for i in (1, 2)]
    for run in runs:
        write_files(Path(run.output_location), rows(1000, 60, delta=True, start=start))
        sink.commit_window(run, [])
    table = DeltaTable(str(root))
    table.alter.set_table_properties({"delta.logRetentionDuration": "interval 0 seconds"})
    table = DeltaTable(str(root))
    table.create_checkpoint()
    table.cleanup_metadata()
    assert not (root / "_delta_log" / "00000000000000000001.json").exists()  # run 1's add action is gone from the log
    dead = make_plan(root, 1, created=DAY - timedelta(days=1))
    write_files(Path(dead.output_location), rows(0, 30, delta=True))
    before_rows = read_back(sink)
    later = datetime.now(timezone.utc) + timedelta(days=2)
    scan = scan_leftovers(sink, STREAM, CONSUMER, now=later)
    assert scan.latest_batch_id == 1 and scan.references == 3  # batch 1, run 2, and run 1's tombstone
    assert [item.path for item in scan.leftovers] == [dead.output_location]
    remove_leftovers(sink, scan.leftovers, STREAM, CONSUMER, now=later)
    assert Path(runs[0].output_location).is_dir() and read_back(sink) == before_rows


def test_a_table_folder_with_a_referenced_file_loses_only_its_unreferenced_files(tmp_path):
    """A folder one of whose files is referenced (a zombie wrote an extra file into it after the
    commit): the extra file and its .crc go, the folder, its referenced files and its dead letters stay."""
    root = tmp_path / "out"
    sink = table_sink("delta", root, tmp_path)
    plans = [make_plan(root, b) for b in (1, 2)]
    for plan in plans:
        write_files(Path(plan.output_location), rows(plan.batch_id * 100, 20, delta=True))
        sink.commit_batch(plan, [])
    folder = Path(plans[0].output_location)
    (folder / "_quarantine").mkdir()
    pq.write_table(pa.table({"data": [b"bad"], "reason": ["not JSON"]}), folder / "_quarantine" / "part-0.parquet")
    extra = write_files(folder / "stray", rows(5000, 5, delta=True))[0]
    before = read_back(sink)
    found = find_leftovers(sink, STREAM, CONSUMER, min_age=0)
    assert sorted(item.path for item in found) == sorted([str(extra), str(extra.parent / f".{extra.name}.crc")])
    remove_leftovers(sink, found, STREAM, CONSUMER, min_age=0)
    assert not extra.exists() and not (extra.parent / f".{extra.name}.crc").exists() and folder.is_dir()
    assert (folder / "_quarantine" / "part-0.parquet").exists() and read_back(sink) == before


def test_a_batch_without_referenced_files_keeps_its_dead_letters(tmp_path):
    """Batch 2 had only dead letters (no table commit: nothing to add) and batch 3 committed:
    batch 2's ``_quarantine`` may be the committed batch's, so it stays."""
    root = tmp_path / "out"
    sink = table_sink("iceberg", root, tmp_path)
    for b in (1, 3):
        plan = make_plan(root, b)
        write_files(Path(plan.output_location), rows(b * 100, 20, delta=False))
        sink.commit_batch(plan, [])
    quarantined = Path(make_plan(root, 2).output_location) / "_quarantine"
    quarantined.mkdir(parents=True)
    pq.write_table(pa.table({"data": [b"bad"]}), quarantined / "part-0.parquet")
    scan = scan_leftovers(sink, STREAM, CONSUMER, min_age=0)
    assert scan.leftovers == () and any("_quarantine" in note for note in scan.kept)


def test_without_any_committed_batch_nothing_is_a_leftover(tmp_path):
    """No table yet (the first batch is pending): its folder and its staging folder stay."""
    root = tmp_path / "out"
    sink = table_sink("iceberg", root, tmp_path)
    plan = make_plan(root, 1)
    write_files(Path(plan.output_location), rows(0, 10, delta=False))
    write_files(Path(staging_location(plan.output_location, "d")), rows(0, 10, delta=False))
    scan = scan_leftovers(sink, STREAM, CONSUMER, min_age=0)
    assert scan.latest_batch_id is None and scan.leftovers == ()


def test_a_shared_output_is_cleaned_under_the_consumers_own_folder_only(tmp_path):
    """Two consumers share a Delta table (``shared_output``): the leftovers of one are found under its
    folder only; the other's dead attempt of the same batch id stays for its own scan."""
    root = tmp_path / "out"
    sinks = {c: build_sink("delta", str(root), shared_output=True, stream_name=STREAM, consumer_name=c) for c in ("one", "two")}
    dead = {}
    for consumer, sink in sinks.items():
        batch_root = Path(sink.batch_root)
        plan = replace(make_plan(batch_root, 1), consumer_name=consumer)
        plan = replace(plan, output_location=planned_output_location(str(batch_root), plan, sink))
        write_files(Path(plan.output_location), rows(100 if consumer == "one" else 500, 10, delta=True))
        sink.commit_batch(plan, [])
        dead[consumer] = replace(plan, created_at=DAY - timedelta(days=1))
        dead[consumer] = replace(dead[consumer], output_location=planned_output_location(str(batch_root), dead[consumer], sink))
        write_files(Path(dead[consumer].output_location), rows(100, 10, delta=True))
    found = find_leftovers(sinks["one"], STREAM, "one", min_age=0)
    assert [item.path for item in found] == [dead["one"].output_location]
    before = read_back(sinks["one"])
    remove_leftovers(sinks["one"], found, STREAM, "one", min_age=0)
    assert not Path(dead["one"].output_location).exists()
    assert Path(dead["two"].output_location).is_dir() and read_back(sinks["one"]) == before


# -- Parquet ----------------------------------------------------------------------------------


def commit_parquet(sink, plan: BatchPlan, count: int) -> None:
    """As the protocol does after the checkpoint commit: the committed record (the sink reads the
    reports' record counts only)."""
    from types import SimpleNamespace

    sink.after_checkpoint_commit(plan, [SimpleNamespace(records=count)])


def test_parquet_staging_of_killed_drivers_and_unlisted_files_go_committed_records_and_unrecorded_batches_stay(tmp_path):
    """Batches 2 and 3 committed (with committed records); batch 1 is a batch of an earlier version
    (no committed record): kept. Killed drivers' staging folders of batches 2 and 3 go, the pending
    batch 4's folder and staging stay, a window's own folder stays, a window's staging folder goes
    once old enough."""
    root = tmp_path / "out"
    sink = build_sink("parquet", str(root))
    write_files(root / "batch_id=1", rows(100, 10, delta=False))  # committed before committed records existed
    for b in (2, 3):
        plan = make_plan(root, b, table=False)
        write_files(Path(plan.output_location), rows(b * 100, 10, delta=False), files=2)
        commit_parquet(sink, plan, 10)
    stray = write_files(root / "batch_id=3" / "late", rows(7000, 3, delta=False))[0]  # a zombie's file after the commit
    killed = [Path(staging_location(f"{root}/batch_id={b}", f"d{b}")) for b in (2, 3)]
    pending = [root / "batch_id=4", Path(staging_location(f"{root}/batch_id=4", "d4"))]
    window = root / "window=20261120T000000Z-20261120T010000Z"
    window_staging = Path(staging_location(str(window), "w"))
    for folder in [*killed, *pending, window, window_staging]:
        write_files(folder, rows(9000, 3, delta=False))
    before = read_back(sink)
    later = datetime.now(timezone.utc) + timedelta(days=2)

    scan = scan_leftovers(sink, now=later)
    assert scan.latest_batch_id == 3
    expected = {*map(str, killed), str(window_staging), str(stray), str(stray.parent / f".{stray.name}.crc")}
    assert {item.path for item in scan.leftovers} == expected, sorted(item.path for item in scan.leftovers)
    assert any(note.startswith("batch_id=1:") for note in scan.kept)
    remove_leftovers(sink, scan.leftovers, now=later)
    assert all(p.exists() for p in [*pending, window, root / "batch_id=1"]) and not any(p.exists() for p in killed)
    assert (root / "_committed" / "batch_id=3" / "manifest").exists() and (root / "_committed" / "batch_id=3" / "_batch.json").exists()
    assert read_back(sink) == before and all(os.path.exists(f) for f in committed_files(str(root)))


# -- the command ------------------------------------------------------------------------------


def test_the_command_lists_by_default_and_removes_with_delete_yes(tmp_path):
    root = tmp_path / "out"
    sink = table_sink("iceberg", root, tmp_path)
    plans = [make_plan(root, b) for b in (1, 2)]
    for plan in plans:
        write_files(Path(plan.output_location), rows(plan.batch_id * 100, 20, delta=False))
        sink.commit_batch(plan, [])
    dead = make_plan(root, 1, created=DAY - timedelta(days=1))
    write_files(Path(dead.output_location), rows(100, 20, delta=False))
    sink.claim(STREAM, CONSUMER)  # the owner record a task writes: the command reads format, table, stream, consumer from it
    args = ["leftovers", "--output-path", str(root), *sum((["--catalog-property", f"{k}={v}"] for k, v in catalog(tmp_path).items()), [])]
    before = read_back(sink)

    listed = CliRunner(env={"COLUMNS": "200"}).invoke(cli, args)
    assert listed.exit_code == 0, listed.output
    assert "batch_id=1-" in listed.output and "dry run" in listed.output.lower() and Path(dead.output_location).is_dir()

    as_json = CliRunner().invoke(cli, [*args, "--json"])
    data = json.loads(as_json.stdout)
    assert [item["path"] for item in data["leftovers"]] == [dead.output_location] and data["dry_run"] and data["bytes"] > 0
    assert data["latest_batch_id"] == 2 and data["removed"] == []

    refused = CliRunner().invoke(cli, [*args, "--delete"], input="y\n")  # stdin is not a terminal: --yes is needed
    assert refused.exit_code == 2 and "pass --yes" in refused.output and Path(dead.output_location).is_dir()

    done = CliRunner().invoke(cli, [*args, "--delete", "--yes", "--json"])
    assert done.exit_code == 0, done.output
    result = json.loads(done.stdout)
    assert [item["path"] for item in result["removed"]] == [dead.output_location] and not result["dry_run"]
    assert not Path(dead.output_location).exists() and read_back(sink) == before

    wrong = CliRunner().invoke(cli, ["leftovers", "--output-path", str(root), "--output-format", "delta"])
    assert wrong.exit_code == 1 and "iceberg" in wrong.output, wrong.output


# -- the staging sweep after a checkpoint commit ----------------------------------------------


class WritingJob(InProcessJob):
    """A job without Spark (``tests.helpers.InProcessJob``): reads each range with the real reader
    and writes the rows as one Parquet file into its staging location, which it then publishes."""

    def __init__(self, kinesis, dynamodb) -> None:
        super().__init__(dynamodb)
        self.kinesis = kinesis

    def write_reports(self, plan: BatchPlan, location: str):
        found, reports = read_plan(self.kinesis, plan)
        folder = Path(location)
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"sequence_number": [r[1] for r in found]}), folder / "part-00000.parquet")
        return reports


def test_a_checkpoint_commit_sweeps_the_staging_folders_of_committed_batches(kinesis, dynamodb, unique_name, tmp_path):
    """Killed drivers of batch 1 (this one) and of an earlier batch left staging folders: the
    commit of batch 1 removes them; a later batch's and a window's staging folders stay."""
    from demo.producer import put_plain

    from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore

    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [(f"k{i}", f"r {i}".encode()) for i in range(5)])
    store = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_ckpt", unique_name, "lake")
    store.ensure_table()
    root = tmp_path / "out"
    staging = root / "_staging"
    dead = [staging / "batch_id=1-0123456789abcdef", staging / "batch_id=0-fedcba9876543210"]
    kept = [staging / "batch_id=2-0123456789abcdef", staging / "window=20261120T000000Z-20261120T010000Z-0123456789abcdef"]
    for folder in dead + kept:
        folder.mkdir(parents=True)
        (folder / "part-00000.parquet").write_bytes(b"partial")
    settings = IncrementalSettings(stream_name=unique_name, consumer_name="lake", output_root=str(root),
                                   cutoff=datetime.now(timezone.utc), min_call_interval=0.0,
                                   sink=build_sink("parquet", str(root)))  # fmt: skip
    summary = run_incremental(kinesis, store, WritingJob(kinesis, dynamodb), settings, "run-1")
    assert summary["status"] == "committed" and summary["batch_id"] == 1
    assert (root / "_committed" / "batch_id=1" / "manifest").exists()
    assert [p.name for p in dead if p.exists()] == []
    assert all(p.is_dir() for p in kept)


# -- on S3 (moto) -----------------------------------------------------------------------------


def test_the_command_on_s3_removes_a_delta_tables_leftovers_and_keeps_its_files(moto_endpoint, unique_name, monkeypatch):
    """A Delta table on moto's S3 (``s3a://`` root, as Spark names it): the command takes the
    credentials from the default chain and the endpoint from ``--storage-option``; it removes the
    dead attempt and the killed driver's staging folder, and nothing the table references."""
    import io

    import boto3

    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket=unique_name)
    endpoint = {"AWS_ENDPOINT_URL": moto_endpoint, "AWS_ALLOW_HTTP": "true", "aws_conditional_put": "etag"}
    storage = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1", **endpoint}
    root = f"s3a://{unique_name}/delta"
    sink = build_sink("delta", root, storage_options=storage)

    def put(location: str, table: pa.Table) -> None:
        body = io.BytesIO()
        pq.write_table(table, body)
        key = location.split("/", 3)[3] + f"/_p0={DAY.date().isoformat()}/part-00000.snappy.parquet"
        s3.put_object(Bucket=unique_name, Key=key, Body=body.getvalue())

    plans = [make_plan(Path("/x"), b) for b in (1, 2)]
    plans = [replace(p, output_location=planned_output_location(root, p, sink)) for p in plans]
    for plan in plans:
        put(plan.output_location, rows(plan.batch_id * 100, 10, delta=True))
        sink.commit_batch(plan, [])
    dead = replace(plans[0], created_at=DAY - timedelta(days=1))
    dead = replace(dead, output_location=planned_output_location(root, dead, sink))
    killed = staging_location(plans[1].output_location, "killed")
    pending = replace(make_plan(Path("/x"), 3), output_location="")
    pending = replace(pending, output_location=planned_output_location(root, pending, sink))
    for location in (dead.output_location, killed, pending.output_location):
        put(location, rows(900, 3, delta=True))
    sink.claim(STREAM, CONSUMER)
    before = sorted(pa.table(DeltaTable(f"s3://{unique_name}/delta", storage_options=storage).to_pyarrow_table())
                    .column("sequence_number").to_pylist())  # fmt: skip

    args = ["leftovers", "--output-path", root, *sum((["--storage-option", f"{k}={v}"] for k, v in endpoint.items()), []), "--json"]
    listed = json.loads(CliRunner().invoke(cli, args).stdout)
    assert sorted(item["path"] for item in listed["leftovers"]) == sorted([dead.output_location, killed])
    done = CliRunner().invoke(cli, [*args, "--delete", "--yes"])
    assert done.exit_code == 0, done.output
    assert sorted(item["path"] for item in json.loads(done.stdout)["removed"]) == sorted([dead.output_location, killed])
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=unique_name)["Contents"]}
    prefix = lambda location: location.split("/", 3)[3] + "/"  # noqa: E731
    assert not any(k.startswith((prefix(dead.output_location), prefix(killed))) for k in keys)
    assert all(any(k.startswith(prefix(p.output_location)) for k in keys) for p in (*plans, pending))
    table = DeltaTable(f"s3://{unique_name}/delta", storage_options=storage)
    assert sorted(pa.table(table.to_pyarrow_table()).column("sequence_number").to_pylist()) == before
