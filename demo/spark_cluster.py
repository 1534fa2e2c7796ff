"""A Spark standalone cluster on 127.0.0.1: one master and one worker from the pyspark distribution.

Used by the standalone-cluster test and by benchmarks that want executors in their own JVMs::

    with standalone_cluster(memory="1g", cores=2) as cluster:
        os.environ["AIRFLOW_CONN_SPARK_DEFAULT"] = cluster.connection()
        ...  # KinesisToSparkOperator(..., spark_settings=SparkSettings(conn_id="spark_default"))

The master and the worker are started with pyspark's ``bin/spark-class`` (``SPARK_HOME`` = the
installed pyspark package), on free ports, each in its own process group; executors are child
processes of the worker, in the worker's group. On exit both groups get SIGTERM, then SIGKILL.

Files, under the cluster's directory: ``master.log``, ``worker.log`` (the daemons' log4j output)
and ``work/`` (the worker's work dir: ``work/{app id}/{executor id}/stderr`` is an executor's log,
next to the files and ``--py-files`` Spark fetched for it).

Run ``python -m demo.spark_cluster`` to keep a cluster up until Ctrl-C.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from demo.stack import free_port

__all__ = ["StandaloneCluster", "spark_home", "standalone_cluster"]

HOST = "127.0.0.1"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


def spark_home() -> Path:
    """The pyspark package directory: a Spark distribution with ``bin/spark-class`` and ``jars/``."""
    import pyspark

    home = Path(pyspark.__file__).resolve().parent
    if not (home / "bin" / "spark-class").is_file():
        raise RuntimeError(f"pyspark at {home} has no bin/spark-class: it is not a full pyspark distribution")
    return home


@dataclass(frozen=True)
class StandaloneCluster:
    """A running master and worker.

    :param master_url: ``spark://127.0.0.1:{port}``, the ``--master`` of spark-submit.
    :param web_ui_url: the master's web UI; ``{web_ui_url}/json/`` is its state as JSON.
    :param directory: holds ``master.log``, ``worker.log`` and ``work/``.
    :param work_dir: the worker's work dir (``{app id}/{executor id}/stderr`` per executor).
    :param cores: cores the worker offers.
    :param memory: memory the worker offers to executors (e.g. ``1g``).
    """

    master_url: str
    web_ui_url: str
    directory: Path
    work_dir: Path
    cores: int
    memory: str

    @property
    def port(self) -> int:
        return int(self.master_url.rsplit(":", 1)[1])

    def status(self, timeout: float = 5.0) -> dict[str, Any]:
        """The master's state (``aliveworkers``, ``workers``, ``activeapps``, ``completedapps``, ...)."""
        with urllib.request.urlopen(f"{self.web_ui_url}/json/", timeout=timeout) as response:  # noqa: S310 - 127.0.0.1
            return json.load(response)

    def connection(self, deploy_mode: str = "client") -> str:
        """A ``spark`` connection to this master, as JSON for an ``AIRFLOW_CONN_*`` variable.

        ``client`` deploy mode: the driver runs where spark-submit runs, so the job's plan and
        report files stay local and the AWS environment reaches the driver (the apache-spark
        provider does not pass environment variables in standalone ``cluster`` mode).
        """
        return json.dumps({"conn_type": "spark", "host": f"spark://{HOST}", "port": self.port, "extra": {"deploy-mode": deploy_mode}})

    def executor_logs(self, app_id: str | None = None) -> list[Path]:
        """``stderr`` of every executor the worker ran (of one application, or of all)."""
        return sorted(self.work_dir.glob(f"{app_id or 'app-*'}/*/stderr"))


