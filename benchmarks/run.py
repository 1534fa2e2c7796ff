"""``make bench``: our operator against the Kinesis read limits and a naive consumer.

    python -m benchmarks.run [--only SECTION[,SECTION...]] [--shards 4] [--throttled-mib 160]
                             [--unthrottled-mib 160] [--memory-mib 32] [--typed-mib 160]
                             [--output docs/benchmarks.md]

Everything runs on 127.0.0.1: moto in server mode holds the stream and the checkpoint table;
Kinesis traffic goes through :class:`benchmarks.kinesis_limits.ThrottlingProxy`, in a process of
its own (``LimitsProxyProcess``), which enforces the service's per-shard read limits (throttled)
or only its response caps (unthrottled). The
operator runs in this process, as an Airflow worker runs it (``execute``), with spark-submit
(cold: a JVM per batch) or over Spark Connect (warm: a running server).

Sections (each on its own streams, so each consumer starts at TRIM_HORIZON; ``--only`` runs a
subset, and then writes the report only when ``--output`` is given):

1. **throttled**: S shards, a backlog of B MiB; our operator (default settings: paced to the
   per-shard limits), then the naive consumer on the same backlog. Read rate = bytes served by
   the proxy / (last GetRecords response - first GetRecords call) for that stream.
2. **unthrottled**: the same for a second backlog with no rate limits; our figure is
   end-to-end (plan, read, Parquet write, commit: the ``execute`` wall time), the naive
   consumer's is read-only.
3. **fixed_cost** per micro-batch: a run with no new records (no Spark), a small batch cold
   (spark-submit) and warm (Spark Connect); overheads are beyond the no-data run. The same new
   records also go, warm, to an Iceberg table (SQL catalog on SQLite) and a Delta table (own
   consumers): the table commit's cost is their batch's wall time beyond the Parquet batch's.
4. **scale** in shards (``benchmarks/scale.py``): the no-data run and a warm small batch at 4,
   64, 256, 1,024 and 4,096 shards, and the Kinesis calls per idle shard.
5. **shared** stream: three consumers with their own checkpoints read one backlog at once,
   polling (they share each shard's 2 MiB/s) and with enhanced fan-out (2 MiB/s per shard each).
6. **freshness** (``benchmarks/freshness.py``, when present).
7. **memory**: peak memory (PSS) of the Spark jobs (driver JVM with a fixed heap, and its Python
   workers, sampled every 50 ms) while ingesting two backlogs 4x apart, with a per-shard cap
   (``max_bytes_per_shard``): each batch reads at most the cap per shard, a larger backlog takes
   more batches, not more memory. Each backlog is ingested ``--memory-repeat`` times; the
   figures are the maxima.
8. **typed** (``benchmarks/typed.py``): JSON and Avro orders decoded by inline schemas in the
   Spark job: each backlog read behind the limits (as **throttled** reads raw records), and
   end to end warm against a raw consumer of the same backlog (as **unthrottled** runs ours).
9. **peers** (``benchmarks/peers.py``): ours, async-kinesis and the naive consumer read one
   backlog whole, each in a process of its own (its CPU seconds) behind a limits proxy of its
   own, throttled and unthrottled.
10. **large_records** (``benchmarks/large_records.py``): 10 MiB records on kinesalite behind the
   limits proxy: a backlog read behind the limits, and the job's peak memory against a backlog of
   1 MiB records of the same bytes.

The last line printed is one JSON object with the headline figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import boto3
import psutil

from benchmarks.kinesis_limits import MIB, KinesisLimits, LimitsProxyProcess
from benchmarks.scale import SHARD_COUNTS as SCALE_SHARD_COUNTS
from benchmarks.typed import FORMATS as TYPED_FORMATS
from benchmarks.typed import Orders, decode_cost, record_sizes, record_settings, typed_headline
from benchmarks.workload import access_log_lines, load_backlog, naive_consume
from demo.stack import ACCESS_KEY, REGION, ROOT, SECRET_KEY, moto_server, spark_connect_server

SPARK_CONF = {"spark.ui.enabled": "false", "spark.driver.memory": "1g"}

#: Sections in the order they run (``--only`` picks some).
SECTIONS = ("throttled", "unthrottled", "fixed_cost", "scale", "shared", "freshness", "memory", "typed", "peers", "large_records")


def fixed_heap_conf(heap: str, gc_log: Path | None = None) -> dict[str, str]:
    """spark-submit conf that fixes the job's JVM heap at ``heap`` (e.g. ``"1g"``).

    Maximum (``spark.driver.memory``, i.e. ``-Xmx``) and initial size (``-Xms``) are equal, and
    the heap is touched in full when the JVM starts (``-XX:+AlwaysPreTouch``): the JVM's
    footprint no longer depends on how far, and when, the garbage collector grew the heap, and
    what it adds beyond the heap (metaspace, threads, direct buffers) is what can still vary.
    In local mode the driver JVM is the executor too.

    :param gc_log: a directory for the JVMs' garbage-collection logs (``-Xlog:gc``, one file per
        process): :func:`heap_after_gc` reads the heap in use after each collection from them.
    """
    options = f"-Xms{heap} -XX:+AlwaysPreTouch"
    if gc_log is not None:
        options += f" -Xlog:gc:file={gc_log}/gc-%p.log"
    return {**SPARK_CONF, "spark.driver.memory": heap, "spark.driver.extraJavaOptions": options}


#: A unified-logging GC line's heap figures: ``... Pause Young (Normal) (G1 Evacuation Pause) 312M->45M(1024M) 12.3ms``.
_GC_LINE = re.compile(r"(\d+)M->(\d+)M\((\d+)M\)")


def heap_after_gc(gc_log: Path) -> float | None:
    """The largest heap occupancy after a garbage collection (MiB) in the GC logs of ``gc_log``:
    the data the job kept alive, whatever the collector's timing; ``None`` without a collection."""
    after = [int(m.group(2)) for f in gc_log.glob("gc-*.log") for m in _GC_LINE.finditer(f.read_text(errors="replace"))]
    return float(max(after)) if after else None


def client(service: str, endpoint: str) -> Any:
    return boto3.client(service, endpoint_url=endpoint, region_name=REGION, aws_access_key_id=ACCESS_KEY,
                        aws_secret_access_key=SECRET_KEY)  # fmt: skip


