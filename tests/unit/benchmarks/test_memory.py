"""The memory benchmark's sampler on a fake process tree (no Spark): what it counts, once, and by role."""

from __future__ import annotations

import time
from types import SimpleNamespace

import psutil
import pytest

from benchmarks import run

MIB = 1024 * 1024
JAVA = ["/usr/lib/jvm/bin/java", "-cp", "jars/*", "org.apache.spark.deploy.SparkSubmit", "spark_scripts/kinesis_batch.py"]
DAEMON = ["/venv/bin/python", "-m", "pyspark.daemon", "pyspark.worker"]


class FakeProcess:
    """What the sampler asks of a ``psutil.Process``; ``pss`` in MiB."""

    def __init__(self, pid: int, ppid: int, cmdline: list[str], pss: int, name: str | None = None) -> None:
        self.pid, self._ppid, self._cmdline, self._pss = pid, ppid, cmdline, pss
        self._name = name or cmdline[0].rsplit("/", 1)[-1]
        self.kids: list[FakeProcess] = []
        self.gone_after: int | None = None  # calls of ppid() and cmdline() before the process ends

    def _alive(self) -> None:
        if self.gone_after is not None:
            if self.gone_after <= 0:
                raise psutil.NoSuchProcess(self.pid)
            self.gone_after -= 1

    def name(self) -> str:
        return self._name

    def cmdline(self) -> list[str]:
        self._alive()
        return self._cmdline

    def ppid(self) -> int:
        self._alive()
        return self._ppid

    def memory_full_info(self) -> SimpleNamespace:
        return SimpleNamespace(pss=self._pss * MIB)

    def children(self, recursive: bool = False) -> list[FakeProcess]:
        return [d for k in self.kids for d in [k, *(k.children(True) if recursive else [])]]


def tree(*, spawning: bool) -> FakeProcess:
    """This process -> the job's JVM (1300 MiB) -> the Python driver (100), pyspark's daemon (40)
    and its two forked workers (200 each); with ``spawning``, also a process the JVM is starting,
    still in the JVM's memory (posix_spawn): the JVM's name, command line and PSS."""
    bench = FakeProcess(1, 0, ["python", "-m", "benchmarks.run"], 50)
    jvm = FakeProcess(10, 1, JAVA, 1300)
    driver = FakeProcess(11, 10, ["/venv/bin/python", "spark_scripts/kinesis_batch.py", "--batch-id", "2"], 100)
    daemon = FakeProcess(12, 10, DAEMON, 40)
    daemon.kids = [FakeProcess(13, 12, DAEMON, 200), FakeProcess(14, 12, DAEMON, 200)]
    jvm.kids = [driver, daemon]
    if spawning:
        jvm.kids.append(FakeProcess(15, 10, JAVA, 1300, name="java"))
    bench.kids = [jvm]
    return bench


def sample(monkeypatch: pytest.MonkeyPatch, bench: FakeProcess) -> run.MemorySampler:
    monkeypatch.setattr(psutil, "Process", lambda *a: bench)
    with run.MemorySampler(interval=0.01) as sampler:
        time.sleep(0.1)
    return sampler


@pytest.mark.parametrize("spawning", [False, True])
def test_the_jvm_and_its_python_processes_count_once_even_while_the_jvm_starts_a_process(monkeypatch, spawning):
    sampler = sample(monkeypatch, tree(spawning=spawning))
    assert (sampler.peak_total, sampler.peak_jvm, sampler.peak_python) == (1840 * MIB, 1300 * MIB, 540 * MIB)


def test_the_peak_is_broken_down_by_role_with_each_process(monkeypatch):
    sampler = sample(monkeypatch, tree(spawning=True))
    assert {k: v // MIB for k, v in sampler.peak_by_role.items()} == {
        "jvm": 1300, "python_driver": 100, "pyspark_daemon": 40, "python_workers": 400, "other": 0}  # fmt: skip
    assert sorted((p.pid, p.role, p.pss // MIB) for p in sampler.peak_processes) == [
        (10, "jvm", 1300), (11, "python_driver", 100), (12, "pyspark_daemon", 40),
        (13, "python_workers", 200), (14, "python_workers", 200)]  # fmt: skip
    assert sampler.peak_processes[0].command == "java -cp ... org.apache.spark.deploy.SparkSubmit spark_scripts/kinesis_batch.py"


def test_process_roles():
    assert run.process_role(JAVA, None, True) == "jvm"
    assert run.process_role(DAEMON, ["/usr/bin/java"], False) == "pyspark_daemon"
    assert run.process_role(DAEMON, DAEMON, False) == "python_workers"
    assert run.process_role(["/venv/bin/python", "-m", "pyspark.worker"], JAVA, False) == "python_workers"
    assert run.process_role(["/usr/lib/jvm/lib/jspawnhelper", "17", "29"], JAVA, False) == "other"
    assert run.process_role(JAVA, JAVA, False) == "other"


def test_a_process_that_ends_while_sampled_is_left_out_of_that_sample_only(monkeypatch):
    bench = tree(spawning=False)
    bench.kids[0].kids.append(short_lived := FakeProcess(16, 10, ["/bin/chmod", "644", "part-0.parquet"], 5))
    short_lived.gone_after = 2  # its command line read twice (JVMs, then the JVM's processes), then gone
    sampler = sample(monkeypatch, bench)
    assert (sampler.peak_total, sampler.peak_jvm, sampler.peak_python) == (1840 * MIB, 1300 * MIB, 540 * MIB)


def test_a_failed_sampling_is_raised_when_the_block_ends(monkeypatch):
    bench = tree(spawning=False)
    bench.kids[0].memory_full_info = lambda: 1 / 0  # not a psutil error
    monkeypatch.setattr(psutil, "Process", lambda *a: bench)
    with pytest.raises(RuntimeError, match="memory sampling stopped early"):
        with run.MemorySampler(interval=0.01):
            time.sleep(0.05)


def test_a_command_in_the_report_names_no_path_of_the_machine():
    import tempfile

    command = run.short_command([
        "/usr/bin/java", "-cp", "/opt/jars/*", f"-Xlog:gc:file={tempfile.gettempdir()}/kinesis-bench-x/gc-1",
        str(run.ROOT / "spark_scripts" / "kinesis_batch.py"), "--stream", "s",
    ], width=500)  # fmt: skip
    assert command == "java -cp ... -Xlog:gc:file=$TMPDIR/kinesis-bench-x/gc-1 spark_scripts/kinesis_batch.py --stream s"
