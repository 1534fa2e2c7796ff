"""``make bench`` section "peers": other Python Kinesis consumers on the same backlog as ours.

One stream of S shards holds one backlog (the throttled section's shape: KPL-aggregated access-log
lines, Kinesis records of about 50 KiB). Each consumer reads all of it from ``TRIM_HORIZON``,
twice: behind the limits proxy with the service's per-shard limits (throttled), and behind it
with only the response caps (unthrottled). The consumers:

* ``ours``: the operator as the ``throttled`` section runs it (``execute``, spark-submit, default
  settings: paced to the per-shard limits; unthrottled: ``ReadOptions(read_bytes_per_second=None)``, as the
  ``unthrottled`` section runs ours), its own consumer name (own checkpoints) per run;
* ``async_kinesis``: `async-kinesis <https://github.com/hampsterx/async-kinesis>`_ (PyPI
  ``async-kinesis``, an asyncio consumer with KPL de-aggregation, resharding, DynamoDB or Redis
  checkpoints), through its public API: :class:`kinesis.Consumer` with ``endpoint_url`` (the
  proxy), its in-memory checkpointer (the default; we measure the read, not its checkpoints), its
  KPL aggregator (``kinesis.aggregators.KPLAggregator``) with a serializer that hands the user
  record's bytes over as they are (the library's documented way to define a processor), and its
  defaults otherwise (``shard_fetch_rate=1``: one ``GetRecords`` per second per shard, which its
  README recommends; ``record_limit=10000``). It has no end: it polls for new records until
  stopped, so :func:`read_async_kinesis` stops it once it yielded as many user records as the
  backlog holds;
* ``kcl_rs``: `kcl-rs <https://pypi.org/project/kcl-rs/>`_ (PyPI ``kcl-rs``, a Rust port of the
  Kinesis Client Library v3 with Python bindings whose API mirrors amazon-kclpy's: leases and
  checkpoints in DynamoDB, resharding, polling or enhanced fan-out), through its public API
  (:func:`read_kcl_rs`): polling retrieval and its defaults otherwise; it has no end either, so it
  is shut down once its record processors were handed as many user records as the backlog holds;
* ``naive``: :func:`benchmarks.workload.naive_consume`, the consumer the other sections compare with.

Left out, and why: :data:`LEFT_OUT`.

Each consumer runs in a process of its own (``python -m benchmarks.peers``), so its CPU time is
its own: user + system seconds of that process and of the processes it started and waited for
(ours: spark-submit's JVM and, under it, pyspark's Python workers), from after its imports to its
end (:func:`cpu_seconds`). Each run has a limits proxy process of its own (:class:`LimitsProxyProcess`,
the throttled section's settings), so the proxy's counts and read window are that consumer's:

* **read rate** (throttled): the proxy's :meth:`~benchmarks.kinesis_limits.LimitsProxyProcess.read_rate`,
  the throttled section's definition: bytes served to ``GetRecords`` calls with ``Limit`` > 1 over
  the time from the first such call to the last response (or, if later, to when those bytes were
  paid for at 2 MiB/s per shard); ``throttled_fraction_of_limit`` is that over S x 2 MiB/s;
* **records/s**: the backlog's user records over that read window (unthrottled the proxy charges
  no debt, ``read_bytes_per_second`` so large that the window ends at the last response);
* a consumer's figures count only if it handed over exactly as many user records as were loaded.

Target: ours ``throttled_fraction_of_limit`` >= each peer's.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks.kinesis_limits import MIB, KinesisLimits, LimitsProxyProcess
from benchmarks.workload import load_backlog
from benchmarks.report import row

__all__ = ["PEERS", "LEFT_OUT", "read_async_kinesis", "run_peers", "peers_headline", "peers_targets", "add_to_report"]

ROOT = Path(__file__).resolve().parents[1]

#: The consumers, in the order each mode runs them.
PEERS = ("ours", "async_kinesis", "kcl_rs", "naive")

#: Python Kinesis consumers on PyPI that are not measured, and why.
LEFT_OUT = {
    "amazon-kclpy (the KCL's MultiLangDaemon)": (
        "the Python side of the Java KCL: its package ships no jars; `setup.py download_jars` fetches the "
        "KCL and its dependencies from Maven Central, which the machines this project runs on cannot reach "
        "(only PyPI, Debian's packages and npm), so the daemon cannot be installed here. Java is here; the "
        "jars are not."
    ),
    "kinesis-python, kinsumer, aiokinesis, async-kinesis-client, kcpy": (
        "last released 2017-2019: not maintained."
    ),
}

#: Unthrottled runs: the proxy charges no read debt (the read window ends at the last response).
NO_DEBT_BYTES_PER_SECOND = float(2**60)
#: A consumer that hands over no record for this long has stalled (seconds).
STALL_SECONDS = 120.0
#: A consumer process that runs longer than this has failed (seconds).
RUN_TIMEOUT_SECONDS = 1800.0


def cpu_seconds() -> float:
    """User + system CPU seconds so far of this process and of its children that ended and were
    waited for (with theirs): ``getrusage`` ``RUSAGE_SELF`` + ``RUSAGE_CHILDREN``."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