def use_connections(moto: str, kinesis_endpoint: str, spark_connect: tuple[str, int] | None,
                    connect_conn_id: str = "spark_connect_bench") -> None:  # fmt: skip
    """Point ``aws_default`` at moto (Kinesis through ``kinesis_endpoint``) and define ``connect_conn_id``."""
    os.environ["AIRFLOW_CONN_AWS_DEFAULT"] = json.dumps({
        "conn_type": "aws", "login": ACCESS_KEY, "password": SECRET_KEY,
        "extra": {"region_name": REGION, "endpoint_url": moto,
                  "service_config": {"kinesis": {"endpoint_url": kinesis_endpoint}}},
    })  # fmt: skip
    if spark_connect:
        os.environ[f"AIRFLOW_CONN_{connect_conn_id.upper()}"] = json.dumps(
            {"conn_type": "spark_connect", "host": spark_connect[0], "port": spark_connect[1]}
        )


def ingest(stream: str, output: Path, *, connect: bool | str = False, paced: bool = True,
           max_bytes_per_shard: int | None = None, consumer: str = "bench", spark_conf: dict[str, str] | None = None,
           read_tasks: int | None = None, **settings: Any) -> tuple[dict[str, Any], float]:  # fmt: skip
    """One run of the operator; returns its summary and wall time (seconds).

    :param connect: ``True``: over the ``spark_connect_bench`` connection; a string: over that
        Spark Connect connection; ``False``: spark-submit.
    :param spark_conf: the spark-submit conf (default :data:`SPARK_CONF`).
    :param read_tasks: ``ReadOptions.read_tasks``.
    :param settings: more operator arguments (``output_settings``, ``record_settings``,
        ``consumer_type``, ...).
    """
    from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator
    from airflow_kinesis_spark.operators.settings import ReadOptions, SparkSettings

    # The benchmark's Spark Connect server is its own: the consumer's warm session is kept from
    # batch to batch, as a DAG author opts in to on a private server (docs/security.md).
    spark = SparkSettings(conn_id=(connect if isinstance(connect, str) else "spark_connect_bench") if connect else "spark_default",
                          conf=spark_conf or SPARK_CONF, connect_reuse_session=bool(connect))  # fmt: skip
    read = ReadOptions(read_tasks=read_tasks) if paced else ReadOptions(read_bytes_per_second=None, read_tasks=read_tasks)
    operator = KinesisToSparkOperator(
        task_id="bench", stream_name=stream, consumer_name=consumer, checkpoint_table=f"{stream}-ckpt",
        output_path=str(output), spark_settings=spark, read_options=read, max_bytes_per_shard=max_bytes_per_shard, **settings,
    )  # fmt: skip
    started = time.monotonic()
    summary = operator.execute({})
    return summary, time.monotonic() - started


#: The roles of a spark-submit job's processes (:class:`MemorySampler`), in the order reports list them:
#: the JVM (driver and executor in local mode), the Python driver running the job's script,
#: pyspark's daemon (``-m pyspark.daemon``, started by the JVM for the first Python task), the
#: Python workers (forked by the daemon, or ``-m pyspark.worker``), anything else under the JVM.
ROLES = ("jvm", "python_driver", "pyspark_daemon", "python_workers", "other")


@dataclass(frozen=True)
class ProcessMemory:
    """One process of a job in one sample: ``pss`` in bytes, ``command`` its command line (:func:`short_command`)."""

    pid: int
    role: str
    pss: int
    command: str


def process_role(cmdline: list[str], parent_cmdline: list[str] | None, is_root: bool) -> str:
    """The role (one of :data:`ROLES`) of a process of a spark-submit job, from its command line and its
    parent's (``None``: unknown); ``is_root``: the job's JVM. A worker forked by pyspark's daemon keeps
    the daemon's command line, so it is told apart by its parent."""
    if is_root:
        return "jvm"
    if not cmdline or not os.path.basename(cmdline[0]).startswith("python"):
        return "other"
    text = " ".join(cmdline)
    if "pyspark.daemon" in text:
        return "python_workers" if parent_cmdline is not None and "pyspark.daemon" in " ".join(parent_cmdline) else "pyspark_daemon"
    if "pyspark.worker" in text:
        return "python_workers"
    return "python_driver" if "kinesis_batch.py" in text else "other"


def short_command(cmdline: list[str], width: int = 100) -> str:
    """A command line in at most ``width`` characters: the program's file name, then its arguments,
    a class path (``-cp``, ``-classpath``) left out (``...``), paths in the checkout relative to it
    and the temporary directory written ``$TMPDIR`` (the report names no path of the machine)."""
    args = [os.path.basename(cmdline[0]) if cmdline else "?"]
    for prev, arg in zip(cmdline, cmdline[1:]):
        args.append("..." if prev in ("-cp", "-classpath") else arg)
    text = " ".join(args).replace(f"{ROOT}{os.sep}", "").replace(tempfile.gettempdir(), "$TMPDIR")
    return text[:width]


