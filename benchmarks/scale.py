"""``make bench`` section "scale in shards": the fixed cost of a micro-batch at 4 to 4,096 shards.

Issue 17 (item 5) and issue 31 (item 2): per shard count, on a fresh moto stream behind the
limits proxy,

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

Each entry also gives ``kinesis_calls_per_idle_shard``: the Kinesis calls the operator made in a
no-data run (every shard idle) divided by the shard count.

Targets: the no-data run at 256 shards under 2 s; the warm small batch at 256 shards within 3x
the 4-shard one (issue 17); the time per shard at the largest count at most 1.2x that at 256
shards, for the no-data run and the small batch; fewer than 2 Kinesis calls per idle shard
(issue 31).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import botocore.client
import psutil

from benchmarks.workload import load_backlog

__all__ = ["SHARD_COUNTS", "calls_per_idle_shard", "run_scale", "scale_headline", "scale_markdown", "scale_targets"]

#: The shard counts of the section (issue 17, item 5; 1,024 and 4,096: issue 31, item 2).
SHARD_COUNTS = (4, 64, 256, 1024, 4096)
#: The shard count the larger ones' time per shard is compared with (issue 31's target: at most 1.2x).
BASE_SHARDS = 256
PER_SHARD_MAX_RATIO = 1.2


class _PoolWarnings(logging.Handler):
    """Counts urllib3's "Connection pool is full" warnings while a run is measured."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "Connection pool is full" in record.getMessage():
            self.count += 1


class _CallCounter:
    """Counts the AWS API calls this process makes (every botocore client: the operator's probes,
    listing and checkpoint store), by ``service.Operation``, while it is entered. The Spark job's
    calls are made by Spark's Python workers, other processes: not counted here."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._original: Any = None

    def __enter__(self) -> _CallCounter:
        original = self._original = botocore.client.BaseClient._make_api_call
        counts = self.counts

        def counted(client: Any, operation: str, params: Any) -> Any:
            counts[f"{client.meta.service_model.service_name}.{operation}"] += 1
            return original(client, operation, params)

        botocore.client.BaseClient._make_api_call = counted  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        botocore.client.BaseClient._make_api_call = self._original  # type: ignore[method-assign]

    def take(self) -> dict[str, int]:
        """The counts since the last take, sorted by name; resets them."""
        taken = dict(sorted(self.counts.items()))
        self.counts.clear()
        return taken


def _kinesis_reads(stats: Callable[[], Mapping[str, int]] | None) -> int:
    """``GetShardIterator`` plus ``GetRecords`` calls the limits proxy served so far (0 without it)."""
    if stats is None:
        return 0
    counts = stats()
    return counts.get("GetShardIterator", 0) + counts.get("GetRecords", 0)


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
    proxy: psutil.Process | None = None,
    proxy_stats: Callable[[], Mapping[str, int]] | None = None,
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
    :param proxy: the limits proxy's process: its CPU time in each no-data run
        (``no_data_proxy_cpu``); this process's (the operator's) is ``no_data_operator_cpu``.
    :param proxy_stats: returns the limits proxy's counts now (``LimitsProxyProcess.stats``): the Kinesis reads
        (``GetShardIterator`` + ``GetRecords``) it served during each small batch, the Spark job's
        included (``small_kinesis_reads``).
    :returns: ``{"records_per_shard", "repeat", "runs": {shards: {"no_data": [s], "small": [s],
        "records": [n], "no_data_calls": [{service.Operation: n}], "small_calls": [...],
        "small_kinesis_reads": [n]}}, "median_s": {shards: {"no_data": s, "small": s}},
        "pool_full_warnings": n}`` (shard counts as strings: JSON keys); ``*_calls``: the API calls
        this process made during each run (the operator's; not the Spark job's).
    :raises SystemExit: a run did not end as expected (a no-data run that committed, a small
        batch that read another number of records than were put).
    """
    pool = _PoolWarnings()
    logging.getLogger("urllib3").addHandler(pool)
    runs: dict[str, dict[str, list[Any]]] = {}
    calls = _CallCounter()
    operator = psutil.Process()
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
            figures: dict[str, list[Any]] = {"no_data": [], "no_data_emulator_cpu": [], "no_data_proxy_cpu": [],
                                             "no_data_operator_cpu": [], "small": [], "records": [],
                                             "no_data_calls": [], "small_calls": [], "small_kinesis_reads": []}  # fmt: skip
            for _ in range(repeat):
                cpu = [_cpu(emulator), _cpu(proxy), _cpu(operator)]
                with calls:
                    summary, wall = ingest(stream, out)
                for key, process, before in zip(("emulator", "proxy", "operator"), (emulator, proxy, operator), cpu, strict=True):
                    figures[f"no_data_{key}_cpu"].append(_cpu(process) - before)
                figures["no_data_calls"].append(calls.take())
                if summary.get("status") != "no_new_records":
                    raise SystemExit(f"scale {shards}: a run without new records ended {summary.get('status')!r}")
                figures["no_data"].append(wall)
                loaded = load_backlog(kinesis, stream, 0, lines, user_records=shards * records_per_shard)
                reads = _kinesis_reads(proxy_stats)
                with calls:
                    summary, wall = ingest(stream, out, connect=True)
                figures["small_calls"].append(calls.take())
                figures["small_kinesis_reads"].append(_kinesis_reads(proxy_stats) - reads)
                if summary.get("status") != "committed" or summary.get("records") != loaded["user_records"]:
                    raise SystemExit(f"scale {shards}: the small batch ended {summary.get('status')!r} with "
                                     f"{summary.get('records')} records, {loaded['user_records']} were put")  # fmt: skip
                figures["small"].append(wall)
                figures["records"].append(loaded["user_records"])
            runs[str(shards)] = figures
            log(f"scale {shards} shards: { {k: v for k, v in figures.items() if not k.endswith('_calls')} }; "
                f"calls of the operator, no-data run: {figures['no_data_calls'][-1]}; small batch: {figures['small_calls'][-1]}")
    finally:
        logging.getLogger("urllib3").removeHandler(pool)
    return {
        "records_per_shard": records_per_shard,
        "repeat": repeat,
        "runs": runs,
        "median_s": {k: {"no_data": statistics.median(v["no_data"]), "small": statistics.median(v["small"])} for k, v in runs.items()},
        "pool_full_warnings": pool.count,
    }


