"""``make bench``, section ``large_records``: 10 MiB records (issue 31, item 1).

Kinesis takes records up to 10 MiB since October 2025 (``UpdateMaxRecordSize``,
``MaxRecordSizeInKiB`` 1,024..10,240); the per-shard read limits did not change (2 MiB/s, and a
GetRecords response of at most 10 MiB: one such record is a whole response and 5 s of the shard's
read budget). moto refuses records over 1 MiB, so this section runs on kinesalite (``make
kinesalite`` lets it store 10 MiB records) behind the limits proxy, which holds each stream to
its MaxRecordSizeInKiB; moto still holds the checkpoint table.

* **throttled**: a backlog of 10 MiB records over S shards, read by our operator (spark-submit,
  default settings: paced to the per-shard limits) behind the proxy's limits;
  ``throttled_fraction_of_limit`` as the throttled section defines it: bytes the proxy served /
  the read's window (first GetRecords with ``Limit`` > 1 to the last response, or to when its
  bytes are paid for at 2 MiB/s) / (S x 2 MiB/s). Target >= 0.85.
* **memory**: peak memory (PSS) of the spark-submit job (fixed heap, :func:`benchmarks.run.fixed_heap_conf`;
  sampled by :class:`benchmarks.run.MemorySampler`) ingesting a backlog of 10 MiB records in one
  batch, against one of 1 MiB records of the same bytes, each ``--large-records-repeat`` times
  (alternating; the maxima). ``peak_memory_ratio`` = 10 MiB / 1 MiB. Target <= 1.2.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.kinesis_limits import MIB, KinesisLimits, LimitsProxyProcess

__all__ = ["run_large_records", "large_records_headline", "put_records_of", "TARGETS"]

#: The section's targets (issue 31): fraction of the per-shard read limit, memory ratio.
TARGETS = {"throttled_fraction_of_limit": 0.85, "peak_memory_ratio": 1.2}
#: A stream's largest record, KiB, for the 10 MiB records (the service's maximum).
LARGE_KIB = 10240


def put_records_of(kinesis: Any, stream: str, record_bytes: int, mib: float) -> dict[str, int]:
    """Put about ``mib`` MiB of records of ``record_bytes`` each, round robin over the stream's
    shards (explicit hash keys), random data; PutRecords of at most 10 MiB (Kinesis API
    reference, PutRecords), a record over that alone with PutRecord.

    :returns: ``{"user_records", "kinesis_records", "bytes"}``.
    """
    shards = kinesis.list_shards(StreamName=stream)["Shards"]
    keys = [str((int(s["HashKeyRange"]["StartingHashKey"]) + int(s["HashKeyRange"]["EndingHashKey"])) // 2) for s in shards]
    count = max(1, round(mib * MIB / record_bytes))
    per_call = max(1, (10 * MIB - 64 * 1024) // record_bytes)
    entries = [{"PartitionKey": f"k{i}", "ExplicitHashKey": keys[i % len(keys)], "Data": os.urandom(record_bytes)}
               for i in range(count)]  # fmt: skip
    for start in range(0, count, per_call):
        chunk = entries[start : start + per_call]
        if len(chunk) == 1:
            kinesis.put_record(StreamName=stream, **chunk[0])
            continue
        for _ in range(10):
            failed = [e for e, r in zip(chunk, kinesis.put_records(StreamName=stream, Records=chunk)["Records"], strict=True)
                      if "SequenceNumber" not in r]  # fmt: skip
            if not failed:
                break
            chunk = failed
        else:
            raise RuntimeError(f"{len(chunk)} records could not be put")
    return {"user_records": count, "kinesis_records": count, "bytes": count * record_bytes}


def _stream(kinesis: Any, proxies: list[LimitsProxyProcess], name: str, shards: int, kib: int) -> None:
    """A stream on the emulator whose MaxRecordSizeInKiB is ``kib`` at every proxy (each proxy
    process keeps its own)."""
    from benchmarks.run import client

    kinesis.create_stream(StreamName=name, ShardCount=shards)
    kinesis.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 0.2})
    arn = kinesis.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]["StreamARN"]
    for proxy in proxies:
        via = client("kinesis", proxy.endpoint)
        if kib != 1024:
            via.update_max_record_size(StreamARN=arn, MaxRecordSizeInKiB=kib)
        assert via.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]["MaxRecordSizeInKiB"] == kib


def _memory_run(b: Any, kinesalite: Any, proxies: list[LimitsProxyProcess], name: str, record_bytes: int,
                mib: float) -> dict[str, Any]:  # fmt: skip
    """One backlog of ``record_bytes`` records ingested in one batch (no pacing), its job's peak memory."""
    from benchmarks.run import MemorySampler, check, fixed_heap_conf, heap_after_gc, ingest

    _stream(kinesalite, proxies, name, b.args.shards, LARGE_KIB if record_bytes > MIB else 1024)
    loaded = put_records_of(kinesalite, name, record_bytes, mib)
    gc_log = Path(tempfile.mkdtemp(prefix="gc-", dir=b.work))
    started = time.monotonic()
    with MemorySampler() as sampler:
        summary, _ = ingest(name, b.work / f"out-{name}", paced=False, spark_conf=fixed_heap_conf(b.args.memory_heap, gc_log))
    check(summary, loaded, name)
    kinesalite.delete_stream(StreamName=name)
    return {"record_mib": record_bytes / MIB, "backlog_mib": loaded["bytes"] / MIB, "records": summary["records"],
            "wall_s": time.monotonic() - started, "peak_total_mib": sampler.peak_total / MIB,
            "peak_jvm_mib": sampler.peak_jvm / MIB, "peak_python_mib": sampler.peak_python / MIB,
            "peak_by_role_mib": {role: round(v / MIB, 1) for role, v in sampler.peak_by_role.items()},
            "heap_after_gc_mib": heap_after_gc(gc_log)}  # fmt: skip