class MemorySampler:
    """Peak memory of the spark-submit job (its JVM and every process under it), as the sum of
    their proportional set sizes (PSS, Linux), sampled every ``interval`` seconds.

    After the ``with`` block: ``peak_total``, ``peak_jvm`` and ``peak_python`` (bytes; each its own
    maximum over the samples; "python" is every process but the JVM), ``peak_by_role`` (bytes per
    role of :data:`ROLES` in the sample where the total peaked) and ``peak_processes`` (that
    sample's processes, :class:`ProcessMemory`), so a peak can be explained.
    """

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self.peak_total = self.peak_jvm = self.peak_python = 0
        self.peak_by_role: dict[str, int] = dict.fromkeys(ROLES, 0)
        self.peak_processes: list[ProcessMemory] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_until_stopped, daemon=True)
        self._error: BaseException | None = None

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        """Stops the sampling. :raises RuntimeError: the sampling failed (its peaks would be too low)."""
        self._stop.set()
        self._thread.join()
        if self._error is not None and exc[0] is None:
            raise RuntimeError(f"memory sampling stopped early: {self._error!r}") from self._error

    def _sample_until_stopped(self) -> None:
        try:
            self._run()
        except BaseException as err:  # noqa: BLE001 - raised again by __exit__
            self._error = err

    @staticmethod
    def _job_processes() -> list[tuple[psutil.Process, str, list[str]]]:
        """The job's processes, each with its role and command line: every spark-submit JVM
        running ``kinesis_batch.py`` under this process and the processes under it.

        Not counted: the launcher JVM that builds spark-submit's command line, and a process the
        JVM is starting (``ProcessBuilder``: the Python driver, pyspark's daemon) until it runs
        its own program (``jspawnhelper``, then Python). Until then it runs in the JVM's memory
        (``posix_spawn`` clones the JVM) and has the JVM's command line and name; counted, it
        added the JVM's PSS a second time to one sample (about 1.2 GiB), or twice when it was
        also taken for a second job JVM.
        """
        candidates: dict[int, tuple[psutil.Process, list[str], int]] = {}
        for child in psutil.Process().children(recursive=True):
            try:
                cmdline = child.cmdline()
                if (child.name() == "java" and any("kinesis_batch.py" in part for part in cmdline)
                        and "org.apache.spark.launcher.Main" not in cmdline):  # fmt: skip
                    candidates[child.pid] = (child, cmdline, child.ppid())
            except psutil.Error:
                continue
        procs = []
        for root, root_cmdline, root_parent in candidates.values():
            if root_parent in candidates:  # a process the job's JVM is starting (see above)
                continue
            procs.append((root, "jvm", root_cmdline))
            try:
                descendants = root.children(recursive=True)
            except psutil.Error:
                continue
            seen = {root.pid: (root_cmdline, 0)}  # pid: (command line, parent pid)
            for proc in descendants:
                try:
                    seen[proc.pid] = (proc.cmdline(), proc.ppid())
                except psutil.Error:
                    continue
            for proc in descendants:
                if proc.pid not in seen:
                    continue
                cmdline, parent = seen[proc.pid]
                # The command line is read before the PSS: one that is still the JVM's means the
                # PSS would be read from the JVM's memory, or from the new program's (smaller).
                if cmdline == root_cmdline:
                    continue
                parent_cmdline = seen[parent][0] if parent in seen else None
                procs.append((proc, process_role(cmdline, parent_cmdline, False), cmdline))
        return procs

    def _run(self) -> None:
        while not self._stop.is_set():
            sample = []
            for proc, role, cmdline in self._job_processes():
                try:
                    # PSS: pages shared with another process (pyspark's forked workers share
                    # their daemon's) count once in all, not once per process as in RSS.
                    pss = proc.memory_full_info().pss
                except psutil.Error:
                    continue
                sample.append(ProcessMemory(proc.pid, role, pss, short_command(cmdline)))
            jvm = sum(p.pss for p in sample if p.role == "jvm")
            total = sum(p.pss for p in sample)
            self.peak_jvm = max(self.peak_jvm, jvm)
            self.peak_python = max(self.peak_python, total - jvm)
            if total > self.peak_total:
                self.peak_total, self.peak_processes = total, sample
                self.peak_by_role = {role: sum(p.pss for p in sample if p.role == role) for role in ROLES}
            self._stop.wait(self.interval)


def new_stream(kinesis: Any, name: str, shards: int) -> None:
    kinesis.create_stream(StreamName=name, ShardCount=shards)
    kinesis.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 0.2})


def drop_streams(kinesis: Any, names: list[str] | None = None) -> int:
    """Delete ``names`` (default: every stream) from the emulator; returns how many.

    moto keeps every record in memory, and its cost per call grows with what it holds (a Python
    process's garbage collector walks every object it keeps): a section run after 1 GiB of
    earlier backlogs measured moto's memory, not our code. The service has no such cost.
    """
    if names is None:
        names = [n for page in kinesis.get_paginator("list_streams").paginate() for n in page["StreamNames"]]
    for name in names:
        kinesis.delete_stream(StreamName=name, EnforceConsumerDeletion=True)
    return len(names)


def check(summary: dict[str, Any], loaded: dict[str, int], what: str) -> None:
    if summary.get("records") != loaded["user_records"]:
        raise SystemExit(f"{what}: the operator read {summary.get('records')} records, {loaded['user_records']} were loaded")


def versions() -> dict[str, str]:
    import airflow
    import moto
    import pyspark

    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()
    return {"python": platform.python_version(), "airflow": airflow.__version__, "pyspark": pyspark.__version__,
            "moto": moto.__version__, "boto3": boto3.__version__, "java": java[0] if java else "?"}  # fmt: skip


def machine() -> str:
    return f"{os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB RAM, {platform.system()} {platform.machine()}"


@dataclass
class Bench:
    """What every section uses: the options, the emulator, the proxies, the warm Spark server."""

    args: argparse.Namespace
    work: Path
    lines: list[bytes]
    moto: str
    throttled: LimitsProxyProcess
    open_proxy: LimitsProxyProcess
    connect: tuple[str, int]
    kinesis: Any

    def log(self, msg: str) -> None:
        print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def section_throttled(b: Bench) -> dict[str, Any]:
    """1. Our operator, then the naive consumer, on one backlog behind the service's limits."""
    args, kinesis, throttled = b.args, b.kinesis, b.throttled
    stream = "bench-throttled"
    new_stream(kinesis, stream, args.shards)
    loaded = load_backlog(kinesis, stream, args.throttled_mib, b.lines)
    b.log(f"throttled: loaded {loaded}")
    use_connections(b.moto, throttled.endpoint, b.connect)
    summary, wall = ingest(stream, b.work / "out-throttled")
    check(summary, loaded, "throttled")
    ours = {
        "read_bytes_per_second": throttled.read_rate(stream),
        "get_records": throttled.stats[f"GetRecords:{stream}"],
        "throttled": throttled.stats[f"GetRecords.throttled:{stream}"],
        "expired": throttled.stats[f"GetRecords.expired:{stream}"],
        "wall_s": wall, "records": summary["records"],
    }  # fmt: skip
    b.log(f"throttled, ours: {ours}")
    naive = naive_consume(client("kinesis", throttled.endpoint), stream)
    if naive.user_records != loaded["user_records"]:
        raise SystemExit(f"naive consumer read {naive.user_records} of {loaded['user_records']} records")
    b.log(f"throttled, naive: {naive}")
    limit = args.shards * 2 * MIB
    return {
        "backlog_mib": loaded["bytes"] / MIB, "user_records": loaded["user_records"],
        "kinesis_records": loaded["kinesis_records"], "ours": ours,
        "naive": {**naive.__dict__, "bytes_per_second": naive.bytes_per_second},
        "limit_bytes_per_second": limit, "lower_bound_s": loaded["bytes"] / limit,
    }  # fmt: skip


