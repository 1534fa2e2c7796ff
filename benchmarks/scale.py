"""``make bench`` section "scale in shards": the fixed cost of a micro-batch at 4, 64 and 256 shards.

Issue 17 (item 5): per shard count, on a fresh moto stream behind the limits proxy,

* a **no-data run**: the operator's ``execute`` when no record arrived since the last batch
  (list shards, read the committed checkpoints, plan, one probe per shard, no Spark job, no
  commit), and
* a **small batch**: about ``records_per_shard`` new user records in every shard, read end to end
  by a warm Spark Connect session (plan, probes, ``begin``, the job, the report, the commit with
  its KCL-style mirror of one item per shard).

Each figure is the median of ``repeat`` runs (wall time of ``execute``, seconds). Before the
measured runs each stream gets an unmeasured first run (creates the checkpoint table, records
the new shards' starting positions) and an unmeasured small batch (the Spark Connect session
has run this stream's batch shape once), as a running pipeline would have.

Targets: the no-data run at 256 shards under 2 s; the warm small batch at 256 shards within 3x
the 4-shard one.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil

from benchmarks.workload import load_backlog

__all__ = ["SHARD_COUNTS", "run_scale", "scale_markdown", "scale_targets"]

#: The shard counts of the section (issue 17, item 5).
SHARD_COUNTS = (4, 64, 256)


class _PoolWarnings(logging.Handler):
    """Counts urllib3's "Connection pool is full" warnings while a run is measured."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "Connection pool is full" in record.getMessage():
            self.count += 1


def _cpu(process: psutil.Process | None) -> float:
    """User + system CPU seconds of ``process`` so far (0 without one)."""
    if process is None:
        return 0.0
    times = process.cpu_times()
    return times.user + times.system


def run_scale(
    kinesis: Any,
    ingest: Callable[..., tuple[dict[str, Any], float]],
    new_stream: Callable[[Any, str, int], None],
    lines: list[bytes],
    work: Path,
    *,
    shard_counts: Sequence[int] = SHARD_COUNTS,
    records_per_shard: int = 20,
    repeat: int = 3,
    log: Callable[[str], None] = print,
    emulator: psutil.Process | None = None,
) -> dict[str, Any]:
    """Measure the no-data run and the warm small batch at each shard count (see the module doc).

    :param kinesis: boto3 Kinesis client on the emulator (to create streams and put records).
    :param ingest: ``benchmarks.run.ingest``: one ``execute`` of the operator, ``(summary, seconds)``.
    :param new_stream: creates a stream of N shards and waits until it is active.
    :param lines: user record payloads (the shared access log).
    :param work: a scratch directory for the output.
    :param records_per_shard: new user records per shard in each small batch (about).
    :param repeat: measured runs of each kind per shard count (median).
    :param emulator: the emulator's process: its CPU time (user + system, seconds) during each
        no-data run is recorded (``no_data_emulator_cpu``), what the emulator itself costs.
    :returns: ``{"records_per_shard", "repeat", "runs": {shards: {"no_data": [s], "small": [s],
        "records": [n]}}, "median_s": {shards: {"no_data": s, "small": s}}, "pool_full_warnings": n}``
        (shard counts as strings: JSON keys).
    :raises SystemExit: a run did not end as expected (a no-data run that committed, a small
        batch that read another number of records than were put).
    """
    pool = _PoolWarnings()
    logging.getLogger("urllib3").addHandler(pool)
    runs: dict[str, dict[str, list[float]]] = {}
    try:
        for shards in shard_counts:
            stream = f"bench-scale-{shards}"
            new_stream(kinesis, stream, shards)
            out = work / f"out-{stream}"
            started = time.monotonic()
            ingest(stream, out)  # creates the checkpoint table, records the new shards' start; not measured
            load_backlog(kinesis, stream, 0, lines, user_records=shards * records_per_shard)
            ingest(stream, out, connect=True)  # the session's first batch of this stream; not measured
            log(f"scale {shards} shards: ready in {time.monotonic() - started:.1f}s")
            figures: dict[str, list[float]] = {"no_data": [], "no_data_emulator_cpu": [], "small": [], "records": []}
            for _ in range(repeat):
                cpu = _cpu(emulator)
                summary, wall = ingest(stream, out)
                figures["no_data_emulator_cpu"].append(_cpu(emulator) - cpu)
                if summary.get("status") != "no_new_records":
                    raise SystemExit(f"scale {shards}: a run without new records ended {summary.get('status')!r}")
                figures["no_data"].append(wall)
                loaded = load_backlog(kinesis, stream, 0, lines, user_records=shards * records_per_shard)
                summary, wall = ingest(stream, out, connect=True)
                if summary.get("status") != "committed" or summary.get("records") != loaded["user_records"]:
                    raise SystemExit(f"scale {shards}: the small batch ended {summary.get('status')!r} with "
                                     f"{summary.get('records')} records, {loaded['user_records']} were put")  # fmt: skip
                figures["small"].append(wall)
                figures["records"].append(loaded["user_records"])
            runs[str(shards)] = figures
            log(f"scale {shards} shards: {figures}")
    finally:
        logging.getLogger("urllib3").removeHandler(pool)
    return {
        "records_per_shard": records_per_shard,
        "repeat": repeat,
        "runs": runs,
        "median_s": {k: {"no_data": statistics.median(v["no_data"]), "small": statistics.median(v["small"])} for k, v in runs.items()},
        "pool_full_warnings": pool.count,
    }


