"""``make bench``: our operator against the Kinesis read limits and a naive consumer.

    python -m benchmarks.run [--shards 4] [--throttled-mib 160] [--unthrottled-mib 160]
                             [--memory-mib 40] [--output docs/benchmarks.md]

Everything runs on 127.0.0.1: moto in server mode holds the stream and the checkpoint table;
Kinesis traffic goes through :class:`benchmarks.kinesis_limits.ThrottlingProxy`, which enforces
the service's per-shard read limits (throttled) or only its response caps (unthrottled). The
operator runs in this process, as an Airflow worker runs it (``execute``), with spark-submit
(cold: a JVM per batch) or over Spark Connect (warm: a running server).

Scenarios (each on its own stream, so each consumer starts at TRIM_HORIZON):

1. **throttled**: S shards, a backlog of B MiB; our operator (default settings: paced to the
   per-shard limits), then the naive consumer on the same backlog. Read rate = bytes served by
   the proxy / (last GetRecords response - first GetRecords call) for that stream.
2. **unthrottled**: the same for a second backlog with no rate limits; our figure is
   end-to-end (plan, read, Parquet write, commit: the ``execute`` wall time), the naive
   consumer's is read-only.
3. **fixed cost per micro-batch**: a run with no new records (no Spark), a small batch cold
   (spark-submit) and warm (Spark Connect); overheads are beyond the no-data run. The same new
   records also go, warm, to an Iceberg table (SQL catalog on SQLite) and a Delta table (own
   consumers): the table commit's cost is their batch's wall time beyond the Parquet batch's.
4. **memory**: peak resident memory of the Spark jobs (driver JVM and Python workers, sampled
   every 50 ms) while ingesting two backlogs 4x apart, with a per-shard cap
   (``max_bytes_per_shard``): each batch reads at most the cap per shard, a larger backlog takes
   more batches, not more memory.

The last line printed is one JSON object with the headline figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import boto3
import psutil

from benchmarks.kinesis_limits import MIB, KinesisLimits, ThrottlingProxy
from benchmarks.workload import access_log_lines, load_backlog, naive_consume
from demo.stack import ACCESS_KEY, REGION, ROOT, SECRET_KEY, moto_server, spark_connect_server

SPARK_CONF = {"spark.ui.enabled": "false", "spark.driver.memory": "1g"}


def client(service: str, endpoint: str) -> Any:
    return boto3.client(service, endpoint_url=endpoint, region_name=REGION, aws_access_key_id=ACCESS_KEY,
                        aws_secret_access_key=SECRET_KEY)  # fmt: skip


def use_connections(moto: str, kinesis_endpoint: str, spark_connect: tuple[str, int] | None) -> None:
    """Point ``aws_default`` at moto (Kinesis through ``kinesis_endpoint``) and define ``spark_connect_bench``."""
    os.environ["AIRFLOW_CONN_AWS_DEFAULT"] = json.dumps({
        "conn_type": "aws", "login": ACCESS_KEY, "password": SECRET_KEY,
        "extra": {"region_name": REGION, "endpoint_url": moto,
                  "service_config": {"kinesis": {"endpoint_url": kinesis_endpoint}}},
    })  # fmt: skip
    if spark_connect:
        os.environ["AIRFLOW_CONN_SPARK_CONNECT_BENCH"] = json.dumps(
            {"conn_type": "spark_connect", "host": spark_connect[0], "port": spark_connect[1]}
        )


def ingest(stream: str, output: Path, *, connect: bool = False, paced: bool = True,
           max_bytes_per_shard: int | None = None, consumer: str = "bench", **output_settings: Any) -> tuple[dict[str, Any], float]:
    """One run of the operator; returns its summary and wall time (seconds)."""
    from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator

    operator = KinesisToSparkOperator(
        task_id="bench", stream_name=stream, consumer_name=consumer, checkpoint_table=f"{stream}-ckpt",
        output_path=str(output), spark_conn_id="spark_connect_bench" if connect else "spark_default",
        spark_conf=SPARK_CONF, max_bytes_per_shard=max_bytes_per_shard,
        **({} if paced else {"read_bytes_per_second": None}), **output_settings,
    )  # fmt: skip
    started = time.monotonic()
    summary = operator.execute({})
    return summary, time.monotonic() - started


class MemorySampler:
    """Peak memory of the spark-submit job (its JVM and every Python process under it), as the
    sum of their proportional set sizes (PSS, Linux)."""

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self.peak_total = self.peak_jvm = self.peak_python = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _job_processes(self) -> list[psutil.Process]:
        roots = []
        for child in psutil.Process().children(recursive=True):
            try:
                if any("kinesis_batch.py" in part for part in child.cmdline()) and child.name() == "java":
                    roots.append(child)
            except psutil.Error:
                continue
        procs = []
        for root in roots:
            procs.append(root)
            try:
                procs.extend(root.children(recursive=True))
            except psutil.Error:
                pass
        return procs

    def _run(self) -> None:
        while not self._stop.is_set():
            jvm = python = 0
            for proc in self._job_processes():
                try:
                    # PSS: pages shared with another process (pyspark's forked workers share
                    # their daemon's) count once in all, not once per process as in RSS.
                    rss = proc.memory_full_info().pss
                    if proc.name() == "java":
                        jvm += rss
                    else:
                        python += rss
                except psutil.Error:
                    continue
            self.peak_jvm = max(self.peak_jvm, jvm)
            self.peak_python = max(self.peak_python, python)
            self.peak_total = max(self.peak_total, jvm + python)
            self._stop.wait(self.interval)


def new_stream(kinesis: Any, name: str, shards: int) -> None:
    kinesis.create_stream(StreamName=name, ShardCount=shards)
    kinesis.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 0.2})


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--throttled-mib", type=float, default=160.0)
    parser.add_argument("--unthrottled-mib", type=float, default=160.0)
    parser.add_argument("--memory-mib", type=float, default=64.0, help="the smaller memory backlog; the larger is 4x")
    parser.add_argument("--memory-cap-mib", type=float, default=16.0,
                        help="max_bytes_per_shard of the memory runs: each batch reads at most this per shard")
    parser.add_argument("--small-records", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=5, help="runs of each fixed-cost measurement (median)")
    parser.add_argument("--unthrottled-repeat", type=int, default=5, help="unthrottled runs of each consumer (median of the ratios)")
    parser.add_argument("--output", default=str(ROOT / "docs" / "benchmarks.md"))
    args = parser.parse_args(argv)
    lines = access_log_lines(ROOT / "data" / "apache_access_log.gz")
    work = Path(tempfile.mkdtemp(prefix="kinesis-bench-"))
    os.environ.setdefault("AIRFLOW_HOME", str(work / "airflow"))
    results: dict[str, Any] = {"machine": machine(), "versions": versions(), "shards": args.shards,
                               "started": datetime.now(timezone.utc).isoformat(timespec="seconds")}  # fmt: skip
    log = lambda msg: print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)  # noqa: E731
    with ExitStack() as stack:
        moto = stack.enter_context(moto_server())
        throttled = stack.enter_context(ThrottlingProxy(moto))
        open_proxy = stack.enter_context(ThrottlingProxy(moto, KinesisLimits(throttle=False)))
        log("starting a Spark Connect server")
        connect = stack.enter_context(spark_connect_server(cores=2))
        kinesis = client("kinesis", moto)

        # 1. throttled ------------------------------------------------------------------------
        stream = "bench-throttled"
        new_stream(kinesis, stream, args.shards)
        loaded = load_backlog(kinesis, stream, args.throttled_mib, lines)
        log(f"throttled: loaded {loaded}")
        use_connections(moto, throttled.endpoint, connect)
        summary, wall = ingest(stream, work / "out-throttled")
        check(summary, loaded, "throttled")
        ours = {
            "read_bytes_per_second": throttled.read_rate(stream),
            "get_records": throttled.stats[f"GetRecords:{stream}"],
            "throttled": throttled.stats[f"GetRecords.throttled:{stream}"],
            "expired": throttled.stats[f"GetRecords.expired:{stream}"],
            "wall_s": wall, "records": summary["records"],
        }  # fmt: skip
        log(f"throttled, ours: {ours}")
        naive = naive_consume(client("kinesis", throttled.endpoint), stream)
        if naive.user_records != loaded["user_records"]:
            raise SystemExit(f"naive consumer read {naive.user_records} of {loaded['user_records']} records")
        log(f"throttled, naive: {naive}")
        limit = args.shards * 2 * MIB
        results["throttled"] = {
            "backlog_mib": loaded["bytes"] / MIB, "user_records": loaded["user_records"],
            "kinesis_records": loaded["kinesis_records"], "ours": ours,
            "naive": {**naive.__dict__, "bytes_per_second": naive.bytes_per_second},
            "limit_bytes_per_second": limit, "lower_bound_s": loaded["bytes"] / limit,
        }  # fmt: skip

        # 2. unthrottled ----------------------------------------------------------------------
        # Warm means what a running micro-batch pipeline has: the consumer's Spark Connect session
        # already ran its previous batch (artifacts uploaded, Python workers started). Each repeat:
        # a fresh stream, one small batch through the consumer (not measured), the backlog, then
        # the naive consumer and ours on it. The naive consumer also reads the small batch's
        # records (its rate counts them).
        use_connections(moto, open_proxy.endpoint, connect)
        pairs = []
        for i in range(args.unthrottled_repeat):
            stream = f"bench-unthrottled-{i}"
            new_stream(kinesis, stream, args.shards)
            load_backlog(kinesis, stream, 1, lines)
            ingest(stream, work / f"out-{stream}", connect=True, paced=False)  # the consumer's previous batch
            loaded = load_backlog(kinesis, stream, args.unthrottled_mib, lines)
            log(f"unthrottled {i + 1}/{args.unthrottled_repeat}: loaded {loaded}")
            naive = naive_consume(client("kinesis", open_proxy.endpoint), stream)
            log(f"unthrottled, naive: {naive}")
            summary, wall = ingest(stream, work / f"out-{stream}", connect=True, paced=False)
            check(summary, loaded, "unthrottled")
            log(f"unthrottled, ours over Spark Connect: {summary['records']} records in {wall:.1f}s")
            pairs.append({"naive": {**naive.__dict__, "records_per_second": naive.records_per_second},
                          "ours_warm": {"wall_s": wall, "records": summary["records"],
                                        "records_per_second": summary["records"] / wall}})  # fmt: skip
        ratios = [p["ours_warm"]["records_per_second"] / p["naive"]["records_per_second"] for p in pairs]
        results["unthrottled"] = {
            "backlog_mib": loaded["bytes"] / MIB, "user_records": loaded["user_records"], "runs": pairs,
            "ratios": ratios, "ratio_median": statistics.median(ratios),
            "naive_records_per_second_median": statistics.median(p["naive"]["records_per_second"] for p in pairs),
            "ours_warm_records_per_second_median": statistics.median(p["ours_warm"]["records_per_second"] for p in pairs),
        }  # fmt: skip
        stream = "bench-unthrottled-cold"
        new_stream(kinesis, stream, args.shards)
        loaded = load_backlog(kinesis, stream, args.unthrottled_mib, lines)
        summary, wall = ingest(stream, work / "out-unthrottled-cold", paced=False)
        check(summary, loaded, "unthrottled, spark-submit")
        log(f"unthrottled, ours with spark-submit: {summary['records']} records in {wall:.1f}s")
        results["unthrottled"]["ours_cold"] = {"wall_s": wall, "records_per_second": summary["records"] / wall}

        # 3. fixed cost per micro-batch ---------------------------------------------------------
        stream = "bench-small"
        new_stream(kinesis, stream, args.shards)
        use_connections(moto, throttled.endpoint, connect)
        costs: dict[str, list[float]] = {"no_data": [], "cold": [], "warm": [], "warm_iceberg": [], "warm_delta": []}
        commits: dict[str, list[float]] = {"iceberg": [], "delta": []}
        # The table outputs: their own consumers (own checkpoints) of the same stream, so each warm
        # batch of a repetition reads the same new records in each format.
        tables = {
            "warm_iceberg": {"consumer": "bench-iceberg", "output_format": "iceberg", "table": "bench.small",
                             "catalog_properties": {"type": "sql", "uri": f"sqlite:///{work}/catalog.db"}},
            "warm_delta": {"consumer": "bench-delta", "output_format": "delta"},
        }  # fmt: skip
        ingest(stream, work / "out-small")  # first run: creates the checkpoint table; not measured
        ingest(stream, work / "out-small", connect=True)  # warms the Spark Connect server's workers
        for kind, settings in tables.items():  # creates the tables (one first batch each); not measured
            load_backlog(kinesis, stream, args.small_records * 300 / MIB, lines)
            ingest(stream, work / f"out-{kind}", connect=True, **settings)
        ingest(stream, work / "out-small", connect=True)
        for rep in range(args.repeat):
            summary, wall = ingest(stream, work / "out-small")
            assert summary["status"] == "no_new_records", summary
            costs["no_data"].append(wall)
            load_backlog(kinesis, stream, args.small_records * 300 / MIB, lines)
            order = ["warm", "warm_iceberg", "warm_delta"]
            order = order[rep % 3:] + order[: rep % 3]  # each format first as often as the others
            for kind in order:  # the same new records, in each format
                summary, wall = ingest(stream, work / f"out-{kind}" if kind in tables else work / "out-small",
                                       connect=True, **tables.get(kind, {}))  # fmt: skip
                assert summary["status"] == "committed", summary
                costs[kind].append(wall)
                if kind in tables:
                    commits[tables[kind]["output_format"]].append(summary["table"]["seconds"])
            load_backlog(kinesis, stream, args.small_records * 300 / MIB, lines)
            summary, wall = ingest(stream, work / "out-small")
            assert summary["status"] == "committed", summary
            costs["cold"].append(wall)
            for kind, settings in tables.items():  # keep the table consumers level with the stream
                ingest(stream, work / f"out-{kind}", connect=True, **settings)
        medians = {k: statistics.median(v) for k, v in costs.items()}
        log(f"fixed cost: {costs}; table commits: {commits}")
        results["fixed_cost"] = {"runs": costs, "median_s": medians, "table_commit_s": commits,
                                 "cold_overhead_s": medians["cold"] - medians["no_data"],
                                 "warm_overhead_s": medians["warm"] - medians["no_data"],
                                 "iceberg_overhead_s": medians["warm_iceberg"] - medians["warm"],
                                 "delta_overhead_s": medians["warm_delta"] - medians["warm"]}  # fmt: skip

        # 4. memory ------------------------------------------------------------------------------
        use_connections(moto, open_proxy.endpoint, connect)
        memory = []
        for mib in (args.memory_mib, 4 * args.memory_mib):
            stream = f"bench-memory-{int(mib)}"
            new_stream(kinesis, stream, args.shards)
            loaded = load_backlog(kinesis, stream, mib, lines)
            cap = int(args.memory_cap_mib * MIB)
            records, started, peaks = 0, time.monotonic(), []
            while True:  # batches of at most `cap` bytes per shard until the backlog is read
                with MemorySampler() as sampler:  # one per batch: the peak of each job
                    summary, _ = ingest(stream, work / f"out-{stream}", paced=False, max_bytes_per_shard=cap)
                if summary["status"] == "no_new_records":
                    break
                records += summary["records"]
                peaks.append(sampler)
            check({"records": records}, loaded, stream)
            memory.append({"backlog_mib": loaded["bytes"] / MIB, "records": records, "batches": len(peaks),
                           "cap_mib_per_shard": args.memory_cap_mib, "wall_s": time.monotonic() - started,
                           "peak_total_mib": max(p.peak_total for p in peaks) / MIB,
                           "peak_jvm_mib": max(p.peak_jvm for p in peaks) / MIB,
                           "peak_python_mib": max(p.peak_python for p in peaks) / MIB,
                           "per_batch_peak_total_mib": [round(p.peak_total / MIB) for p in peaks]})  # fmt: skip
            log(f"memory: {memory[-1]}")
        results["memory"] = memory
        uncapped = []
        for mib in (args.memory_mib, 4 * args.memory_mib):  # the same backlogs, each in one batch
            stream = f"bench-memory-uncapped-{int(mib)}"
            new_stream(kinesis, stream, args.shards)
            loaded = load_backlog(kinesis, stream, mib, lines)
            with MemorySampler() as sampler:
                summary, wall = ingest(stream, work / f"out-{stream}", paced=False)
            check(summary, loaded, stream)
            uncapped.append({"backlog_mib": loaded["bytes"] / MIB, "records": summary["records"], "batches": 1,
                             "wall_s": wall, "peak_total_mib": sampler.peak_total / MIB,
                             "peak_jvm_mib": sampler.peak_jvm / MIB, "peak_python_mib": sampler.peak_python / MIB})  # fmt: skip
            log(f"memory, one uncapped batch: {uncapped[-1]}")
        results["memory_uncapped"] = uncapped
    shutil.rmtree(work, ignore_errors=True)

    t, u, f = results["throttled"], results["unthrottled"], results["fixed_cost"]
    headline = {
        "throttled_fraction_of_limit": round(t["ours"]["read_bytes_per_second"] / t["limit_bytes_per_second"], 3),
        "throttled_vs_naive": round(t["ours"]["read_bytes_per_second"] / t["naive"]["bytes_per_second"], 2),
        "unthrottled_vs_naive": round(u["ratio_median"], 2),
        "unthrottled_cold_vs_naive": round(u["ours_cold"]["records_per_second"] / u["naive_records_per_second_median"], 2),
        "ptee_fraction": round(t["ours"]["throttled"] / max(1, t["ours"]["get_records"]), 4),
        "expired_iterators": t["ours"]["expired"],
        "no_data_run_s": round(f["median_s"]["no_data"], 2),
        "cold_overhead_s": round(f["cold_overhead_s"], 2),
        "warm_overhead_s": round(f["warm_overhead_s"], 2),
        "iceberg_overhead_s": round(f["iceberg_overhead_s"], 2),
        "delta_overhead_s": round(f["delta_overhead_s"], 2),
        "iceberg_commit_s": round(statistics.median(f["table_commit_s"]["iceberg"]), 3),
        "delta_commit_s": round(statistics.median(f["table_commit_s"]["delta"]), 3),
        "peak_memory_ratio": round(results["memory"][1]["peak_total_mib"] / results["memory"][0]["peak_total_mib"], 3),
        "peak_memory_ratio_uncapped": round(
            results["memory_uncapped"][1]["peak_total_mib"] / results["memory_uncapped"][0]["peak_total_mib"], 3
        ),
    }
    results["headline"] = headline
    from benchmarks.report import write_report

    write_report(Path(args.output), results, " ".join(["python -m benchmarks.run", *(argv or sys.argv[1:])]))
    log(f"report written to {args.output}")
    print(json.dumps(headline), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