def section_unthrottled(b: Bench) -> dict[str, Any]:
    """2. Warm end to end against the naive consumer's read-only loop, no rate limits; one cold run."""
    # Warm means what a running micro-batch pipeline has: the consumer's Spark Connect session
    # already ran its previous batch (artifacts uploaded, Python workers started). Each repeat:
    # a fresh stream, one small batch through the consumer (not measured), the backlog, then
    # the naive consumer and ours on it. The naive consumer also reads the small batch's
    # records (its rate counts them).
    args, kinesis, open_proxy = b.args, b.kinesis, b.open_proxy
    use_connections(b.moto, open_proxy.endpoint, b.connect)
    pairs = []
    for i in range(args.unthrottled_repeat):
        stream = f"bench-unthrottled-{i}"
        new_stream(kinesis, stream, args.shards)
        load_backlog(kinesis, stream, 1, b.lines)
        ingest(stream, b.work / f"out-{stream}", connect=True, paced=False)  # the consumer's previous batch
        loaded = load_backlog(kinesis, stream, args.unthrottled_mib, b.lines)
        b.log(f"unthrottled {i + 1}/{args.unthrottled_repeat}: loaded {loaded}")
        naive = naive_consume(client("kinesis", open_proxy.endpoint), stream)
        b.log(f"unthrottled, naive: {naive}")
        summary, wall = ingest(stream, b.work / f"out-{stream}", connect=True, paced=False)
        check(summary, loaded, "unthrottled")
        b.log(f"unthrottled, ours over Spark Connect: {summary['records']} records in {wall:.1f}s")
        pairs.append({"naive": {**naive.__dict__, "records_per_second": naive.records_per_second},
                      "ours_warm": {"wall_s": wall, "records": summary["records"],
                                    "records_per_second": summary["records"] / wall}})  # fmt: skip
        drop_streams(kinesis, [stream])  # the next run's moto holds one backlog, not i + 1
    ratios = [p["ours_warm"]["records_per_second"] / p["naive"]["records_per_second"] for p in pairs]
    result = {
        "backlog_mib": loaded["bytes"] / MIB, "user_records": loaded["user_records"], "runs": pairs,
        "ratios": ratios, "ratio_median": statistics.median(ratios),
        "naive_records_per_second_median": statistics.median(p["naive"]["records_per_second"] for p in pairs),
        "ours_warm_records_per_second_median": statistics.median(p["ours_warm"]["records_per_second"] for p in pairs),
    }  # fmt: skip
    stream = "bench-unthrottled-cold"
    new_stream(kinesis, stream, args.shards)
    loaded = load_backlog(kinesis, stream, args.unthrottled_mib, b.lines)
    summary, wall = ingest(stream, b.work / "out-unthrottled-cold", paced=False)
    check(summary, loaded, "unthrottled, spark-submit")
    b.log(f"unthrottled, ours with spark-submit: {summary['records']} records in {wall:.1f}s")
    result["ours_cold"] = {"wall_s": wall, "records_per_second": summary["records"] / wall}
    return result


def section_fixed_cost(b: Bench) -> dict[str, Any]:
    """3. The no-data run, a small batch cold and warm, and warm into Iceberg and Delta tables."""
    from airflow_kinesis_spark.operators.settings import OutputSettings

    args, kinesis, work = b.args, b.kinesis, b.work
    stream = "bench-small"
    new_stream(kinesis, stream, args.shards)
    use_connections(b.moto, b.throttled.endpoint, b.connect)
    costs: dict[str, list[float]] = {"no_data": [], "cold": [], "warm": [], "warm_iceberg": [], "warm_delta": []}
    commits: dict[str, list[float]] = {"iceberg": [], "delta": []}
    # The table outputs: their own consumers (own checkpoints) of the same stream, so each warm
    # batch of a repetition reads the same new records in each format.
    tables = {
        "warm_iceberg": {"consumer": "bench-iceberg", "output_settings": OutputSettings(
            format="iceberg", table="bench.small", catalog_properties={"type": "sql", "uri": f"sqlite:///{work}/catalog.db"})},
        "warm_delta": {"consumer": "bench-delta", "output_settings": OutputSettings(format="delta")},
    }  # fmt: skip
    small_mib = args.small_records * 300 / MIB
    ingest(stream, work / "out-small")  # first run: creates the checkpoint table; not measured
    ingest(stream, work / "out-small", connect=True)  # warms the Spark Connect server's workers
    for kind, settings in tables.items():  # creates the tables (one first batch each); not measured
        load_backlog(kinesis, stream, small_mib, b.lines)
        ingest(stream, work / f"out-{kind}", connect=True, **settings)
    ingest(stream, work / "out-small", connect=True)
    for rep in range(args.repeat):
        summary, wall = ingest(stream, work / "out-small")
        assert summary["status"] == "no_new_records", summary
        costs["no_data"].append(wall)
        load_backlog(kinesis, stream, small_mib, b.lines)
        order = ["warm", "warm_iceberg", "warm_delta"]
        order = order[rep % 3:] + order[: rep % 3]  # each format first as often as the others
        for kind in order:  # the same new records, in each format
            summary, wall = ingest(stream, work / f"out-{kind}" if kind in tables else work / "out-small",
                                   connect=True, **tables.get(kind, {}))  # fmt: skip
            assert summary["status"] == "committed", summary
            costs[kind].append(wall)
            if kind in tables:
                commits[tables[kind]["output_settings"].format].append(summary["table"]["seconds"])
        load_backlog(kinesis, stream, small_mib, b.lines)
        summary, wall = ingest(stream, work / "out-small")
        assert summary["status"] == "committed", summary
        costs["cold"].append(wall)
        for kind, settings in tables.items():  # keep the table consumers level with the stream
            ingest(stream, work / f"out-{kind}", connect=True, **settings)
    medians = {k: statistics.median(v) for k, v in costs.items()}
    b.log(f"fixed cost: {costs}; table commits: {commits}")
    return {"runs": costs, "median_s": medians, "table_commit_s": commits,
            "cold_overhead_s": medians["cold"] - medians["no_data"],
            "warm_overhead_s": medians["warm"] - medians["no_data"],
            "iceberg_overhead_s": medians["warm_iceberg"] - medians["warm"],
            "delta_overhead_s": medians["warm_delta"] - medians["warm"]}  # fmt: skip


def section_scale(b: Bench) -> dict[str, Any]:
    """4. The no-data run and a warm small batch at several shard counts (``benchmarks/scale.py``)."""
    from benchmarks.scale import run_scale

    use_connections(b.moto, b.throttled.endpoint, b.connect)
    emulator = next((p for p in psutil.Process().children(recursive=True) if "moto_server" in " ".join(p.cmdline())), None)
    return run_scale(b.kinesis, ingest, new_stream, b.lines, b.work, shard_counts=b.args.scale_shards,
                     records_per_shard=b.args.scale_records_per_shard, repeat=b.args.scale_repeat, log=b.log,
                     emulator=emulator, proxy=psutil.Process(b.throttled.pid), proxy_stats=lambda: b.throttled.stats)  # fmt: skip


def _ingest_in_process(start: Any, results: Any, stream: str, output: str, connect: str, consumer: str,
                      settings: dict[str, Any]) -> None:  # fmt: skip
    """A consumer's batch in a process of its own, as an Airflow worker runs a task: waits at
    ``start`` (a barrier), runs :func:`ingest`, puts ``(consumer, summary, seconds)`` or
    ``(consumer, error text, None)`` on ``results``."""
    try:
        import airflow_kinesis_spark.operators.kinesis_to_spark  # noqa: F401 - imported before the barrier

        start.wait()
        summary, wall = ingest(stream, Path(output), connect=connect, consumer=consumer, **settings)
        results.put((consumer, summary, wall))
    except BaseException as err:  # noqa: BLE001 - reported by the parent
        results.put((consumer, repr(err), None))


