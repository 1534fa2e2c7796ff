"""Run operator processes, kill them at chosen points, and check the invariants afterwards."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from demo.producer import Produced, Verdict, committed_rows, verify
from demo.subscribe import FanOutProxy
from tests.conftest import ROOT
from tests.conftest import aws_connection
from tests.reliability.fault_proxy import FaultProxy

SLOW_WRITE = ROOT / "tests" / "reliability" / "slow_write.py"


@dataclass
class Consumer:
    """One consumer of a stream, run through ``run_batch`` processes via a FaultProxy.

    ``consumer_type="efo"``: the runs read with enhanced fan-out; the FaultProxy's upstream must
    then serve SubscribeToShard (:func:`fault_stack`).
    """

    stream: str
    name: str
    table: str
    output: Path
    proxy: FaultProxy
    dynamodb: object
    log_dir: Path
    history: list[tuple[int, dict]] = field(default_factory=list)  # (committed batch id, checkpoints) seen
    runs: int = 0
    consumer_type: str = "polling"

    @property
    def store(self) -> DynamoDBCheckpointStore:
        return DynamoDBCheckpointStore(self.dynamodb, self.table, self.stream, self.name)

    def start(self, *extra: str) -> subprocess.Popen:
        self.runs += 1
        env = {**os.environ, "AIRFLOW_CONN_AWS_DEFAULT": aws_connection(self.proxy.endpoint),
               "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}  # fmt: skip
        env.pop("AIRFLOW_CONN_SPARK_CONNECT_TEST", None)
        log = open(self.log_dir / f"run{self.runs:03d}.log", "w")  # noqa: SIM115 - closed with the process
        return subprocess.Popen(
            [sys.executable, "-m", "tests.reliability.run_batch", self.stream, self.name, self.table, str(self.output),
             "--consumer-type", self.consumer_type, *extra],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

    def run(self, *extra: str, timeout: float = 300) -> dict:
        proc = self.start(*extra)
        assert proc.wait(timeout=timeout) == 0, self.last_log()[-4000:]
        self.observe()
        return json.loads(self.last_log().strip().splitlines()[-1])

    def last_log(self) -> str:
        return (self.log_dir / f"run{self.runs:03d}.log").read_text()

    def observe(self) -> None:
        """Record the committed state (for MONO)."""
        head = self.store.head()
        self.history.append((head.committed_batch_id, self.store.committed_checkpoints(head)))

    def rows(self) -> list[tuple]:
        return committed_rows(self.output, self.store.head().committed_batch_id)

    def check(self, produced: list[Produced]) -> Verdict:
        """EXACT (verifier: nothing missing, nothing twice) and MONO (checkpoints never went back)."""
        self.observe()
        verdict = verify(produced, self.rows())
        assert verdict.missing == 0 and verdict.duplicates == 0 and verdict.unexpected == 0, verdict
        for (id_a, ck_a), (id_b, ck_b) in zip(self.history, self.history[1:], strict=False):
            assert id_b >= id_a, f"committed batch went back from {id_a} to {id_b}"
            for shard, before in ck_a.items():
                after = ck_b.get(shard)
                if before.position is not None and after is not None and after.position is not None:
                    assert after.position >= before.position, f"{shard}: checkpoint went back {before} -> {after}"
        return verdict


def kill_group(proc: subprocess.Popen) -> None:
    """kill -9 the operator process and everything it started (spark-submit, the JVM, Python workers)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def spark_processes(proc: subprocess.Popen) -> dict[str, list[psutil.Process]]:
    """The Spark job's processes under the operator process ``proc`` (local master, client mode):

    * ``jvm``: the spark-submit JVM (``SparkSubmit``: the driver's JVM; executors run in it);
    * ``driver``: the job's Python driver (``kinesis_batch.py``, a child of the JVM): the process
      that claims the batch, holds its lease, publishes and records the report (``core.job``);
    * ``workers``: the Python workers (``pyspark.daemon`` / ``pyspark.worker``) reading Kinesis.
    """
    found: dict[str, list[psutil.Process]] = {"jvm": [], "driver": [], "workers": []}
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return found
    for child in children:
        try:
            name, cmdline = child.name(), child.cmdline()
        except psutil.NoSuchProcess:
            continue
        if "java" in name and any("SparkSubmit" in part for part in cmdline):
            found["jvm"].append(child)
        elif any(part.startswith("pyspark.daemon") or part.startswith("pyspark.worker") for part in cmdline):
            found["workers"].append(child)
        elif "java" not in name and any(part.endswith("kinesis_batch.py") for part in cmdline):
            found["driver"].append(child)
    return found


def kill_spark_driver(proc: subprocess.Popen, which: str = "jvm") -> bool:
    """kill -9 only the Spark driver under the operator process: its JVM (``which="jvm"``) or its
    Python process (``which="driver"``, see :func:`spark_processes`)."""
    for child in spark_processes(proc)[which]:
        try:
            child.kill()
            return True
        except psutil.NoSuchProcess:
            continue
    return False


def signal_processes(processes: list[psutil.Process], sig: int) -> None:
    """Send ``sig`` (e.g. ``SIGSTOP``, ``SIGCONT``) to each of ``processes`` still alive."""
    for process in processes:
        try:
            process.send_signal(sig)
        except psutil.NoSuchProcess:
            continue


def wait_until(predicate, timeout: float, proc: subprocess.Popen | None = None, step: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        if proc is not None and proc.poll() is not None:
            return predicate()
        time.sleep(step)
    return False


def reading(consumer: Consumer, calls: int = 3):
    """A predicate: the batch's Spark job made ``calls`` reads since its plan was persisted
    (GetRecords calls, or SubscribeToShard events pushed to it: :meth:`FaultProxy.reads`)."""
    state: dict[str, int] = {}

    def check() -> bool:
        if "base" not in state:
            if consumer.store.head().pending_batch_id is None:
                return False
            state["base"] = consumer.proxy.reads()
        return consumer.proxy.reads() >= state["base"] + calls

    return check


@contextmanager
def fault_stack(moto_endpoint: str, consumer_type: str = "polling", fan_out: dict | None = None,
                **fault_kwargs: object) -> Iterator[FaultProxy]:  # fmt: skip
    """A started FaultProxy in front of moto; for ``consumer_type="efo"`` in front of a local
    SubscribeToShard server (``demo.subscribe.FanOutProxy(**fan_out)``, the proxy's ``fan_out``)
    in front of moto, so faults reach SubscribeToShard too. Stops both on exit."""
    server = FanOutProxy(moto_endpoint, **(fan_out or {})).start() if consumer_type == "efo" else None
    proxy = FaultProxy(server.endpoint if server else moto_endpoint, **fault_kwargs).start()  # type: ignore[arg-type]
    proxy.fan_out = server
    try:
        yield proxy
    finally:
        proxy.stop()
        if server is not None:
            server.stop()
