"""Write ``docs/benchmarks.md`` from one ``make bench`` run (every figure comes from ``results``)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

MIB = 1024 * 1024


def _row(*cells: object) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def targets(h: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """The issue's targets, each with the measured value and whether it is met."""
    return [
        ("throttled read rate >= 0.85 x the limit", f"{h['throttled_fraction_of_limit']:.3f}", h["throttled_fraction_of_limit"] >= 0.85),
        ("throttled calls <= 2 % of GetRecords", f"{100 * h['ptee_fraction']:.2f} %", h["ptee_fraction"] <= 0.02),
        ("no expired iterators", str(h["expired_iterators"]), h["expired_iterators"] == 0),
        ("throttled, vs the naive consumer >= 3x", f"{h['throttled_vs_naive']}x", h["throttled_vs_naive"] >= 3),
        ("unthrottled, end to end >= the naive consumer's read-only rate", f"{h['unthrottled_vs_naive']}x",
         h["unthrottled_vs_naive"] >= 1),
        ("warm batch <= 1.5 s more than the no-data run", f"{h['warm_overhead_s']:.2f} s", h["warm_overhead_s"] <= 1.5),
        ("warm Iceberg batch <= 0.5 s more than a warm Parquet batch", f"{h['iceberg_overhead_s']:.2f} s",
         h["iceberg_overhead_s"] <= 0.5),
        ("warm Delta batch <= 0.5 s more than a warm Parquet batch", f"{h['delta_overhead_s']:.2f} s", h["delta_overhead_s"] <= 0.5),
        ("peak memory at 4x the backlog within 20 %", f"{h['peak_memory_ratio']:.3f}", abs(h["peak_memory_ratio"] - 1) <= 0.2),
    ]  # fmt: skip