def run_large_records(b: Any, *, mib: float, memory_mib: float, repeat: int, log: Callable[[str], None]) -> dict[str, Any]:
    """The section (see the module doc); ``b`` is ``benchmarks.run.Bench``."""
    from benchmarks.run import check, client, ingest, use_connections
    from demo.stack import kinesalite_server

    with kinesalite_server() as emulator, LimitsProxyProcess(emulator) as throttled, \
            LimitsProxyProcess(emulator, KinesisLimits(throttle=False)) as open_proxy:  # fmt: skip
        kinesalite = client("kinesis", emulator)
        proxies = [throttled, open_proxy]
        # Throttled: loaded through the proxy, which refuses what the stream's MaxRecordSizeInKiB does not allow.
        stream = "bench-large-throttled"
        _stream(kinesalite, proxies, stream, b.args.shards, LARGE_KIB)
        loaded = put_records_of(client("kinesis", throttled.endpoint), stream, 10 * MIB, mib)
        log(f"large_records: loaded {loaded} (10 MiB records)")
        use_connections(b.moto, throttled.endpoint, b.connect)
        summary, wall = ingest(stream, b.work / "out-large-throttled", consumer="bench-large")
        check(summary, loaded, "large_records throttled")
        stats = throttled.stats
        limit = b.args.shards * 2 * MIB
        ours = {"read_bytes_per_second": throttled.read_rate(stream), "get_records": stats[f"GetRecords:{stream}"],
                "throttled": stats[f"GetRecords.throttled:{stream}"], "expired": stats[f"GetRecords.expired:{stream}"],
                "largest_response_bytes": stats["GetRecords.largest_response_bytes"], "wall_s": wall,
                "records": summary["records"]}  # fmt: skip
        log(f"large_records, throttled: {ours}")
        kinesalite.delete_stream(StreamName=stream)
        # Memory: the same bytes in 10 MiB and in 1 MiB records, one batch each, alternating.
        use_connections(b.moto, open_proxy.endpoint, b.connect)
        runs: dict[str, list[dict[str, Any]]] = {"10MiB": [], "1MiB": []}
        for rep in range(repeat):
            for label, size in (("1MiB", MIB), ("10MiB", 10 * MIB)):
                run = _memory_run(b, kinesalite, proxies, f"bench-large-memory-{label.lower()}-{rep}", size, memory_mib)
                runs[label].append(run)
                log(f"large_records, memory, {label} records, repeat {rep + 1}: {run}")
    peaks = {label: max(r["peak_total_mib"] for r in rs) for label, rs in runs.items()}
    return {"backlog_mib": loaded["bytes"] / MIB, "records": loaded["user_records"], "record_mib": 10,
            "limit_bytes_per_second": limit, "lower_bound_s": loaded["bytes"] / limit, "ours": ours,
            "memory": {"backlog_mib": memory_mib, "heap": b.args.memory_heap, "repeat": repeat, "runs": runs,
                       "peak_total_mib": peaks},
            "targets": TARGETS}  # fmt: skip