def _get_json(url: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - 127.0.0.1 only
            return json.load(response)
    except (OSError, urllib.error.URLError, ValueError):
        return None


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@contextmanager
def _daemon(command: list[str], log: Path, env: dict[str, str]) -> Iterator[subprocess.Popen]:
    """Run a Spark daemon in its own process group, output to ``log``; stop the whole group after."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        yield proc
    finally:
        _stop_group(proc)


def _stop_group(proc: subprocess.Popen, grace: float = 15.0) -> None:
    """SIGTERM the process group led by ``proc`` (the daemon and its executors), SIGKILL what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        deadline = time.monotonic() + grace
        try:
            os.killpg(proc.pid, sig)
            while time.monotonic() < deadline:
                proc.poll()  # reap the leader: a zombie still counts as a member of the group
                os.killpg(proc.pid, 0)
                time.sleep(0.1)
        except ProcessLookupError:
            return


def _wait(what: str, check: Any, procs: list[tuple[subprocess.Popen, Path]], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        for proc, log in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{log.stem} exited with {proc.returncode} while waiting for {what}:\n{_tail(log)}")
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout:g}s; logs: {', '.join(str(log) for _, log in procs)}")
        time.sleep(0.25)


@contextmanager
def standalone_cluster(
    directory: str | Path | None = None,
    *,
    cores: int = 2,
    memory: str = "1g",
    daemon_memory: str = "512m",
    timeout: float = 120.0,
) -> Iterator[StandaloneCluster]:
    """Start a master and a worker on 127.0.0.1 (free ports); yield once the worker has registered.

    :param directory: where logs and the worker's work dir go; a temporary directory, removed
        after, when ``None``.
    :param cores: cores the worker offers to executors.
    :param memory: memory the worker offers to executors (``spark.executor.memory`` of a job
        must fit: e.g. ``512m`` on a ``1g`` worker).
    :param daemon_memory: heap of the master and worker JVMs themselves (``SPARK_DAEMON_MEMORY``).
    :param timeout: seconds to wait for the master's web UI and the worker's registration.
    :raises RuntimeError: a daemon exited during start-up (with the tail of its log).
    :raises TimeoutError: the worker did not register in time.
    """
    with ExitStack() as stack:
        if directory is None:
            directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="spark-standalone-"))
        root = Path(directory)
        work_dir = root / "work"
        conf_dir = root / "conf"  # empty: no spark-env.sh or spark-defaults.conf of this machine
        for path in (work_dir, conf_dir):
            path.mkdir(parents=True, exist_ok=True)
        home = spark_home()
        env = {
            **os.environ,
            "SPARK_HOME": str(home),
            "SPARK_CONF_DIR": str(conf_dir),
            "SPARK_LOCAL_IP": HOST,
            "SPARK_LOG_DIR": str(root),
            "SPARK_WORKER_DIR": str(work_dir),
            "SPARK_DAEMON_MEMORY": daemon_memory,
        }
        spark_class = str(home / "bin" / "spark-class")
        port, web_port, worker_port, worker_web_port = (free_port() for _ in range(4))
        master_log, worker_log = root / "master.log", root / "worker.log"
        cluster = StandaloneCluster(
            master_url=f"spark://{HOST}:{port}",
            web_ui_url=f"http://{HOST}:{web_port}",
            directory=root,
            work_dir=work_dir,
            cores=cores,
            memory=memory,
        )
        master = stack.enter_context(
            _daemon([spark_class, MASTER_CLASS, "--host", HOST, "--port", str(port), "--webui-port", str(web_port)], master_log, env)
        )
        _wait("the master's web UI", lambda: _get_json(f"{cluster.web_ui_url}/json/"), [(master, master_log)], timeout)
        worker = stack.enter_context(
            _daemon(
                [spark_class, WORKER_CLASS, "--host", HOST, "--port", str(worker_port), "--webui-port", str(worker_web_port),
                 "--cores", str(cores), "--memory", memory, "--work-dir", str(work_dir), cluster.master_url],
                worker_log, env,
            )  # fmt: skip
        )

        def registered() -> bool:
            state = _get_json(f"{cluster.web_ui_url}/json/") or {}
            return any(w.get("state") == "ALIVE" and w.get("cores") == cores for w in state.get("workers", []))

        _wait("the worker to register with the master", registered, [(master, master_log), (worker, worker_log)], timeout)
        yield cluster


def main() -> None:
    with standalone_cluster() as cluster:
        print(f"Spark master {cluster.master_url}, web UI {cluster.web_ui_url}, logs in {cluster.directory}")
        print(f"AIRFLOW_CONN_SPARK_DEFAULT='{cluster.connection()}'")
        print("Ctrl-C stops the cluster.")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