def write_report(path: Path, results: dict[str, Any], command: str) -> None:
    t, u, f, m, h = (results[k] for k in ("throttled", "unthrottled", "fixed_cost", "memory", "headline"))
    ours, naive = t["ours"], t["naive"]
    v = results["versions"]
    lines = [
        "# Benchmarks",
        "",
        "Produced by `make bench` (`python -m benchmarks.run`); this file is rewritten by every run.",
        "Nothing here is typed by hand. The code is in `benchmarks/`.",
        "",
        f"- Run: `{command}`, started {results['started']}",
        f"- Machine: {results['machine']}",
        f"- Versions: Python {v['python']}, Airflow {v['airflow']}, PySpark {v['pyspark']}, moto {v['moto']}, "
        f"boto3 {v['boto3']}, {v['java']}",
        f"- Stream: {results['shards']} shards on moto (server mode, 127.0.0.1); records are lines of the shared "
        "Apache access log, KPL-aggregated into Kinesis records of about 50 KiB.",
        "- Kinesis traffic goes through `benchmarks/kinesis_limits.py`, a proxy that answers like the service: "
        "5 GetRecords calls/s and 2 MiB/s per shard (a response of B bytes is a debt that drains at 2 MiB/s; "
        "a call while in debt is throttled, so a 10 MiB response blocks the shard for 5 s), at most 10 MiB and "
        "10,000 records per response, 5 GetShardIterator calls/s per shard, shard iterators expire after 5 minutes. "
        "Unthrottled, only the response caps and the expiry apply. The proxy asks moto for pieces of about "
        "10 MiB, never for a caller's whole `Limit` (moto would serialize the rest of the shard for every "
        "`Limit=10000` call, work the service never does, and it would slow the naive consumer down).",
        "- The naive consumer (`benchmarks/workload.py`): one thread, one shard after the other, "
        "`GetRecords(Limit=10000)` until caught up, aws_kinesis_agg de-aggregation, sleep 1 s when throttled "
        "(after boto3's own retries).",
        "- Our operator runs in the benchmark's process (`execute`, as an Airflow worker runs it); "
        "Spark is `local[*]` with spark-submit (cold) or a Spark Connect server with `local[2]` (warm).",
        "",
        "## Headline",
        "",
        "```json",
        json.dumps(h),
        "```",
        "",
        "## 1. Throttled: against the per-shard read limit",
        "",
        f"Backlog: {t['backlog_mib']:.1f} MiB ({t['user_records']:,} user records in {t['kinesis_records']:,} Kinesis "
        f"records) on {results['shards']} shards. The service's ceiling is {results['shards']} x 2 MiB/s = "
        f"{t['limit_bytes_per_second'] / MIB:.0f} MiB/s, so the backlog cannot be read in less than "
        f"{t['lower_bound_s']:.1f} s.",
        "",
        _row("consumer", "read rate (MiB/s)", "fraction of the limit", "GetRecords calls", "throttled calls",
             "expired iterators", "wall time (s)"),  # fmt: skip
        _row(*["---"] * 7),
        _row("ours (operator, spark-submit)", f"{ours['read_bytes_per_second'] / MIB:.2f}",
             f"{h['throttled_fraction_of_limit']:.3f}", ours["get_records"], ours["throttled"], ours["expired"],
             f"{ours['wall_s']:.1f} (end to end)"),  # fmt: skip
        _row("naive", f"{naive['bytes_per_second'] / MIB:.2f}",
             f"{naive['bytes_per_second'] / t['limit_bytes_per_second']:.3f}", naive["get_records_calls"],
             naive["throttled"], 0, f"{naive['seconds']:.1f} (read only)"),  # fmt: skip
        "",
        "Our read rate is the bytes the proxy served to the Spark job's readers divided by the time from their "
        "first GetRecords call to the last response: the job's read phase. The operator's probes before the job "
        "(one `GetRecords` with `Limit` 1 per shard) are not counted; JVM start, Parquet write and commit are in "
        "the wall time. Throttled calls are counted by the proxy, which also sees the retries boto3 makes on its "
        "own. "
        f"Ratio to the naive consumer: **{h['throttled_vs_naive']}x**.",
        "",
        "## 2. Unthrottled: end to end against a read-only loop",
        "",
        f"Backlog: {u['backlog_mib']:.1f} MiB ({u['user_records']:,} user records) on a fresh stream per run. Our "
        "figure is the operator's whole run (plan, probes, read, Parquet write, commit); the naive consumer only "
        "reads and de-aggregates. Our readers run without byte pacing here (`read_bytes_per_second=None`: there "
        "is no limit to pace to). Warm means what a running micro-batch pipeline has: the consumer's Spark "
        "Connect session ran its previous batch (a small one, not measured; the naive consumer reads its records "
        "too, and they count in its rate). Moto, the proxy and both consumers share the machine's cores.",
        "",
        _row("run", "naive records/s (read only)", "ours, warm, records/s (end to end)", "ours wall time (s)", "ours vs naive"),
        _row(*["---"] * 5),
        *[
            _row(i + 1, f"{p['naive']['records_per_second']:,.0f}", f"{p['ours_warm']['records_per_second']:,.0f}",
                 f"{p['ours_warm']['wall_s']:.1f}", f"{r:.2f}x")  # fmt: skip
            for i, (p, r) in enumerate(zip(u["runs"], u["ratios"], strict=True))
        ],
        "",
        f"Median of the ratios: **{h['unthrottled_vs_naive']}x**. Cold (spark-submit, JVM start included, one run "
        f"on a fresh stream): {u['ours_cold']['records_per_second']:,.0f} records/s in {u['ours_cold']['wall_s']:.1f} s, "
        f"{h['unthrottled_cold_vs_naive']}x the naive consumer's median rate.",
        "",
        "## 3. Fixed cost per micro-batch",
        "",
        "Median of the runs below; a small batch is a few hundred records. Overheads are beyond the no-data run.",
        "",
        _row("run", "median (s)", "runs (s)", "overhead beyond the no-data run (s)"),
        _row(*["---"] * 4),
        _row("no new records (no Spark job)", f"{f['median_s']['no_data']:.2f}",
             ", ".join(f"{x:.2f}" for x in f["runs"]["no_data"]), "-"),  # fmt: skip
        _row("small batch, cold (spark-submit)", f"{f['median_s']['cold']:.2f}",
             ", ".join(f"{x:.2f}" for x in f["runs"]["cold"]), f"{f['cold_overhead_s']:.2f}"),  # fmt: skip
        _row("small batch, warm (Spark Connect)", f"{f['median_s']['warm']:.2f}",
             ", ".join(f"{x:.2f}" for x in f["runs"]["warm"]), f"{f['warm_overhead_s']:.2f}"),  # fmt: skip
        "",
        "The same new records, warm, into an Iceberg table (pyiceberg, SQL catalog on SQLite) and a Delta table "
        "(deltalake), each by its own consumer: the table commit's cost is the batch's wall time beyond the warm "
        "Parquet batch's; the commit itself (`table.seconds` of the summary) is measured by the protocol.",
        "",
        _row("output", "median (s)", "runs (s)", "beyond the warm Parquet batch (s)", "table commit, median (s)"),
        _row(*["---"] * 5),
        *[_row(f"warm, {fmt}", f"{f['median_s']['warm_' + fmt]:.2f}", ", ".join(f"{x:.2f}" for x in f["runs"]["warm_" + fmt]),
               f"{f[fmt + '_overhead_s']:.2f}", f"{statistics.median(f['table_commit_s'][fmt]):.3f}")
          for fmt in ("iceberg", "delta")],  # fmt: skip
        "",
        "## 4. Memory",
        "",
        "Peak memory (proportional set size: pages shared by pyspark's forked workers count once) of a "
        "spark-submit job, sampled every 50 ms: the JVM (driver and executor in "
        "local mode, `spark.driver.memory=1g`) and the Python processes under it; the largest peak of the jobs it took to "
        f"ingest the backlog with `max_bytes_per_shard` = {m[0]['cap_mib_per_shard']:.0f} MiB. Reads are streamed "
        "(`mapInArrow`, at most two GetRecords pages per shard waiting), and only the per-shard reports reach the "
        "driver. A batch's memory follows the per-shard cap, so a larger backlog takes more batches, not more "
        "memory. The same backlogs read in one uncapped batch each are in the second table.",
        "",
        _row("backlog (MiB)", "records", "batches", "peak total (MiB)", "JVM (MiB)", "Python, driver + workers (MiB)", "wall time (s)"),
        _row(*["---"] * 7),
        *[
            _row(f"{r['backlog_mib']:.1f}", f"{r['records']:,}", r["batches"], f"{r['peak_total_mib']:.0f}",
                 f"{r['peak_jvm_mib']:.0f}", f"{r['peak_python_mib']:.0f}", f"{r['wall_s']:.1f}")  # fmt: skip
            for r in m
        ],
        "",
        f"Ratio of the peaks: **{h['peak_memory_ratio']}** for a {m[1]['backlog_mib'] / m[0]['backlog_mib']:.1f}x "
        "larger backlog.",
        "",
        "One uncapped batch per backlog (no `max_bytes_per_shard`):",
        "",
        _row("backlog (MiB)", "records", "peak total (MiB)", "JVM (MiB)", "Python, driver + workers (MiB)", "wall time (s)"),
        _row(*["---"] * 6),
        *[
            _row(f"{r['backlog_mib']:.1f}", f"{r['records']:,}", f"{r['peak_total_mib']:.0f}", f"{r['peak_jvm_mib']:.0f}",
                 f"{r['peak_python_mib']:.0f}", f"{r['wall_s']:.1f}")  # fmt: skip
            for r in results["memory_uncapped"]
        ],
        "",
        f"Ratio of the peaks without a cap: **{h['peak_memory_ratio_uncapped']}**.",
        "",
        "## Against the targets",
        "",
        _row("target", "measured", "met"),
        _row(*["---"] * 3),
        *[_row(name, value, "yes" if ok else "**no**") for name, value, ok in targets(h)],
        "",
        "## Raw results",
        "",
        "```json",
        json.dumps({k: v for k, v in results.items() if k != "headline"}, indent=1, default=str),
        "```",
        "",
    ]
    path.write_text("\n".join(lines), encoding="utf-8")