def _shared_read(b: Bench, stream: str, consumers: list[str], connect_conn_id: str, **settings: Any) -> list[dict[str, Any]]:
    """The consumers' batches of ``stream``, started at once, each in its own process (as Airflow
    runs tasks; the Spark Connect client keeps a process-wide default session, so batches of
    several consumers do not share a process); per consumer its read rate from the report its job
    recorded (Kinesis bytes / first read start to last read end)."""
    import multiprocessing

    from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore

    ctx = multiprocessing.get_context("spawn")
    start, queue = ctx.Barrier(len(consumers)), ctx.Queue()
    processes = [
        ctx.Process(target=_ingest_in_process, name=f"bench-{c}",
                    args=(start, queue, stream, str(b.work / f"out-{stream}-{c}"), connect_conn_id, c, {"read_tasks": 1, **settings}))
        for c in consumers
    ]  # fmt: skip
    for process in processes:
        process.start()
    outcomes = {}
    for _ in consumers:
        consumer, summary, wall = queue.get(timeout=1800)
        outcomes[consumer] = (summary, wall)
    for process in processes:
        process.join()
    dynamodb = client("dynamodb", b.moto)
    figures = []
    for consumer in consumers:
        summary, wall = outcomes[consumer]
        if wall is None:
            raise SystemExit(f"shared stream, consumer {consumer}: {summary}")
        reports = DynamoDBCheckpointStore(dynamodb, f"{stream}-ckpt", stream, consumer).committed_report() or []
        started = min(r.read_started for r in reports if r.read_started)
        ended = max(r.read_ended for r in reports if r.read_ended)
        kinesis_bytes = sum(r.kinesis_bytes for r in reports)
        rate = kinesis_bytes / max(1e-9, ended - started)
        figures.append({
            "consumer": consumer, "records": summary["records"], "kinesis_bytes": kinesis_bytes, "wall_s": wall,
            "read_started": started, "read_s": ended - started, "bytes_per_second": rate,
            "fraction_per_shard": rate / (len(reports) * 2 * MIB),
            "throttled_calls": sum(r.throttled_calls for r in reports),
            "responses": sum(r.get_records_calls for r in reports),
        })  # fmt: skip
    first = min(f["read_started"] for f in figures)
    for f in figures:  # when each began reading, after the first (s): how far the reads overlap
        f["read_offset_s"] = f.pop("read_started") - first
    return figures


def section_shared(b: Bench) -> dict[str, Any]:
    """5. Three consumers (own checkpoints) read one backlog at once: polling, then enhanced fan-out.

    Each consumer's batch runs in its own process over a Spark Connect server with one task slot
    per consumer (``ReadOptions(read_tasks=1)``: one task reads every shard of the consumer's batch), so the
    reads overlap. Both go through the limits proxy: polling consumers share each shard's
    2 MiB/s and 5 calls/s; SubscribeToShard pushes at most 2 MiB/s per consumer and shard.
    """
    args, kinesis = b.args, b.kinesis
    consumers = [f"shared-{i + 1}" for i in range(args.shared_consumers)]
    b.log(f"shared: starting a Spark Connect server with {len(consumers)} task slots")
    result: dict[str, Any] = {"consumers": len(consumers), "shards": args.shards}
    with spark_connect_server(cores=len(consumers)) as server:  # stopped after the section
        use_connections(b.moto, b.throttled.endpoint, server, "spark_connect_shared")
        for consumer_type in ("polling", "efo"):
            stream = f"bench-shared-{consumer_type}"
            new_stream(kinesis, stream, args.shards)
            # Not measured: each consumer's first run (checkpoint table, start positions, stream
            # consumer) and a first small batch, so each consumer's server session is warm (its
            # artifacts and Python worker are there) and the measured reads start together.
            for warm_up in range(2):
                if warm_up:
                    load_backlog(kinesis, stream, 1, b.lines)
                for consumer in consumers:
                    ingest(stream, b.work / f"out-{stream}-{consumer}", connect="spark_connect_shared", consumer=consumer,
                           read_tasks=1, consumer_type=consumer_type)  # fmt: skip
            mib = args.shared_mib if consumer_type == "polling" else args.shared_efo_mib
            loaded = load_backlog(kinesis, stream, mib, b.lines)
            b.log(f"shared {consumer_type}: loaded {loaded}")
            figures = _shared_read(b, stream, consumers, "spark_connect_shared", consumer_type=consumer_type)
            for f in figures:
                if f["records"] != loaded["user_records"]:
                    raise SystemExit(f"shared {consumer_type}, {f['consumer']}: read {f['records']} of {loaded['user_records']} records")
            b.log(f"shared {consumer_type}: {figures}")
            proxy_counts = {k.rsplit(":", 1)[0]: v for k, v in b.throttled.stats.items() if k.endswith(f":{stream}")}
            result[consumer_type] = {"backlog_mib": loaded["bytes"] / MIB, "user_records": loaded["user_records"],
                                     "runs": figures, "proxy_counts": proxy_counts}  # fmt: skip
    return result


def section_freshness(b: Bench) -> dict[str, Any] | None:
    """6. Freshness of the event-driven DAG (``benchmarks/freshness.py``: its own deployment of
    Airflow, moto and Spark Connect); ``None`` when that module is not there."""
    try:
        from benchmarks.freshness import run_freshness
    except ImportError:
        b.log("freshness: benchmarks/freshness.py is not there; section skipped")
        return None
    return run_freshness(b.args.freshness_batches, log=b.log)


