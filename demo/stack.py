"""The local stack: moto in server mode on 127.0.0.1 and an Airflow environment pointing at it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
REGION = "us-east-1"
# moto accepts any credentials; these are local placeholders, not secrets.
ACCESS_KEY = "AKIALOCALDEMOKEY0001"
SECRET_KEY = "local-demo-secret-never-logged"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def local_server(command: list[str], port: int, name: str, timeout: float = 30.0, env: dict[str, str] | None = None) -> Iterator[str]:
    """Run ``command`` (a server listening on 127.0.0.1:``port``); yield its URL; stop it after."""
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}")
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not listen on 127.0.0.1:{port} within {timeout}s")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def moto_command(port: int) -> list[str]:
    """The command that runs moto's server on 127.0.0.1:``port`` (``demo/moto_server.py``: a listen backlog of 1024)."""
    return [sys.executable, str(ROOT / "demo" / "moto_server.py"), "-H", "127.0.0.1", "-p", str(port)]


@contextmanager
def moto_server(port: int | None = None) -> Iterator[str]:
    """moto in server mode (Kinesis, DynamoDB, S3) on 127.0.0.1; yields its endpoint URL."""
    port = port or free_port()
    with local_server(moto_command(port), port, "moto_server") as url:
        yield url


def kinesalite_binary(binary: str | None = None) -> str:
    """The kinesalite executable: ``binary``, else ``KINESALITE_BIN``, else ``make kinesalite``'s.

    :raises RuntimeError: it is not there (names the path and how to install it).
    """
    binary = binary or os.environ.get("KINESALITE_BIN") or str(ROOT / ".cache/node/node_modules/.bin/kinesalite")
    if not Path(binary).exists():
        raise RuntimeError(f"kinesalite not installed at {binary}: run 'make kinesalite' or set KINESALITE_BIN")
    return binary


@contextmanager
def kinesalite_server(binary: str | None = None, shard_limit: int = 200) -> Iterator[str]:
    """kinesalite (npm) on a free port of 127.0.0.1, with fast stream state changes and at most
    ``shard_limit`` shards in all (kinesalite's own default is 10); yields its endpoint."""
    binary = kinesalite_binary(binary)
    port = free_port()
    command = [binary, "--port", str(port), "--createStreamMs", "5", "--deleteStreamMs", "5",
               "--updateStreamMs", "5", "--shardLimit", str(shard_limit)]  # fmt: skip
    with local_server(command, port, "kinesalite") as url:
        yield url


def airflow_env(airflow_home: Path, endpoint: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for the ``airflow`` CLI: SQLite home, our dags folder, connections to the stack."""
    env = dict(os.environ)
    env.update(
        {
            "AIRFLOW_HOME": str(airflow_home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(
                {
                    "conn_type": "aws",
                    "login": ACCESS_KEY,
                    "password": SECRET_KEY,
                    "extra": {"region_name": REGION, "endpoint_url": endpoint},
                }
            ),
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[*]"}),
            "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p),
        }
    )
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        env.pop(key, None)
    env.update(extra or {})
    return env


def airflow(args: list[str], env: dict[str, str], log_file: Path | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    """Run the ``airflow`` CLI of this environment; raise with the output's tail on failure."""
    proc = subprocess.run([str(BIN / "airflow"), *args], env=env, capture_output=True, text=True, timeout=timeout)
    if log_file is not None:
        with open(log_file, "a", encoding="utf-8") as fh:
            fh.write(f"$ airflow {' '.join(args)}\n{proc.stdout}\n{proc.stderr}\n")
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
        raise RuntimeError(f"airflow {' '.join(args)} failed ({proc.returncode}):\n{tail}")
    return proc


@contextmanager
def spark_connect_server(cores: int | str = 2, timeout: float = 120.0) -> Iterator[tuple[str, int]]:
    """A Spark Connect server (from the pyspark distribution, ``local[cores]``) on a free port of
    127.0.0.1; yields ``(host, port)`` for a ``spark_connect`` connection."""
    port = free_port()
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    command = [str(BIN / "spark-submit"), "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
               "--master", f"local[{cores}]", "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
               "--conf", f"spark.connect.grpc.binding.port={port}", "--conf", "spark.ui.enabled=false",
               "--conf", "spark.sql.session.timeZone=UTC", "spark-internal"]  # fmt: skip
    with local_server(command, port, "Spark Connect server", timeout=timeout, env=env):
        yield "127.0.0.1", port
