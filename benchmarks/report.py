"""Write ``docs/benchmarks.md`` from one ``make bench`` run (every figure comes from ``results``)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

MIB = 1024 * 1024


def row(*cells: object) -> str:
    """One row of a Markdown table."""
    return "| " + " | ".join(str(c) for c in cells) + " |"




#: Shared stream, polling: each of the consumers gets at most about a third of each shard's 2 MiB/s
#: (they share it); "about": 0.35.
SHARED_POLLING_MAX = 0.35
#: Shared stream, enhanced fan-out: each consumer gets at least this fraction of 2 MiB/s per shard.
SHARED_EFO_MIN = 0.85


def targets(h: dict[str, Any], results: dict[str, Any] | None = None) -> list[tuple[str, str, bool]]:
    """The issues' targets of the sections that ran, each with the measured value and whether it is met."""
    out: list[tuple[str, str, bool]] = []
    if "throttled_fraction_of_limit" in h:
        out += [
            ("throttled read rate >= 0.85 x the limit", f"{h['throttled_fraction_of_limit']:.3f}", h["throttled_fraction_of_limit"] >= 0.85),
            ("throttled calls <= 2 % of GetRecords", f"{100 * h['ptee_fraction']:.2f} %", h["ptee_fraction"] <= 0.02),
            ("no expired iterators", str(h["expired_iterators"]), h["expired_iterators"] == 0),
            ("throttled, vs the naive consumer >= 3x", f"{h['throttled_vs_naive']}x", h["throttled_vs_naive"] >= 3),
        ]  # fmt: skip
    if "unthrottled_vs_naive" in h:
        out.append(("unthrottled, end to end >= the naive consumer's read-only rate", f"{h['unthrottled_vs_naive']}x",
                    h["unthrottled_vs_naive"] >= 1))  # fmt: skip
    if "warm_overhead_s" in h:
        out += [
            ("warm batch <= 1.5 s more than the no-data run", f"{h['warm_overhead_s']:.2f} s", h["warm_overhead_s"] <= 1.5),
            ("warm Iceberg batch <= 0.5 s more than a warm Parquet batch", f"{h['iceberg_overhead_s']:.2f} s",
             h["iceberg_overhead_s"] <= 0.5),
            ("warm Delta batch <= 0.5 s more than a warm Parquet batch", f"{h['delta_overhead_s']:.2f} s", h["delta_overhead_s"] <= 0.5),
        ]  # fmt: skip
    if results is not None and "scale" in results:
        from benchmarks.scale import scale_targets

        out += scale_targets(results["scale"])
    if "shared_polling_fraction" in h:
        polling, efo = h["shared_polling_fraction"], h["shared_efo_fraction"]
        out += [
            (f"shared stream, polling: each consumer <= about a third of 2 MiB/s per shard (<= {SHARED_POLLING_MAX})",
             ", ".join(f"{x:.3f}" for x in polling), max(polling) <= SHARED_POLLING_MAX),
            (f"shared stream, enhanced fan-out: each consumer >= {SHARED_EFO_MIN} of 2 MiB/s per shard",
             ", ".join(f"{x:.3f}" for x in efo), min(efo) >= SHARED_EFO_MIN),
        ]  # fmt: skip
    if results is not None and results.get("freshness") is not None:
        from benchmarks.freshness import freshness_targets

        out += freshness_targets(results["freshness"])
    if "peak_memory_ratio" in h:
        out.append(("peak memory at 4x the backlog within 20 % (maximum over the repeats)", f"{h['peak_memory_ratio']:.3f}",
                    abs(h["peak_memory_ratio"] - 1) <= 0.2))  # fmt: skip
    return out


