"""Which local Kinesis emulator holds thousands of shards (issue 31, item 2): moto in server mode
and kinesalite, side by side, on the calls a batch makes per shard.

    python -m benchmarks.emulators [--shards 4096] [--repeat 3]

For each emulator, on a fresh stream of ``--shards`` shards: the time until the stream is
``ACTIVE``, a paginated ``ListShards`` of every shard, and a **probe round** as a no-data run
makes it: per shard one ``GetShardIterator`` (``TRIM_HORIZON``) and one ``GetRecords``
(``Limit`` 1), 32 shards at a time (threads sharing one client, as ``core.probes`` does). Each
figure: wall seconds (median of ``--repeat`` rounds) and the emulator process's CPU seconds
(user + system) during it, which is what the emulator itself costs the machine per shard.

The last line is JSON: ``{"shards", "repeat", "emulators": {name: {"create_s", "list_shards_s",
"list_shards_cpu_s", "probe_round_s", "probe_round_cpu_s", "probe_cpu_ms_per_shard"}}}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Any

import boto3
import psutil
from botocore.config import Config

from demo.stack import kinesalite_server, moto_server

__all__ = ["EMULATORS", "measure", "run_emulators"]

#: Shards probed at once (the probes' thread pool shares one client: ``core.probes``).
PROBE_THREADS = 32


def _server_process(endpoint: str) -> psutil.Process:
    """The emulator's process: this process's child whose command line names the endpoint's port."""
    port = endpoint.rsplit(":", 1)[1]
    for child in psutil.Process().children(recursive=True):
        try:
            if any(port == arg or arg.endswith(f"={port}") for arg in child.cmdline()):
                return child
        except psutil.NoSuchProcess:
            continue
    raise RuntimeError(f"no child process serves {endpoint}")


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def _timed(process: psutil.Process, work: Callable[[], Any]) -> tuple[float, float]:
    """``(wall seconds, the emulator's CPU seconds)`` of ``work()``."""
    cpu, started = _cpu(process), time.monotonic()
    work()
    return time.monotonic() - started, _cpu(process) - cpu


def measure(endpoint: str, shards: int, repeat: int, stream: str = "bench-emulator") -> dict[str, float]:
    """The figures of the module doc for the emulator at ``endpoint``."""
    process = _server_process(endpoint)
    client = boto3.client("kinesis", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="bench",
                          aws_secret_access_key="bench",
                          config=Config(max_pool_connections=PROBE_THREADS, retries={"mode": "standard", "max_attempts": 10},
                                        read_timeout=600))  # fmt: skip

    def create() -> None:
        client.create_stream(StreamName=stream, ShardCount=shards)
        while client.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamStatus"] != "ACTIVE":
            time.sleep(0.2)

    listed: list[str] = []

    def list_all() -> None:
        listed.clear()
        for page in client.get_paginator("list_shards").paginate(StreamName=stream):
            listed.extend(s["ShardId"] for s in page["Shards"])

    def probe(shard_id: str) -> None:
        iterator = client.get_shard_iterator(StreamName=stream, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON")
        client.get_records(ShardIterator=iterator["ShardIterator"], Limit=1)

    def probe_round() -> None:
        with ThreadPoolExecutor(PROBE_THREADS) as pool:
            list(pool.map(probe, listed))

    create_s, _ = _timed(process, create)
    list_s, list_cpu = _timed(process, list_all)
    if len(listed) != shards:
        raise SystemExit(f"ListShards listed {len(listed)} of {shards} shards")
    rounds = [_timed(process, probe_round) for _ in range(repeat)]
    probe_s = statistics.median(r[0] for r in rounds)
    probe_cpu = statistics.median(r[1] for r in rounds)
    return {"create_s": round(create_s, 2), "list_shards_s": round(list_s, 2), "list_shards_cpu_s": round(list_cpu, 2),
            "probe_round_s": round(probe_s, 2), "probe_round_cpu_s": round(probe_cpu, 2),
            "probe_cpu_ms_per_shard": round(probe_cpu / shards * 1000, 3)}  # fmt: skip


#: The emulators compared: a context manager that runs one and yields its endpoint.
EMULATORS: dict[str, Callable[[int], AbstractContextManager[str]]] = {
    "moto": lambda shards: moto_server(),
    "kinesalite": lambda shards: kinesalite_server(shard_limit=shards + 10),
}


def run_emulators(shards: int, repeat: int, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every emulator of :data:`EMULATORS` measured in turn (one at a time on the machine)."""
    out: dict[str, Any] = {"shards": shards, "repeat": repeat, "emulators": {}}
    for name, server in EMULATORS.items():
        with server(shards) as endpoint:
            out["emulators"][name] = figures = measure(endpoint, shards, repeat)
        log(f"{name}, {shards} shards: {figures}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    result = run_emulators(args.shards, args.repeat, log=lambda line: print(line, file=sys.stderr, flush=True))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