# -- the consumers (each runs in a process of its own) ---------------------------------------------


def read_async_kinesis(endpoint: str, stream: str, expected: int, *, region: str, access_key: str, secret_key: str,
                       keep: list[bytes] | None = None, stall_seconds: float = STALL_SECONDS) -> dict[str, Any]:  # fmt: skip
    """Read ``stream`` from ``TRIM_HORIZON`` with async-kinesis's :class:`kinesis.Consumer` until it
    has handed over ``expected`` user records (see the module doc).

    Its iteration ends after ``idle_timeout`` (2 s) without a record; it is iterated again until
    ``expected`` records came or none came for ``stall_seconds``.

    :param endpoint: the Kinesis endpoint (the limits proxy or an emulator).
    :param keep: a list to append every user record's data to (bytes), to check them.
    :returns: ``{"records", "wall_s"}`` (``records``: user records handed over).
    :raises TimeoutError: no record for ``stall_seconds``.
    """
    from aiobotocore.session import AioSession
    from kinesis import Consumer
    from kinesis.aggregators import KPLAggregator
    from kinesis.processors import Processor
    from kinesis.serializers import Serializer

    class BytesSerializer(Serializer):
        """The user record's data as it is (bytes)."""

        def serialize(self, item: bytes) -> bytes:
            return item

        def deserialize(self, data: bytes) -> bytes:
            return data

    class KPLBytesProcessor(Processor, KPLAggregator, BytesSerializer):
        """KPL-aggregated records in, user records' bytes out."""

    async def consume() -> int:
        session = AioSession()
        session.set_credentials(access_key, secret_key)
        records = 0
        async with Consumer(stream, session=session, endpoint_url=endpoint, region_name=region,
                            processor=KPLBytesProcessor(), iterator_type="TRIM_HORIZON") as consumer:  # fmt: skip
            last_record = time.monotonic()
            while records < expected:
                async for data in consumer:
                    records += 1
                    last_record = time.monotonic()
                    if keep is not None:
                        keep.append(data)
                    elif not data:  # touch the payload, as naive_consume does
                        raise AssertionError("an empty user record")
                    if records >= expected:
                        break
                if records < expected and time.monotonic() - last_record > stall_seconds:
                    raise TimeoutError(f"async-kinesis handed over {records} of {expected} records, then none for {stall_seconds:.0f} s")
        return records

    started = time.monotonic()
    records = asyncio.run(consume())
    return {"records": records, "wall_s": time.monotonic() - started}