def _intro(results: dict[str, Any], command: str) -> list[str]:
    v = results["versions"]
    return [
        "# Benchmarks",
        "",
        "Produced by `make bench` (`python -m benchmarks.run`); this file is rewritten by every run.",
        "Nothing here is typed by hand. The code is in `benchmarks/`.",
        "",
        f"- Run: `{command}`, started {results['started']}",
        f"- Machine: {results['machine']}",
        f"- Versions: Python {v['python']}, Airflow {v['airflow']}, PySpark {v['pyspark']}, moto {v['moto']}, "
        f"boto3 {v['boto3']}, {v['java']}",
        f"- Stream: {results['shards']} shards on moto (server mode, 127.0.0.1, started by `demo/moto_server.py`, which "
        "keeps moto's list of its service packages instead of listing its package directory twice per request: "
        "half of moto's CPU per call, spent on the cores the provider runs on); records are lines of the shared "
        "Apache access log, KPL-aggregated into Kinesis records of about 50 KiB. Each section's streams (and "
        "each unthrottled run's) are deleted from moto after it: moto keeps every record in memory, and its cost "
        "per call grows with what it holds.",
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
        "- Sections run (seconds each): "
        + ", ".join(f"{k} {v:.0f}" for k, v in results.get("section_seconds", {}).items())
        + ". One section alone: `python -m benchmarks.run --only scale` (see `benchmarks/README.md`).",
        "",
    ]