def calls_per_idle_shard(figures: Mapping[str, Any], shards: int) -> float:
    """The median, over the no-data runs of one shard count, of the operator's Kinesis calls
    divided by ``shards`` (every shard is idle in a no-data run)."""
    counts = [sum(n for op, n in calls.items() if op.startswith("kinesis.")) for calls in figures.get("no_data_calls") or []]
    return round(statistics.median(counts) / shards, 3) if counts else float("nan")


def scale_headline(scale: dict[str, Any]) -> dict[str, Any]:
    """The headline's ``scale`` field: per shard count, the median no-data run and small batch
    (s) and the Kinesis calls per idle shard of a no-data run."""
    return {
        k: {"no_data_s": round(v["no_data"], 2), "small_batch_s": round(v["small"], 2),
            "kinesis_calls_per_idle_shard": calls_per_idle_shard(scale["runs"][k], int(k))}
        for k, v in scale["median_s"].items()
    }  # fmt: skip


def scale_targets(scale: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """Issues 17's and 31's targets for the section, each with the measured value and whether it is met."""
    medians = scale["median_s"]
    counts = sorted(medians, key=int)
    low, high = counts[0], counts[-1]
    base = str(BASE_SHARDS) if str(BASE_SHARDS) in medians else high
    ratio = medians[base]["small"] / medians[low]["small"]
    targets = [
        (f"no-data run at {base} shards < 2 s", f"{medians[base]['no_data']:.2f} s", medians[base]["no_data"] < 2.0),
        (f"warm small batch at {base} shards <= 3x the {low}-shard one", f"{ratio:.2f}x", ratio <= 3.0),
        ("no connection-pool warnings", str(scale["pool_full_warnings"]), scale["pool_full_warnings"] == 0),
    ]
    if int(high) > int(base):
        for kind, words in (("no_data", "no-data run"), ("small", "warm small batch")):
            per_shard = (medians[high][kind] / int(high)) / (medians[base][kind] / int(base))
            targets.append((f"{words}: time per shard at {high} shards <= {PER_SHARD_MAX_RATIO}x that at {base}",
                            f"{per_shard:.2f}x", per_shard <= PER_SHARD_MAX_RATIO))  # fmt: skip
    worst = max((calls_per_idle_shard(scale["runs"][k], int(k)), k) for k in counts)
    targets.append(("fewer than 2 Kinesis calls per idle shard (no-data run, every shard count)",
                    f"{worst[0]:g} (at {worst[1]} shards)", worst[0] < 2))  # fmt: skip
    return targets


def scale_markdown(scale: dict[str, Any]) -> list[str]:
    """The section's lines of ``docs/benchmarks.md`` (a paragraph and a table)."""
    rows = [
        "| shards | no-data run, median (s) | runs (s) | CPU in a no-data run, median (s): moto / limits proxy / operator "
        "| small batch, warm, median (s) | runs (s) | records per batch |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for shards, figures in sorted(scale["runs"].items(), key=lambda kv: int(kv[0])):
        medians = scale["median_s"][shards]
        cpu = " / ".join(f"{statistics.median(figures.get(f'no_data_{k}_cpu') or [0.0]):.2f}" for k in ("emulator", "proxy", "operator"))
        rows.append(
            f"| {shards} | {medians['no_data']:.2f} | {', '.join(f'{x:.2f}' for x in figures['no_data'])} | "
            f"{cpu} | {medians['small']:.2f} | {', '.join(f'{x:.2f}' for x in figures['small'])} | "
            f"{statistics.median(figures['records']):,.0f} |"
        )
    calls_rows = [
        "| shards | no-data run: the operator's calls, Kinesis / DynamoDB | small batch: the operator's calls, Kinesis / "
        "DynamoDB | small batch: Kinesis reads, the Spark job's included | Kinesis calls per idle shard (no-data run) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for shards, figures in sorted(scale["runs"].items(), key=lambda kv: int(kv[0])):
        if not figures.get("no_data_calls"):
            continue
        cells = []
        for kind in ("no_data_calls", "small_calls"):
            last = figures[kind][-1]
            per_service = [sum(n for k, n in last.items() if k.startswith(f"{service}.")) for service in ("kinesis", "dynamodb")]
            cells.append(" / ".join(map(str, per_service)))
        reads = figures.get("small_kinesis_reads") or [0]
        calls_rows.append(f"| {shards} | {cells[0]} | {cells[1]} | {reads[-1]} | {calls_per_idle_shard(figures, int(shards)):g} |")
    calls_part = [
        "",
        "API calls of the last run of each kind (counted in the operator's process: probes, shard listing, checkpoint "
        "store, the connection checks; the per-operation counts are in the raw results, `no_data_calls` and "
        "`small_calls`), and the `GetShardIterator` + `GetRecords` calls the limits proxy served during the small "
        "batch, the Spark job's reads included:",
        "",
        *calls_rows,
    ] if len(calls_rows) > 2 else []
    return [
        f"The same stream shape at several shard counts, each on a fresh stream behind the limits proxy; median of "
        f"{scale['repeat']} runs each. A no-data run lists the shards, reads the checkpoints, plans and probes every "
        "shard (`GetRecords` with `Limit` 1, in parallel: at most as many calls in flight as the Kinesis client pools "
        "connections, 8 probe threads per connection), "
        f"and ends without a Spark job or a commit. A small batch is about {scale['records_per_shard']} new user records "
        "per shard, end to end over the warm Spark Connect session (plan, probes up to the first range with a record, "
        "the job, the report, the commit and its KCL-style item per shard, written on as many threads as the DynamoDB "
        "client pools connections). Each stream ran one unmeasured first run and one unmeasured small batch before. "
        f"\"Connection pool is full\" warnings logged during the section: {scale['pool_full_warnings']}. A no-data "
        "run's probe of a shard is one `GetRecords` on the shard iterator the last batch's read of the shard ended with "
        "(kept in its checkpoint, `Checkpoint.resume_iterator`, used for 4 minutes: every no-data run here follows a "
        "batch that read every shard to its tip); without one, a `GetShardIterator` and one `GetRecords` (`Limit` 2 when "
        "the checkpoint points into a KPL aggregate: the probe re-reads that Kinesis record). A response short of its "
        "`Limit` at `MillisBehindLatest` 0 tells the shard is caught up. Every call "
        "costs the emulator (moto in server mode, one process) and the limits proxy (a process of its own, as the "
        "service is elsewhere than its callers) CPU time of their own, on the same 2 cores as the operator: the CPU "
        "column gives each process's CPU seconds during a no-data run; the service has no such cost on the caller's "
        "machine.",
        "",
        *rows,
        *calls_part,
    ]