def read_kcl_rs(endpoint: str, stream: str, expected: int, *, application: str, region: str, access_key: str,
                secret_key: str, keep: list[bytes] | None = None, stall_seconds: float = STALL_SECONDS) -> dict[str, Any]:  # fmt: skip
    """Read ``stream`` from ``TRIM_HORIZON`` with kcl-rs (the KCL v3's Rust port, :class:`kcl_rs.Scheduler`)
    until its record processors were handed ``expected`` user records (see the module doc).

    Its public API as its README shows it: a :class:`kcl_rs.RecordProcessorBase` per shard, polling
    retrieval (``retrieval_mode="POLLING"``, its defaults otherwise: ``max_records`` 10,000, one
    ``GetRecords`` per 1.5 s per shard), ``endpoint_url`` for every service it calls (Kinesis, its
    lease tables in DynamoDB, CloudWatch: the proxy, which passes all but Kinesis' reads to the
    emulator). The processors do not checkpoint (we measure the read); a new ``application`` (its
    lease table's name) per run, so no run inherits another's leases. The KCL takes its leases
    before it reads (a minute on moto): the read rate's window starts at its first ``GetRecords``.

    :param keep: a list to append every user record's data to (bytes), to check them.
    :returns: ``{"records", "wall_s"}`` (``records``: user records handed over).
    :raises TimeoutError: no record for ``stall_seconds`` (the first one: twice that).
    """
    import threading

    from kcl_rs import RecordProcessorBase, Scheduler

    lock, done = threading.Lock(), threading.Event()
    handed = [0]

    class Counting(RecordProcessorBase):
        """Hands each user record's data over (de-aggregated by the KCL) and counts it."""

        def initialize(self, initialize_input: Any) -> None:
            pass

        def process_records(self, process_records_input: Any) -> None:
            datas = [r.data for r in process_records_input.records]
            if keep is None and not all(datas):  # touch the payload, as naive_consume does
                raise AssertionError("an empty user record")
            with lock:
                if keep is not None:
                    keep.extend(datas)
                handed[0] += len(datas)
                if handed[0] >= expected:
                    done.set()

        def lease_lost(self, lease_lost_input: Any) -> None:
            pass

        def shard_ended(self, shard_ended_input: Any) -> None:
            shard_ended_input.checkpointer.checkpoint()  # the KCL requires it to finish a closed shard

        def shutdown_requested(self, shutdown_requested_input: Any) -> None:
            pass

    scheduler = Scheduler(stream_name=stream, application_name=application, record_processor_factory=Counting,
                          region=region, endpoint_url=endpoint, access_key_id=access_key, secret_access_key=secret_key,
                          initial_position="TRIM_HORIZON", retrieval_mode="POLLING")  # fmt: skip
    started = time.monotonic()
    scheduler.start()
    try:
        seen, last = 0, time.monotonic()
        while not done.wait(1.0):
            with lock:
                now_seen = handed[0]
            if now_seen != seen:
                seen, last = now_seen, time.monotonic()
            elif time.monotonic() - last > (stall_seconds if seen else 2 * stall_seconds):
                raise TimeoutError(f"kcl-rs handed over {seen} of {expected} records, then none for {stall_seconds:.0f} s")
        wall = time.monotonic() - started
    finally:
        scheduler.shutdown()
    with lock:
        return {"records": handed[0], "wall_s": wall}


def _read_naive(spec: dict[str, Any]) -> dict[str, Any]:
    from benchmarks.run import client
    from benchmarks.workload import naive_consume

    started = time.monotonic()
    result = naive_consume(client("kinesis", spec["endpoint"]), spec["stream"])
    return {"records": result.user_records, "wall_s": time.monotonic() - started, "throttled_seen": result.throttled}


def _read_ours(spec: dict[str, Any]) -> dict[str, Any]:
    from benchmarks.run import ingest, use_connections

    use_connections(spec["moto"], spec["endpoint"], None)
    summary, wall = ingest(spec["stream"], Path(spec["output"]), consumer=spec["consumer"], paced=spec["paced"])
    return {"records": summary.get("records"), "wall_s": wall, "status": summary.get("status")}


def _read_async_kinesis(spec: dict[str, Any]) -> dict[str, Any]:
    from demo.stack import ACCESS_KEY, REGION, SECRET_KEY

    return read_async_kinesis(spec["endpoint"], spec["stream"], spec["expected"], region=REGION, access_key=ACCESS_KEY,
                              secret_key=SECRET_KEY)  # fmt: skip