def _throttled(n: int, results: dict[str, Any]) -> list[str]:
    t, h = results["throttled"], results["headline"]
    ours, naive = t["ours"], t["naive"]
    return [
        f"## {n}. Throttled: against the per-shard read limit",
        "",
        f"Backlog: {t['backlog_mib']:.1f} MiB ({t['user_records']:,} user records in {t['kinesis_records']:,} Kinesis "
        f"records) on {results['shards']} shards. The service's ceiling is {results['shards']} x 2 MiB/s = "
        f"{t['limit_bytes_per_second'] / MIB:.0f} MiB/s, so the backlog cannot be read in less than "
        f"{t['lower_bound_s']:.1f} s.",
        "",
        row("consumer", "read rate (MiB/s)", "fraction of the limit", "GetRecords calls", "throttled calls",
             "expired iterators", "wall time (s)"),  # fmt: skip
        row(*["---"] * 7),
        row("ours (operator, spark-submit)", f"{ours['read_bytes_per_second'] / MIB:.2f}",
             f"{h['throttled_fraction_of_limit']:.3f}", ours["get_records"], ours["throttled"], ours["expired"],
             f"{ours['wall_s']:.1f} (end to end)"),  # fmt: skip
        row("naive", f"{naive['bytes_per_second'] / MIB:.2f}",
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
    ]


def _unthrottled(n: int, results: dict[str, Any]) -> list[str]:
    u, h = results["unthrottled"], results["headline"]
    return [
        f"## {n}. Unthrottled: end to end against a read-only loop",
        "",
        f"Backlog: {u['backlog_mib']:.1f} MiB ({u['user_records']:,} user records) on a fresh stream per run. Our "
        "figure is the operator's whole run (plan, probes, read, Parquet write, commit); the naive consumer only "
        "reads and de-aggregates. Our readers run without byte pacing here (`ReadOptions(read_bytes_per_second=None)`: there "
        "is no limit to pace to). Warm means what a running micro-batch pipeline has: the consumer's Spark "
        "Connect session ran its previous batch (a small one, not measured; the naive consumer reads its records "
        "too, and they count in its rate). Moto, the proxy and both consumers share the machine's cores.",
        "",
        row("run", "naive records/s (read only)", "ours, warm, records/s (end to end)", "ours wall time (s)", "ours vs naive"),
        row(*["---"] * 5),
        *[
            row(i + 1, f"{p['naive']['records_per_second']:,.0f}", f"{p['ours_warm']['records_per_second']:,.0f}",
                 f"{p['ours_warm']['wall_s']:.1f}", f"{r:.2f}x")  # fmt: skip
            for i, (p, r) in enumerate(zip(u["runs"], u["ratios"], strict=True))
        ],
        "",
        f"Median of the ratios: **{h['unthrottled_vs_naive']}x**. Cold (spark-submit, JVM start included, one run "
        f"on a fresh stream): {u['ours_cold']['records_per_second']:,.0f} records/s in {u['ours_cold']['wall_s']:.1f} s, "
        f"{h['unthrottled_cold_vs_naive']}x the naive consumer's median rate.",
        "",
    ]


def _fixed_cost(n: int, results: dict[str, Any]) -> list[str]:
    f = results["fixed_cost"]
    return [
        f"## {n}. Fixed cost per micro-batch",
        "",
        "Median of the runs below; a small batch is a few hundred records. Overheads are beyond the no-data run.",
        "",
        row("run", "median (s)", "runs (s)", "overhead beyond the no-data run (s)"),
        row(*["---"] * 4),
        row("no new records (no Spark job)", f"{f['median_s']['no_data']:.2f}",
             ", ".join(f"{x:.2f}" for x in f["runs"]["no_data"]), "-"),  # fmt: skip
        row("small batch, cold (spark-submit)", f"{f['median_s']['cold']:.2f}",
             ", ".join(f"{x:.2f}" for x in f["runs"]["cold"]), f"{f['cold_overhead_s']:.2f}"),  # fmt: skip
        row("small batch, warm (Spark Connect)", f"{f['median_s']['warm']:.2f}",
             ", ".join(f"{x:.2f}" for x in f["runs"]["warm"]), f"{f['warm_overhead_s']:.2f}"),  # fmt: skip
        "",
        "The same new records, warm, into an Iceberg table (pyiceberg, SQL catalog on SQLite) and a Delta table "
        "(deltalake), each by its own consumer: the table commit's cost is the batch's wall time beyond the warm "
        "Parquet batch's; the commit itself (`table.seconds` of the summary) is measured by the protocol.",
        "",
        row("output", "median (s)", "runs (s)", "beyond the warm Parquet batch (s)", "table commit, median (s)"),
        row(*["---"] * 5),
        *[row(f"warm, {fmt}", f"{f['median_s']['warm_' + fmt]:.2f}", ", ".join(f"{x:.2f}" for x in f["runs"]["warm_" + fmt]),
               f"{f[fmt + '_overhead_s']:.2f}", f"{statistics.median(f['table_commit_s'][fmt]):.3f}")
          for fmt in ("iceberg", "delta")],  # fmt: skip
        "",
    ]


def _scale(n: int, results: dict[str, Any]) -> list[str]:
    from benchmarks.scale import scale_markdown

    return [f"## {n}. Scale in shards", "", *scale_markdown(results["scale"]), ""]


def _shared(n: int, results: dict[str, Any]) -> list[str]:
    s = results["shared"]
    rows = []
    for kind, label in (("polling", "polling (GetRecords)"), ("efo", "enhanced fan-out (SubscribeToShard)")):
        for r in s[kind]["runs"]:
            rows.append(row(label, r["consumer"], f"{r['kinesis_bytes'] / MIB:.1f}", f"{r['read_offset_s']:.1f}", f"{r['read_s']:.1f}",
                             f"{r['bytes_per_second'] / MIB:.2f}", f"{r['fraction_per_shard']:.3f}", r["responses"],
                             r["throttled_calls"]))  # fmt: skip
    return [
        f"## {n}. Shared stream: {s['consumers']} consumers at once",
        "",
        f"{s['consumers']} consumers, each with its own checkpoints, read one backlog on {s['shards']} shards at the "
        f"same time (polling: {s['polling']['backlog_mib']:.1f} MiB, {s['polling']['user_records']:,} user records; "
        f"enhanced fan-out: {s['efo']['backlog_mib']:.1f} MiB, {s['efo']['user_records']:,} user records, on a stream "
        "of its own): each consumer's batch runs in its own process (as Airflow runs tasks) over one Spark Connect "
        f"server with {s['consumers']} task slots (`ReadOptions(read_tasks=1)`: one task reads every shard of a consumer's batch). "
        "Both go through the limits proxy: polling consumers share each shard's 2 MiB/s and 5 calls/s; "
        "SubscribeToShard (each consumer registered as a stream consumer) pushes at most 2 MiB/s per consumer and "
        "shard. Each consumer ran a first small batch before (not measured): its server session is warm. "
        "A consumer's read rate is the Kinesis bytes its job "
        "read divided by the time from its first read's start to its last read's end (from the report it recorded "
        "in the checkpoint store); the fraction is of 2 MiB/s per shard. A throttled reader retries about every 0.2 s "
        "and paces itself to a smaller share of the shard's budget (docs/concepts.md, Throttling); its report counts "
        "every throttled call (botocore does not retry them). The proxy's counts for each stream (calls, "
        "throttled calls, subscriptions, events) are in the raw results (`proxy_counts`).",
        "",
        row("consumer type", "consumer", "read (MiB)", "began reading after the first (s)", "read time (s)",
             "read rate (MiB/s)", "fraction of 2 MiB/s per shard", "responses", "throttled calls"),  # fmt: skip
        row(*["---"] * 9),
        *rows,
        "",
    ]


def _freshness(n: int, results: dict[str, Any]) -> list[str]:
    from benchmarks.freshness import freshness_section

    return freshness_section(results["freshness"], heading=f"## {n}. Freshness: the event-driven DAG")


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


#: The memory section's process roles (``benchmarks.run.ROLES``) as the report names them.
_ROLE_NAMES = {"jvm": "JVM", "python_driver": "Python driver", "pyspark_daemon": "pyspark daemon",
               "python_workers": "Python workers", "other": "other"}  # fmt: skip


def _peak_by_role(rows: list[dict[str, Any]]) -> str:
    """The memory rows' highest peaks by process role (one sentence), or ``""`` for results without them."""
    parts = [
        f"{r['backlog_mib']:.0f} MiB backlog: "
        + ", ".join(f"{_ROLE_NAMES.get(role, role)} {mib:.0f}" for role, mib in r["peak_by_role_mib"].items())
        for r in rows
        if r.get("peak_by_role_mib")
    ]
    return f" The highest peak of each row by process role (MiB; JSON: `peak_processes`): {'; '.join(parts)}." if parts else ""


def _memory(n: int, results: dict[str, Any]) -> list[str]:
    m, h = results["memory"], results["headline"]
    capped, uncapped = m["capped"], m["uncapped"]
    java_options = m["spark_conf"].get("spark.driver.extraJavaOptions", "")
    return [
        f"## {n}. Memory",
        "",
        "Peak memory (proportional set size: pages shared by pyspark's forked workers count once) of a "
        "spark-submit job, sampled every 50 ms: the JVM (driver and executor in local mode) and the Python "
        f"processes under it. The job's heap is fixed: `spark.driver.memory={m['heap']}` and "
        f"`spark.driver.extraJavaOptions={java_options}` (initial heap = maximum heap, touched in full when the "
        "JVM starts; the benchmark adds a GC log). With the JVM's defaults the heap starts at 1/64 of the "
        "machine's memory and grows when and as far as the garbage collector decides, so a job's peak followed the "
        "collector's timing (one run's capped ratio was 1.219, another's 1.006). With a fixed heap the JVM's figure "
        "is the heap plus what the JVM uses beyond it (metaspace, threads, direct buffers), and what the job keeps "
        "alive in the heap is the heap in use after each garbage collection (from the GC log), shown apart. "
        f"Each backlog is ingested {'once' if m['repeat'] == 1 else str(m['repeat']) + ' times'}, each time on a fresh "
        f"stream with `max_bytes_per_shard` = "
        f"{capped[0]['cap_mib_per_shard']:.0f} MiB, and a row gives the largest figures over every job of every "
        "repeat. Reads are streamed (`mapInArrow`, at most two GetRecords pages per shard waiting), and only the "
        "per-shard reports reach the driver. A batch's memory follows the per-shard cap, so a larger backlog "
        "takes more batches, not more memory. The same backlogs read in one uncapped batch each are in the "
        "second table. PSS divides a page of a file that several processes map (the JVM's libraries, Spark's "
        "jars) among them, so other JVMs running on the machine at the same time lower a job's figure a little: "
        "compare runs made on an otherwise idle machine.",
        "",
        row("backlog (MiB)", "records", "batches", "peak total, max (MiB)", "peak total per repeat (MiB)", "JVM, max (MiB)",
             "heap in use after GC, max (MiB)", "Python, driver + workers, max (MiB)", "wall time, median (s)"),  # fmt: skip
        row(*["---"] * 9),
        *[
            row(f"{r['backlog_mib']:.1f}", f"{r['records']:,}", r["batches"], f"{r['peak_total_mib']:.0f}",
                 ", ".join(str(x) for x in r["peak_total_mib_runs"]), f"{r['peak_jvm_mib']:.0f}",
                 _mib(r.get("heap_after_gc_mib")), f"{r['peak_python_mib']:.0f}", f"{r['wall_s']:.1f}")  # fmt: skip
            for r in capped
        ],
        "",
        f"Ratio of the peaks: **{h['peak_memory_ratio']}** for a {capped[1]['backlog_mib'] / capped[0]['backlog_mib']:.1f}x "
        "larger backlog." + (
            f" The heap in use after GC, max: {capped[0]['heap_after_gc_mib']:.0f} and {capped[1]['heap_after_gc_mib']:.0f} MiB "
            f"(inside the fixed {m['heap']} heap, so it does not move the peaks)."
            if capped[0].get("heap_after_gc_mib") and capped[1].get("heap_after_gc_mib") else "")
        + _peak_by_role(capped),
        "",
        "One uncapped batch per backlog (no `max_bytes_per_shard`; one run each):",
        "",
        row("backlog (MiB)", "records", "peak total (MiB)", "JVM (MiB)", "heap in use after GC, max (MiB)",
             "Python, driver + workers (MiB)", "wall time (s)"),  # fmt: skip
        row(*["---"] * 7),
        *[
            row(f"{r['backlog_mib']:.1f}", f"{r['records']:,}", f"{r['peak_total_mib']:.0f}", f"{r['peak_jvm_mib']:.0f}",
                 _mib(r.get("heap_after_gc_mib")), f"{r['peak_python_mib']:.0f}", f"{r['wall_s']:.1f}")  # fmt: skip
            for r in uncapped
        ],
        "",
        f"Ratio of the peaks without a cap: **{h['peak_memory_ratio_uncapped']}**.",
        "",
    ]


#: The report's sections in order: (results key, writer).
SECTION_WRITERS = (
    ("throttled", _throttled), ("unthrottled", _unthrottled), ("fixed_cost", _fixed_cost), ("scale", _scale),
    ("shared", _shared), ("freshness", _freshness), ("memory", _memory),
)  # fmt: skip


def add_section(path: Path, title: str, markdown: Callable[[str], list[str]], target_rows: list[tuple[str, str, bool]]) -> None:
    """Put a section into a report :func:`write_report` wrote: before "Against the targets",
    numbered after the report's last numbered section (``markdown`` gets its heading, ``## N.
    title``), and ``target_rows`` at the end of the targets table."""
    lines = path.read_text(encoding="utf-8").split("\n")
    start = lines.index("## Against the targets")
    n = len([line for line in lines[:start] if line.startswith("## ") and line[3:4].isdigit()]) + 1
    section = markdown(f"## {n}. {title}")
    end = start + 1
    while end < len(lines) and not lines[end].startswith("|"):  # the table's first line
        end += 1
    while end < len(lines) and lines[end].startswith("|"):  # past its last row
        end += 1
    rows = [row(name, value, "yes" if ok else "**no**") for name, value, ok in target_rows]
    path.write_text("\n".join(lines[:start] + section + lines[start:end] + rows + lines[end:]), encoding="utf-8")


def write_report(path: Path, results: dict[str, Any], command: str) -> None:
    """Write the report of one run: the sections that ran, the targets, the raw results (JSON)."""
    h = results["headline"]
    lines = [*_intro(results, command), "## Headline", "", "```json", json.dumps(h), "```", ""]
    n = 0
    for key, writer in SECTION_WRITERS:
        if results.get(key) is not None:
            n += 1
            lines += writer(n, results)
    lines += [
        "## Against the targets",
        "",
        row("target", "measured", "met"),
        row(*["---"] * 3),
        *[row(name, value, "yes" if ok else "**no**") for name, value, ok in targets(h, results)],
        "",
        "## Raw results",
        "",
        "```json",
        json.dumps({k: v for k, v in results.items() if k != "headline"}, indent=1, default=str),
        "```",
        "",
    ]
    path.write_text("\n".join(lines), encoding="utf-8")