def _memory_run(b: Bench, stream: str, mib: float, cap: int | None) -> dict[str, Any]:
    """Ingest a fresh backlog of ``mib`` MiB with spark-submit (fixed heap), each job's peak memory sampled."""
    new_stream(b.kinesis, stream, b.args.shards)
    loaded = load_backlog(b.kinesis, stream, mib, b.lines)
    records, started, peaks, live = 0, time.monotonic(), [], []
    while True:  # batches of at most `cap` bytes per shard until the backlog is read
        gc_log = Path(tempfile.mkdtemp(prefix="gc-", dir=b.work))
        with MemorySampler() as sampler:  # one per batch: the peak of each job
            summary, _ = ingest(stream, b.work / f"out-{stream}", paced=False, max_bytes_per_shard=cap,
                                spark_conf=fixed_heap_conf(b.args.memory_heap, gc_log))  # fmt: skip
        if summary["status"] == "no_new_records":
            break
        records += summary["records"]
        peaks.append(sampler)
        live.append(heap_after_gc(gc_log))
        if cap is None:
            break
    check({"records": records}, loaded, stream)
    top = max(peaks, key=lambda p: p.peak_total)  # the batch whose job peaked highest
    return {"backlog_mib": loaded["bytes"] / MIB, "records": records, "batches": len(peaks),
            "wall_s": time.monotonic() - started,
            "peak_total_mib": top.peak_total / MIB,
            "peak_jvm_mib": max(p.peak_jvm for p in peaks) / MIB,
            "peak_python_mib": max(p.peak_python for p in peaks) / MIB,
            "peak_by_role_mib": {role: round(v / MIB, 1) for role, v in top.peak_by_role.items()},
            "peak_processes": [{"pid": p.pid, "role": p.role, "pss_mib": round(p.pss / MIB, 1), "command": p.command}
                               for p in top.peak_processes],
            "heap_after_gc_mib": max((x for x in live if x is not None), default=None),
            "per_batch_peak_total_mib": [round(p.peak_total / MIB) for p in peaks],
            "per_batch_peak_jvm_mib": [round(p.peak_jvm / MIB) for p in peaks],
            "per_batch_peak_python_mib": [round(p.peak_python / MIB) for p in peaks],
            "per_batch_heap_after_gc_mib": live}  # fmt: skip