def _read_kcl_rs(spec: dict[str, Any]) -> dict[str, Any]:
    from demo.stack import ACCESS_KEY, REGION, SECRET_KEY

    return read_kcl_rs(spec["endpoint"], spec["stream"], spec["expected"], application=f"{spec['consumer']}-kcl-rs",
                       region=REGION, access_key=ACCESS_KEY, secret_key=SECRET_KEY)  # fmt: skip


_READERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "ours": _read_ours, "async_kinesis": _read_async_kinesis, "kcl_rs": _read_kcl_rs, "naive": _read_naive,
}  # fmt: skip


def _consume(argv: list[str]) -> None:
    """``python -m benchmarks.peers CONSUMER SPEC_JSON RESULT_PATH``: run one consumer, write its
    figures (JSON) to ``RESULT_PATH``, with ``cpu_s`` (its CPU seconds after the imports) and
    ``startup_cpu_s`` (the imports')."""
    name, spec, result_path = argv[0], json.loads(argv[1]), Path(argv[2])
    # The imports first: they are the interpreter's start, not the consumer's read.
    import benchmarks.run  # noqa: F401
    import demo.stack  # noqa: F401

    if name == "ours":
        import airflow_kinesis_spark.operators.kinesis_to_spark  # noqa: F401
    elif name == "async_kinesis":
        import aiobotocore.session  # noqa: F401
        import kinesis  # noqa: F401
    elif name == "kcl_rs":
        import kcl_rs  # noqa: F401
    startup = cpu_seconds()
    result = _READERS[name](spec)
    result["cpu_s"] = cpu_seconds() - startup
    result["startup_cpu_s"] = startup
    result_path.write_text(json.dumps(result), encoding="utf-8")


# -- the section --------------------------------------------------------------------------------------


def _run_consumer(name: str, spec: dict[str, Any], work: Path, tag: str) -> dict[str, Any]:
    """Run consumer ``name`` in a process of its own; its figures (:func:`_consume`).

    :raises SystemExit: the process failed or ran past :data:`RUN_TIMEOUT_SECONDS` (with its log's end).
    """
    result_path, log_path = work / f"peer-{tag}.json", work / f"peer-{tag}.log"
    with log_path.open("w", encoding="utf-8") as log_file:
        try:
            code = subprocess.run([sys.executable, "-m", "benchmarks.peers", name, json.dumps(spec), str(result_path)],
                                  cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  timeout=RUN_TIMEOUT_SECONDS).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            code = None
    if code != 0 or not result_path.exists():
        tail = log_path.read_text(encoding="utf-8", errors="replace")[-3000:]
        raise SystemExit(f"peers, {tag}: the consumer's process {'timed out' if code is None else f'exited {code}'}:\n{tail}")
    return json.loads(result_path.read_text(encoding="utf-8"))


def _measure(name: str, mode: str, moto: str, stream: str, loaded: dict[str, int], shards: int, work: Path,
             log: Callable[[str], None]) -> dict[str, Any]:  # fmt: skip
    """One consumer's read of the whole backlog, behind a limits proxy of its own; its figures.

    :raises SystemExit: it handed over another number of user records than were loaded.
    """
    throttled = mode == "throttled"
    limits = KinesisLimits() if throttled else KinesisLimits(throttle=False, read_bytes_per_second=NO_DEBT_BYTES_PER_SECOND)
    with LimitsProxyProcess(moto, limits) as proxy:
        spec = {"endpoint": proxy.endpoint, "moto": moto, "stream": stream, "expected": loaded["user_records"],
                "output": str(work / f"out-peers-{mode}"), "consumer": f"peers-{mode}", "paced": throttled}  # fmt: skip
        out = _run_consumer(name, spec, work, f"{name}-{mode}")
        if out["records"] != loaded["user_records"]:
            raise SystemExit(f"peers, {name} ({mode}): read {out['records']} of {loaded['user_records']} user records")
        stats = proxy.stats
        rate = proxy.read_rate(stream)
    served = stats[f"bytes:{stream}"]
    window = served / rate
    figures = {
        "records": out["records"], "wall_s": out["wall_s"], "cpu_s": out["cpu_s"], "startup_cpu_s": out["startup_cpu_s"],
        "read_bytes_per_second": rate, "read_s": window, "records_per_s": out["records"] / window,
        "kinesis_bytes_served": served, "get_records": stats[f"GetRecords:{stream}"],
        "throttled_calls": stats[f"GetRecords.throttled:{stream}"], "expired": stats[f"GetRecords.expired:{stream}"],
    }  # fmt: skip
    if throttled:
        figures["fraction_of_limit"] = rate / (shards * 2 * MIB)
    log(f"peers, {name}, {mode}: " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items()))
    return figures