def large_records_headline(result: dict[str, Any]) -> dict[str, float]:
    """``throttled_fraction_of_limit`` and ``peak_memory_ratio`` (10 MiB / 1 MiB records)."""
    peaks = result["memory"]["peak_total_mib"]
    return {"throttled_fraction_of_limit": round(result["ours"]["read_bytes_per_second"] / result["limit_bytes_per_second"], 3),
            "peak_memory_ratio": round(peaks["10MiB"] / peaks["1MiB"], 3)}  # fmt: skip


def large_records_targets(result: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """Issue 31's targets for the section, each with the measured value and whether it is met."""
    h = large_records_headline(result)
    return [
        ("10 MiB records: throttled read rate >= 0.85 x the limit", f"{h['throttled_fraction_of_limit']:.3f}",
         h["throttled_fraction_of_limit"] >= TARGETS["throttled_fraction_of_limit"]),
        ("10 MiB records: peak memory <= 1.2 x that of 1 MiB records (same bytes)", f"{h['peak_memory_ratio']:.3f}",
         h["peak_memory_ratio"] <= TARGETS["peak_memory_ratio"]),
    ]  # fmt: skip


def large_records_markdown(result: dict[str, Any], heading: str) -> list[str]:
    """The section's lines of ``docs/benchmarks.md``."""
    from benchmarks.report import row

    ours, memory = result["ours"], result["memory"]
    h = large_records_headline(result)
    rows = [row("records", "peak total (MiB), runs", "JVM (MiB)", "Python (MiB)", "heap after GC (MiB)", "wall (s)"),
            row(*["---"] * 6)]  # fmt: skip
    for label in ("1MiB", "10MiB"):
        runs = memory["runs"][label]

        def cells(key: str, runs: list[dict[str, Any]] = runs) -> str:
            return ", ".join("-" if r.get(key) is None else f"{r[key]:,.0f}" for r in runs)

        rows.append(row(f"{label[:-3]} MiB ({runs[0]['records']:,})", cells("peak_total_mib"), cells("peak_jvm_mib"),
                        cells("peak_python_mib"), cells("heap_after_gc_mib"), cells("wall_s")))  # fmt: skip
    return [
        heading,
        "",
        "10 MiB records (`MaxRecordSizeInKiB` 10,240, set with `UpdateMaxRecordSize` through the limits proxy, which "
        "refuses larger records) on kinesalite (`make kinesalite` lets it store records up to 10 MiB; moto refuses "
        "records over 1 MiB), behind the limits proxy; moto holds the checkpoint table. Code: `benchmarks/large_records.py`.",
        "",
        f"- **Throttled.** {result['backlog_mib']:.0f} MiB in {result['records']:,} records of 10 MiB on the stream's "
        f"shards, read by the operator (spark-submit, default settings) behind the per-shard limits: "
        f"{ours['read_bytes_per_second'] / MIB:.2f} MiB/s, **{h['throttled_fraction_of_limit']:.3f} of the limit** "
        f"({result['limit_bytes_per_second'] / MIB:.0f} MiB/s; at the limit the read takes {result['lower_bound_s']:.1f} s). "
        f"GetRecords calls: {ours['get_records']:,} ({ours['throttled']} throttled, {ours['expired']} expired "
        f"iterators); the largest response: {ours['largest_response_bytes'] / MIB:.1f} MiB; the run's wall time "
        f"{ours['wall_s']:.1f} s.",
        f"- **Memory.** The spark-submit job's peak PSS (JVM with a fixed {memory['heap']} heap, plus its Python "
        f"processes) while it ingests {memory['backlog_mib']:.0f} MiB in one batch, as 10 MiB records and as 1 MiB "
        f"records, alternating, {memory['repeat']} times each. `peak_memory_ratio` = "
        f"{memory['peak_total_mib']['10MiB']:,.0f} / {memory['peak_total_mib']['1MiB']:,.0f} = "
        f"**{h['peak_memory_ratio']:.3f}**.",
        "",
        *rows,
        "",
        "```json",
        json.dumps({"large_records": h}),
        "```",
        "",
    ]


def add_to_report(path: Path, results: dict[str, Any]) -> None:
    """Put the section and its targets into a report ``benchmarks/report.py`` wrote."""
    from benchmarks.report import add_section

    add_section(path, "Large records: 10 MiB", lambda heading: large_records_markdown(results["large_records"], heading),
                large_records_targets(results["large_records"]))