def _worst(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One backlog's repeats as one row: the maxima of the peaks, every repeat's figures kept."""
    after_gc = [r["heap_after_gc_mib"] for r in runs if r["heap_after_gc_mib"] is not None]
    top = max(runs, key=lambda r: r["peak_total_mib"])  # the repeat whose peak the row gives
    return {**runs[0], "repeats": len(runs),
            "peak_total_mib": top["peak_total_mib"],
            "peak_by_role_mib": top["peak_by_role_mib"], "peak_processes": top["peak_processes"],
            "peak_jvm_mib": max(r["peak_jvm_mib"] for r in runs),
            "peak_python_mib": max(r["peak_python_mib"] for r in runs),
            "heap_after_gc_mib": max(after_gc, default=None),
            "wall_s": statistics.median(r["wall_s"] for r in runs),
            "peak_total_mib_runs": [round(r["peak_total_mib"]) for r in runs],
            "runs": runs}  # fmt: skip


def section_memory(b: Bench) -> dict[str, Any]:
    """7. Peak memory of the spark-submit jobs for two backlogs 4x apart, capped and uncapped.

    The job's JVM runs with a fixed heap, touched in full at start (:func:`fixed_heap_conf`); each backlog is ingested
    ``--memory-repeat`` times on fresh streams (alternating, small then large), and each row
    reports the maxima over its repeats.
    """
    args = b.args
    use_connections(b.moto, b.open_proxy.endpoint, b.connect)
    cap = int(args.memory_cap_mib * MIB)
    sizes = (args.memory_mib, 4 * args.memory_mib)
    capped: dict[float, list[dict[str, Any]]] = {mib: [] for mib in sizes}
    for rep in range(args.memory_repeat):
        for mib in sizes:
            run = _memory_run(b, f"bench-memory-{int(mib)}-{rep}", mib, cap)
            capped[mib].append(run)
            b.log(f"memory, capped, {mib:g} MiB, repeat {rep + 1}: {run}")
    uncapped = []
    for mib in sizes:  # the same backlogs, each in one batch
        run = _memory_run(b, f"bench-memory-uncapped-{int(mib)}", mib, None)
        uncapped.append(run)
        b.log(f"memory, one uncapped batch, {mib:g} MiB: {run}")
    rows = [{**_worst(capped[mib]), "cap_mib_per_shard": args.memory_cap_mib} for mib in sizes]
    return {"heap": args.memory_heap, "spark_conf": fixed_heap_conf(args.memory_heap), "repeat": args.memory_repeat, "capped": rows, "uncapped": uncapped}


def _spark_cpu() -> dict[str, float]:
    """CPU seconds (user + system) so far of the warm Spark Connect server's JVM (``spark_jvm``),
    the Python processes under it (``spark_python``: pyspark's daemon and its workers, with the
    workers that ended and were waited for) and this process (``operator``)."""

    def seconds(proc: psutil.Process, children: bool = False) -> float:
        t = proc.cpu_times()
        return t.user + t.system + ((t.children_user + t.children_system) if children else 0.0)

    out = {"spark_jvm": 0.0, "spark_python": 0.0, "operator": seconds(psutil.Process())}
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.name() != "java" or "SparkConnectServer" not in " ".join(proc.cmdline()):
                continue
            out["spark_jvm"] += seconds(proc)
            out["spark_python"] += seconds(proc, children=True) - seconds(proc)  # its children that ended
            descendants = proc.children(recursive=True)  # the daemon and the (reused) workers it forked
        except psutil.Error:
            continue
        for child in descendants:
            try:
                out["spark_python"] += seconds(child, children=True)  # a live one, and its children that ended
            except psutil.Error:
                continue
    return out


def _check_typed(summary: dict[str, Any], loaded: dict[str, int], what: str) -> None:
    """:func:`check`, and no record a dead letter (every order decodes by its schema)."""
    check(summary, loaded, what)
    if summary.get("dead_letters"):
        raise SystemExit(f"{what}: {summary['dead_letters']} of {loaded['user_records']} records did not decode (dead letters)")


def section_typed(b: Bench) -> dict[str, Any]:
    """8. Typed records (``benchmarks/typed.py``): JSON and Avro orders decoded by inline schemas.

    Throttled: each format's backlog behind the limits proxy, read as :func:`section_throttled`
    reads raw records (spark-submit, paced). Unthrottled: per repeat a fresh stream of that
    format with a raw and a typed consumer (own checkpoints), each warm over Spark Connect (its
    previous small batch not measured), both on the same backlog, end to end as
    :func:`section_unthrottled` runs ours; which runs first alternates.
    """
    args, kinesis, throttled, open_proxy = b.args, b.kinesis, b.throttled, b.open_proxy
    result: dict[str, Any] = {"record_bytes": record_sizes(), "throttled": {}, "unthrottled": {}}
    use_connections(b.moto, throttled.endpoint, b.connect)
    limit = args.shards * 2 * MIB
    for fmt in TYPED_FORMATS:
        stream = f"bench-typed-throttled-{fmt}"
        new_stream(kinesis, stream, args.shards)
        loaded = load_backlog(kinesis, stream, args.typed_mib, b.lines, payload=Orders(fmt))
        b.log(f"typed, throttled, {fmt}: loaded {loaded}")
        summary, wall = ingest(stream, b.work / f"out-{stream}", **record_settings(fmt))
        _check_typed(summary, loaded, f"typed, throttled, {fmt}")
        rate = throttled.read_rate(stream)
        result["throttled"][fmt] = {
            "backlog_mib": loaded["bytes"] / MIB, "user_records": loaded["user_records"],
            "kinesis_records": loaded["kinesis_records"], "read_bytes_per_second": rate,
            "fraction_of_limit": rate / limit, "limit_bytes_per_second": limit,
            "get_records": throttled.stats[f"GetRecords:{stream}"],
            "throttled": throttled.stats[f"GetRecords.throttled:{stream}"],
            "expired": throttled.stats[f"GetRecords.expired:{stream}"],
            "wall_s": wall, "records": summary["records"], "dead_letters": summary.get("dead_letters", 0),
        }  # fmt: skip
        b.log(f"typed, throttled, {fmt}: {result['throttled'][fmt]}")
        drop_streams(kinesis, [stream])
    use_connections(b.moto, open_proxy.endpoint, b.connect)
    for fmt in TYPED_FORMATS:
        consumers: dict[str, dict[str, Any]] = {"raw": {}, "typed": record_settings(fmt)}  # their operator arguments
        runs = []
        for i in range(args.typed_repeat):
            stream = f"bench-typed-{fmt}-{i}"
            new_stream(kinesis, stream, args.shards)
            orders = Orders(fmt)
            warm_up = load_backlog(kinesis, stream, 1, b.lines, payload=orders)
            for kind, settings in consumers.items():  # each consumer's previous batch (not measured)
                ingest(stream, b.work / f"out-{stream}-{kind}", connect=True, paced=False, consumer=f"bench-{kind}", **settings)
            loaded = load_backlog(kinesis, stream, args.typed_unthrottled_mib, b.lines,
                                  payload=Orders(fmt, start=warm_up["user_records"]))  # fmt: skip
            b.log(f"typed, unthrottled, {fmt} {i + 1}/{args.typed_repeat}: loaded {loaded}")
            run: dict[str, Any] = {}
            for kind in (("raw", "typed") if i % 2 == 0 else ("typed", "raw")):
                cpu = _spark_cpu()
                summary, wall = ingest(stream, b.work / f"out-{stream}-{kind}", connect=True, paced=False,
                                       consumer=f"bench-{kind}", **consumers[kind])  # fmt: skip
                cpu = {k: v - cpu[k] for k, v in _spark_cpu().items()}
                _check_typed(summary, loaded, f"typed, unthrottled, {fmt}, {kind}")
                run[kind] = {"wall_s": wall, "records": summary["records"], "records_per_second": summary["records"] / wall,
                             "cpu_s": cpu}  # fmt: skip
                b.log(f"typed, unthrottled, {fmt}, {kind} over Spark Connect: {summary['records']} records in {wall:.1f}s")
            run["first"] = "raw" if i % 2 == 0 else "typed"
            run["ratio"] = run["typed"]["records_per_second"] / run["raw"]["records_per_second"]
            runs.append(run)
            drop_streams(kinesis, [stream])  # the next run's moto holds one backlog
        ratios = [r["ratio"] for r in runs]
        result["unthrottled"][fmt] = {"backlog_mib": loaded["bytes"] / MIB, "user_records": loaded["user_records"],
                                      "runs": runs, "ratios": ratios, "ratio_median": statistics.median(ratios)}  # fmt: skip
    result["decode_cost"] = decode_cost()
    b.log(f"typed: {typed_headline(result)}; decoding alone: {result['decode_cost']}")
    return result


def section_peers(b: Bench) -> dict[str, Any]:
    """9. Peers (``benchmarks/peers.py``): ours, async-kinesis and the naive consumer on one backlog, each in a
    process of its own behind a limits proxy of its own, throttled and unthrottled."""
    from benchmarks.peers import run_peers

    return run_peers(b.kinesis, b.moto, b.lines, b.work, shards=b.args.shards, mib=b.args.peers_mib, new_stream=new_stream, log=b.log)


def section_large_records(b: Bench) -> dict[str, Any]:
    """10. 10 MiB records (``benchmarks/large_records.py``)."""
    from benchmarks.large_records import run_large_records

    return run_large_records(b, mib=b.args.large_records_mib, memory_mib=b.args.large_records_memory_mib,
                             repeat=b.args.large_records_repeat, log=b.log)  # fmt: skip


def headline(results: dict[str, Any]) -> dict[str, Any]:
    """The headline figures of the sections that ran (the last line ``make bench`` prints)."""
    h: dict[str, Any] = {}
    if "throttled" in results:
        t = results["throttled"]
        h["throttled_fraction_of_limit"] = round(t["ours"]["read_bytes_per_second"] / t["limit_bytes_per_second"], 3)
        h["throttled_vs_naive"] = round(t["ours"]["read_bytes_per_second"] / t["naive"]["bytes_per_second"], 2)
    if "unthrottled" in results:
        u = results["unthrottled"]
        h["unthrottled_vs_naive"] = round(u["ratio_median"], 2)
        h["unthrottled_cold_vs_naive"] = round(u["ours_cold"]["records_per_second"] / u["naive_records_per_second_median"], 2)
    if "throttled" in results:
        t = results["throttled"]
        h["ptee_fraction"] = round(t["ours"]["throttled"] / max(1, t["ours"]["get_records"]), 4)
        h["expired_iterators"] = t["ours"]["expired"]
    if "fixed_cost" in results:
        f = results["fixed_cost"]
        h.update({
            "no_data_run_s": round(f["median_s"]["no_data"], 2),
            "cold_overhead_s": round(f["cold_overhead_s"], 2),
            "warm_overhead_s": round(f["warm_overhead_s"], 2),
            "iceberg_overhead_s": round(f["iceberg_overhead_s"], 2),
            "delta_overhead_s": round(f["delta_overhead_s"], 2),
            "iceberg_commit_s": round(statistics.median(f["table_commit_s"]["iceberg"]), 3),
            "delta_commit_s": round(statistics.median(f["table_commit_s"]["delta"]), 3),
        })  # fmt: skip
    if "memory" in results:
        m = results["memory"]
        h["peak_memory_ratio"] = round(m["capped"][1]["peak_total_mib"] / m["capped"][0]["peak_total_mib"], 3)
        h["peak_memory_ratio_uncapped"] = round(m["uncapped"][1]["peak_total_mib"] / m["uncapped"][0]["peak_total_mib"], 3)
    if "scale" in results:
        from benchmarks.scale import scale_headline

        h["scale"] = scale_headline(results["scale"])
    if "shared" in results:
        s = results["shared"]
        h["shared_polling_fraction"] = [round(r["fraction_per_shard"], 3) for r in s["polling"]["runs"]]
        h["shared_efo_fraction"] = [round(r["fraction_per_shard"], 3) for r in s["efo"]["runs"]]
    if results.get("freshness") is not None:
        h["freshness"] = {k: results["freshness"][k] for k in ("p50_s", "p95_s", "batches")}
    if "typed" in results:
        h["typed"] = typed_headline(results["typed"])
    if "peers" in results:
        from benchmarks.peers import peers_headline

        h["peers"] = peers_headline(results["peers"])
    if "large_records" in results:
        from benchmarks.large_records import large_records_headline

        h["large_records"] = large_records_headline(results["large_records"])
    return h


def _sections(text: str) -> list[str]:
    chosen = [s.strip() for s in text.split(",") if s.strip()]
    unknown = sorted(set(chosen) - set(SECTIONS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", type=_sections, default=None,
                        help=f"run only these sections (comma-separated: {', '.join(SECTIONS)}); the report is then "
                             "written only with --output")  # fmt: skip
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--throttled-mib", type=float, default=160.0)
    parser.add_argument("--unthrottled-mib", type=float, default=160.0)
    parser.add_argument("--memory-mib", type=float, default=32.0, help="the smaller memory backlog; the larger is 4x")
    parser.add_argument("--memory-cap-mib", type=float, default=8.0,
                        help="max_bytes_per_shard of the memory runs: each batch reads at most this per shard")
    parser.add_argument("--memory-heap", default="1g", help="the memory jobs' fixed JVM heap (-Xms = -Xmx)")
    parser.add_argument("--memory-repeat", type=int, default=2, help="ingests of each memory backlog (maximum of the peaks)")
    parser.add_argument("--small-records", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=5, help="runs of each fixed-cost measurement (median)")
    parser.add_argument("--unthrottled-repeat", type=int, default=5, help="unthrottled runs of each consumer (median of the ratios)")
    parser.add_argument("--scale-shards", type=lambda s: [int(x) for x in s.split(",")], default=list(SCALE_SHARD_COUNTS),
                        help="shard counts of the scale section (comma-separated)")
    parser.add_argument("--scale-records-per-shard", type=int, default=20)
    parser.add_argument("--scale-repeat", type=int, default=3, help="runs of each scale measurement (median)")
    parser.add_argument("--shared-consumers", type=int, default=3)
    parser.add_argument("--shared-mib", type=float, default=64.0, help="the shared stream's backlog, polling")
    parser.add_argument("--shared-efo-mib", type=float, default=128.0, help="the shared stream's backlog, enhanced fan-out")
    parser.add_argument("--freshness-batches", type=int, default=30,
                        help="batches the freshness section measures (the issue asks for p50/p95 over at least 30)")
    parser.add_argument("--typed-mib", type=float, default=160.0,
                        help="each typed backlog read behind the limits (JSON, Avro)")
    parser.add_argument("--typed-unthrottled-mib", type=float, default=160.0,
                        help="each typed backlog read warm by a raw and a typed consumer")
    parser.add_argument("--typed-repeat", type=int, default=3, help="typed unthrottled runs of each format (median of the ratios)")
    parser.add_argument("--peers-mib", type=float, default=160.0, help="the backlog each peer consumer reads, throttled and not")
    parser.add_argument("--large-records-mib", type=float, default=160.0, help="the backlog of 10 MiB records read behind the limits")
    parser.add_argument("--large-records-memory-mib", type=float, default=160.0,
                        help="each backlog (10 MiB and 1 MiB records) whose job's peak memory is compared")
    parser.add_argument("--large-records-repeat", type=int, default=2, help="ingests of each memory backlog (maximum of the peaks)")
    parser.add_argument("--output", default=None, help="the report (default docs/benchmarks.md; with --only, none)")
    args = parser.parse_args(argv)
    only = args.only or list(SECTIONS)
    if "large_records" in only:  # checked before the first section, not after an hour of them
        from demo.stack import kinesalite_binary

        kinesalite_binary()
    output = args.output or (None if args.only else str(ROOT / "docs" / "benchmarks.md"))
    lines = access_log_lines(ROOT / "data" / "apache_access_log.gz")
    work = Path(tempfile.mkdtemp(prefix="kinesis-bench-"))
    os.environ.setdefault("AIRFLOW_HOME", str(work / "airflow"))
    results: dict[str, Any] = {"machine": machine(), "versions": versions(), "shards": args.shards,
                               "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                               "sections": [s for s in SECTIONS if s in only]}  # fmt: skip
    with ExitStack() as stack:
        moto = stack.enter_context(moto_server())
        bench = Bench(args=args, work=work, lines=lines, moto=moto, kinesis=client("kinesis", moto),
                      throttled=stack.enter_context(LimitsProxyProcess(moto)),
                      open_proxy=stack.enter_context(LimitsProxyProcess(moto, KinesisLimits(throttle=False))),
                      connect=("", 0))  # fmt: skip
        if set(only) & {"throttled", "unthrottled", "fixed_cost", "scale", "typed"}:  # the sections that use the warm server
            bench.log("starting a Spark Connect server")
            bench.connect = stack.enter_context(spark_connect_server(cores=2))
        sections = {"throttled": section_throttled, "unthrottled": section_unthrottled, "fixed_cost": section_fixed_cost,
                    "scale": section_scale, "shared": section_shared, "freshness": section_freshness,
                    "memory": section_memory, "typed": section_typed, "peers": section_peers,
                    "large_records": section_large_records}  # fmt: skip
        for name in SECTIONS:
            if name in only:
                started = time.monotonic()
                results[name] = sections[name](bench)
                results.setdefault("section_seconds", {})[name] = round(time.monotonic() - started, 1)
                bench.log(f"section {name} done in {results['section_seconds'][name]:.0f}s; "
                          f"{drop_streams(bench.kinesis)} of its streams deleted from moto")
    shutil.rmtree(work, ignore_errors=True)
    results["headline"] = headline(results)
    if output:
        from benchmarks.report import write_report

        write_report(Path(output), results, " ".join(["python -m benchmarks.run", *(argv if argv is not None else sys.argv[1:])]))
        if results.get("typed") is not None:  # its section and targets (benchmarks/typed.py)
            from benchmarks.typed import add_to_report

            add_to_report(Path(output), results)
        if results.get("peers") is not None:  # its section and targets (benchmarks/peers.py)
            from benchmarks.peers import add_to_report as add_peers

            add_peers(Path(output), results)
        if results.get("large_records") is not None:  # its section and targets (benchmarks/large_records.py)
            from benchmarks.large_records import add_to_report as add_large_records

            add_large_records(Path(output), results)
        bench.log(f"report written to {output}")
    print(json.dumps(results["headline"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