def run_peers(kinesis: Any, moto: str, lines: list[bytes], work: Path, *, shards: int, mib: float,
              new_stream: Callable[[Any, str, int], None], log: Callable[[str], None]) -> dict[str, Any]:  # fmt: skip
    """The section: one backlog of ``mib`` MiB on ``shards`` shards, read by each of :data:`PEERS`
    throttled, then each unthrottled (see the module doc).

    :param kinesis: a Kinesis client of the emulator (``moto``), to create and fill the stream.
    :param new_stream: creates a stream and waits for it (``benchmarks.run.new_stream``).
    :returns: ``{"backlog_mib", "user_records", "kinesis_records", "shards", "limit_bytes_per_second",
        "consumers": {name: {"throttled": {...}, "unthrottled": {...}}}, "versions", "left_out"}``.
    """
    stream, commit = "bench-peers", _commit()  # the code the run starts with (the consumers' processes import it anew)
    new_stream(kinesis, stream, shards)
    loaded = load_backlog(kinesis, stream, mib, lines)
    log(f"peers: loaded {loaded}")
    consumers: dict[str, dict[str, Any]] = {name: {} for name in PEERS}
    for mode in ("throttled", "unthrottled"):
        for name in PEERS:
            consumers[name][mode] = _measure(name, mode, moto, stream, loaded, shards, work, log)
    return {
        "backlog_mib": loaded["bytes"] / MIB, "user_records": loaded["user_records"],
        "kinesis_records": loaded["kinesis_records"], "shards": shards, "limit_bytes_per_second": shards * 2 * MIB,
        "consumers": consumers, "versions": {name: metadata.version(name) for name in ("async-kinesis", "kcl-rs")},
        "left_out": LEFT_OUT, "commit": commit,
    }  # fmt: skip