def scale_headline(scale: dict[str, Any]) -> dict[str, Any]:
    """The headline's ``scale`` field: per shard count, the median no-data run and small batch (s)."""
    return {k: {"no_data_s": round(v["no_data"], 2), "small_batch_s": round(v["small"], 2)} for k, v in scale["median_s"].items()}


def scale_targets(scale: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """Issue 17's targets for the section, each with the measured value and whether it is met."""
    medians = scale["median_s"]
    counts = sorted(medians, key=int)
    low, high = counts[0], counts[-1]
    ratio = medians[high]["small"] / medians[low]["small"]
    return [
        (f"no-data run at {high} shards < 2 s", f"{medians[high]['no_data']:.2f} s", medians[high]["no_data"] < 2.0),
        (f"warm small batch at {high} shards <= 3x the {low}-shard one", f"{ratio:.2f}x", ratio <= 3.0),
        ("no connection-pool warnings", str(scale["pool_full_warnings"]), scale["pool_full_warnings"] == 0),
    ]


def scale_markdown(scale: dict[str, Any]) -> list[str]:
    """The section's lines of ``docs/benchmarks.md`` (a paragraph and a table)."""
    rows = [
        "| shards | no-data run, median (s) | runs (s) | moto's CPU in a no-data run, median (s) | small batch, warm, median (s) "
        "| runs (s) | records per batch |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for shards, figures in sorted(scale["runs"].items(), key=lambda kv: int(kv[0])):
        medians = scale["median_s"][shards]
        rows.append(
            f"| {shards} | {medians['no_data']:.2f} | {', '.join(f'{x:.2f}' for x in figures['no_data'])} | "
            f"{statistics.median(figures.get('no_data_emulator_cpu') or [0.0]):.2f} | {medians['small']:.2f} | {', '.join(f'{x:.2f}' for x in figures['small'])} | "
            f"{statistics.median(figures['records']):,.0f} |"
        )
    return [
        f"The same stream shape at several shard counts, each on a fresh stream behind the limits proxy; median of "
        f"{scale['repeat']} runs each. A no-data run lists the shards, reads the checkpoints, plans and probes every "
        "shard (`GetRecords` with `Limit` 1, in parallel on as many threads as the Kinesis client pools connections), "
        f"and ends without a Spark job or a commit. A small batch is about {scale['records_per_shard']} new user records "
        "per shard, end to end over the warm Spark Connect session (plan, probes, the job, the report, the commit and "
        "its KCL-style item per shard). Each stream ran one unmeasured first run and one unmeasured small batch before. "
        f"\"Connection pool is full\" warnings logged during the section: {scale['pool_full_warnings']}. A run's "
        "probes are two calls per shard (`GetShardIterator`, `GetRecords`), 512 at 256 shards, and every call costs "
        "the emulator (moto in server mode, one process) CPU time of its own: the column gives moto's CPU seconds "
        "during each no-data run, a floor under that run's time on this machine that the service does not have.",
        "",
        *rows,
    ]