def _commit() -> str:
    """The checkout's commit (short), with ``+changes`` when the working tree differs from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "?"
    return head + ("+changes" if dirty else "")


def peers_headline(peers: dict[str, Any]) -> dict[str, dict[str, float]]:
    """``{name: {throttled_fraction_of_limit, records_per_s, cpu_s, unthrottled_records_per_s,
    unthrottled_cpu_s}}`` (``records_per_s`` and ``cpu_s``: the throttled read)."""
    out = {}
    for name, runs in peers["consumers"].items():
        t, u = runs["throttled"], runs["unthrottled"]
        out[name] = {"throttled_fraction_of_limit": round(t["fraction_of_limit"], 3), "records_per_s": round(t["records_per_s"]),
                     "cpu_s": round(t["cpu_s"], 1), "unthrottled_records_per_s": round(u["records_per_s"]),
                     "unthrottled_cpu_s": round(u["cpu_s"], 1)}  # fmt: skip
    return out


def peers_targets(peers: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """The section's targets, ``(target, measured, met)``: ours throttled fraction >= each peer's."""
    h = peers_headline(peers)
    ours = h["ours"]["throttled_fraction_of_limit"]
    return [(f"peers: ours throttled fraction of the limit >= {name}'s", f"{ours:.3f} vs {h[name]['throttled_fraction_of_limit']:.3f}",
             ours >= h[name]["throttled_fraction_of_limit"]) for name in h if name != "ours"]  # fmt: skip


#: How each consumer is named in the report.
LABELS = {"ours": "ours (operator, spark-submit)", "async_kinesis": "async-kinesis", "kcl_rs": "kcl-rs (KCL v3, Rust)", "naive": "naive"}


def peers_markdown(peers: dict[str, Any], heading: str) -> list[str]:
    """The section of ``docs/benchmarks.md`` (lines)."""
    p, limit = peers, peers["limit_bytes_per_second"]
    versions = ", ".join(f"{name} {version}" for name, version in p["versions"].items())
    out = [heading, "",
           f"Measured on the working tree of commit {p['commit']} ({versions}). Backlog: {p['backlog_mib']:.1f} MiB "
           f"({p['user_records']:,} user records in {p['kinesis_records']:,} Kinesis records) on {p['shards']} shards, one stream "
           "read whole by each consumer in turn, from `TRIM_HORIZON`, each in a process of its own and behind a limits proxy "
           "process of its own (the throttled section's settings; unthrottled, only the response caps). Read rate and "
           "records/s are over the proxy's read window (first `GetRecords` with `Limit` > 1 to the last response, or, "
           "throttled, to when the bytes were paid for at 2 MiB/s per shard); each consumer handed over every user record "
           "of the backlog (counted) before its figures count. CPU: user + system seconds of the consumer's process and of "
           "the processes it waited for, after its imports (ours: spark-submit's JVM start, the Spark job's read and "
           "Parquet write, the commit; the peers only read). Code: `benchmarks/peers.py`.", "",
           f"**Throttled** (the service's per-shard limits; ceiling {limit / MIB:.0f} MiB/s):", "",
           row("consumer", "fraction of the limit", "read rate (MiB/s)", "records/s", "CPU (s)", "GetRecords calls",
                "throttled calls", "wall time (s)"),
           row(*["---"] * 8)]  # fmt: skip
    for name, runs in p["consumers"].items():
        t = runs["throttled"]
        out.append(row(LABELS.get(name, name), f"{t['fraction_of_limit']:.3f}", f"{t['read_bytes_per_second'] / MIB:.2f}",
                        f"{t['records_per_s']:,.0f}", f"{t['cpu_s']:.1f}", t["get_records"], t["throttled_calls"],
                        f"{t['wall_s']:.1f}"))  # fmt: skip
    out += ["", "**Unthrottled** (only the 10 MiB / 10,000-record response caps; ours without byte pacing):", "",
            row("consumer", "records/s", "read rate (MiB/s)", "CPU (s)", "CPU per 100k records (s)", "GetRecords calls",
                 "wall time (s)"),
            row(*["---"] * 7)]  # fmt: skip
    for name, runs in p["consumers"].items():
        u = runs["unthrottled"]
        out.append(row(LABELS.get(name, name), f"{u['records_per_s']:,.0f}", f"{u['read_bytes_per_second'] / MIB:.2f}",
                        f"{u['cpu_s']:.1f}", f"{u['cpu_s'] / u['records'] * 1e5:.2f}", u["get_records"], f"{u['wall_s']:.1f}"))  # fmt: skip
    out += ["", "Wall time: the consumer's own, from after its imports (ours: `execute`, end to end; async-kinesis: until it "
            "handed over the backlog's last record and closed; it has no end of its own; kcl-rs: from its start, its leases "
            "taken first, until its processors were handed the last record). Not measured:", ""]  # fmt: skip
    out += [f"- {name}: {why}" for name, why in p["left_out"].items()]
    return out + [""]


def add_to_report(path: Path, results: dict[str, Any]) -> None:
    """Put the peers section and its targets into a report ``benchmarks/report.py`` wrote."""
    from benchmarks.report import add_section

    add_section(path, "Peers: other Python consumers on the same backlog",
                lambda heading: peers_markdown(results["peers"], heading), peers_targets(results["peers"]))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    _consume(sys.argv[1:])
