"""A real Airflow deployment on the local stack: PostgreSQL, then Airflow's own components.

``postgres_server`` runs a throw-away PostgreSQL (the distribution's server binaries, found on
``PATH`` or under ``/usr/lib/postgresql/<version>/bin``; ``make postgres`` installs them) on a
free port of 127.0.0.1. ``airflow_deployment`` migrates a metadata database on it and starts the
API server, scheduler (LocalExecutor), DAG processor and triggerer as separate processes, each
in its own process group with its log in the work directory, the way an operator runs Airflow
on a machine. Both stop everything they started on exit.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from demo.stack import BIN, airflow, airflow_env, free_port

#: Where Debian and Ubuntu's ``postgresql-<version>`` packages put the server binaries.
DEBIAN_POSTGRES_ROOT = Path("/usr/lib/postgresql")
#: The components of a deployment, in start order; stopped in reverse.
COMPONENTS = ("api-server", "dag-processor", "triggerer", "scheduler")
_PG_USER = "airflow"
_PG_DATABASE = "airflow"


def postgres_bin_dir() -> Path | None:
    """The directory holding ``initdb`` and ``postgres``: from ``PATH``, else the newest Debian install."""
    candidates: list[Path] = []
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    versions = DEBIAN_POSTGRES_ROOT.glob("*/bin") if DEBIAN_POSTGRES_ROOT.is_dir() else []
    candidates += sorted(versions, key=lambda p: [int(x) for x in re.findall(r"\d+", p.parent.name)] or [0], reverse=True)
    for directory in candidates:
        if (directory / "initdb").exists() and (directory / "postgres").exists():
            return directory
    return None


def _unprivileged() -> tuple[list[str], tuple[int, int] | None]:
    """A command prefix that drops root (PostgreSQL refuses to run as root), and the (uid, gid) it runs as."""
    if os.geteuid() != 0:
        return [], None
    try:
        user = pwd.getpwnam("postgres")  # created by the distribution's package
        ids = (user.pw_uid, user.pw_gid)
    except KeyError:
        ids = (65534, 65534)  # nobody / nogroup
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise RuntimeError("running as root and setpriv (util-linux) is missing: cannot start PostgreSQL unprivileged")
    return [setpriv, f"--reuid={ids[0]}", f"--regid={ids[1]}", "--clear-groups", "--"], ids


@contextmanager
def postgres_server(log_dir: Path, timeout: float = 60.0) -> Iterator[str]:
    """PostgreSQL on a free port of 127.0.0.1 with a temporary data directory.

    Trust authentication on 127.0.0.1 only, no Unix socket, no fsync (a test database). Yields
    the SQLAlchemy URL of an empty database ``airflow``. Logs go to ``log_dir/postgres.log``.

    :raises RuntimeError: the server binaries are missing (run ``make postgres``), or the server
        did not accept connections within ``timeout`` seconds.
    """
    import psycopg2

    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        raise RuntimeError(f"PostgreSQL server binaries (initdb, postgres) not found on PATH or under {DEBIAN_POSTGRES_ROOT}: run 'make postgres'")
    prefix, owner = _unprivileged()
    # Not under the caller's directories: pytest's are private to root, the server may run as nobody.
    base = Path(tempfile.mkdtemp(prefix="airflow-deployment-pg-"))
    log_path = log_dir / "postgres.log"
    proc: subprocess.Popen | None = None
    try:
        if owner is not None:
            os.chown(base, *owner)
        data = base / "data"
        with open(log_path, "ab") as log:
            subprocess.run(
                [*prefix, str(bin_dir / "initdb"), "-D", str(data), "-U", _PG_USER, "-A", "trust", "-E", "UTF8", "--no-sync"],
                stdout=log, stderr=subprocess.STDOUT, check=True, timeout=120,
            )  # fmt: skip
            port = free_port()
            settings = {"listen_addresses": "127.0.0.1", "port": str(port), "unix_socket_directories": "",
                        "fsync": "off", "synchronous_commit": "off", "full_page_writes": "off", "max_connections": "200"}  # fmt: skip
            command = [*prefix, str(bin_dir / "postgres"), "-D", str(data)]
            for name, value in settings.items():
                command += ["-c", f"{name}={value}"]
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"postgres exited with {proc.returncode}:\n{tail(log_path)}")
            try:
                conn = psycopg2.connect(host="127.0.0.1", port=port, user=_PG_USER, dbname="postgres", connect_timeout=3)
                break
            except psycopg2.OperationalError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"postgres did not accept connections within {timeout}s:\n{tail(log_path)}") from None
                time.sleep(0.2)
        try:
            conn.autocommit = True  # CREATE DATABASE cannot run in a transaction
            with conn.cursor() as cur:
                cur.execute(f"CREATE DATABASE {_PG_DATABASE}")
        finally:
            conn.close()
        yield f"postgresql+psycopg2://{_PG_USER}@127.0.0.1:{port}/{_PG_DATABASE}"
    finally:
        if proc is not None:
            _stop_group(proc, first_signal=signal.SIGINT)  # SIGINT: PostgreSQL's fast shutdown
        shutil.rmtree(base, ignore_errors=True)


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a text file ('' when it does not exist)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return "".join(fh.readlines()[-lines:])
    except FileNotFoundError:
        return ""


def _stop_group(proc: subprocess.Popen, first_signal: int = signal.SIGTERM, timeout: float = 20.0) -> None:
    """Stop ``proc``, leader of its own process group, and every process it started.

    Descendants that left the group (a new session) are found through psutil before the group
    is signalled and killed with it if still alive after ``timeout`` seconds.
    """
    import psutil

    try:
        descendants = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        descendants = []
    with suppress(ProcessLookupError):
        os.kill(proc.pid, first_signal)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for child in descendants:
        with suppress(psutil.Error):
            child.kill()
    with suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


@dataclass
class AirflowDeployment:
    """A running deployment: its environment, API server URL, component processes and logs."""

    env: dict[str, str]
    home: Path
    api_url: str
    sql_alchemy_conn: str
    log_dir: Path
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """Run the ``airflow`` CLI against this deployment (output appended to ``cli.log``)."""
        return airflow(list(args), self.env, self.log_dir / "cli.log", timeout=timeout)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        """Rows of one read-only SQL statement on the metadata database."""
        import psycopg2
        from sqlalchemy.engine import make_url

        url = make_url(self.sql_alchemy_conn)
        conn = psycopg2.connect(host=url.host, port=url.port, user=url.username, dbname=url.database, connect_timeout=10)
        try:
            with conn.cursor() as cur:
                cur.execute(sql, params)
                return cur.fetchall()
        finally:
            conn.close()

    def health(self) -> dict[str, Any]:
        """The API server's ``/api/v2/monitor/health``: each component's status and latest heartbeat."""
        with urllib.request.urlopen(f"{self.api_url}/api/v2/monitor/health", timeout=10) as response:
            return json.loads(response.read())

    def api(self, path: str) -> Any:
        """GET ``/api/v2/{path}`` of the API server as the simple auth manager's ``admin`` (its
        password from the file the API server generated in ``AIRFLOW_HOME``); the JSON response."""
        passwords = json.loads((self.home / "simple_auth_manager_passwords.json.generated").read_text())
        login = urllib.request.Request(
            f"{self.api_url}/auth/token", data=json.dumps({"username": "admin", "password": passwords["admin"]}).encode(),
            headers={"Content-Type": "application/json"}, method="POST",
        )  # fmt: skip
        with urllib.request.urlopen(login, timeout=30) as response:
            token = json.loads(response.read())["access_token"]
        request = urllib.request.Request(f"{self.api_url}/api/v2/{path.lstrip('/')}", headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def check_running(self) -> None:
        """:raises RuntimeError: a component exited (with its log's tail)."""
        for name, proc in self.processes.items():
            if proc.poll() is not None:
                raise RuntimeError(f"airflow {name} exited with {proc.returncode}:\n{tail(self.log_dir / f'{name}.log')}")

    def task_logs(self, dag_id: str | None = None) -> list[Path]:
        """Task log files (newest last), of one DAG or all."""
        pattern = f"dag_id={dag_id}/**/*.log" if dag_id else "dag_id=*/**/*.log"
        return sorted((self.home / "logs").glob(pattern), key=lambda p: p.stat().st_mtime)

    def diagnostics(self, lines: int = 40) -> str:
        """Tails of every component's log and of the three newest task logs, for failure messages."""
        parts = [f"--- {name}.log ---\n{tail(self.log_dir / f'{name}.log', lines)}" for name in ("postgres", *COMPONENTS)]
        parts += [f"--- {p.relative_to(self.home)} ---\n{tail(p, lines)}" for p in self.task_logs()[-3:]]
        return "\n".join(parts)


def _wait_healthy(deployment: AirflowDeployment, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        deployment.check_running()
        try:
            last = health = deployment.health()
            statuses = [health.get(c, {}) or {} for c in ("metadatabase", "scheduler", "triggerer", "dag_processor")]
            if all(s.get("status") == "healthy" for s in statuses):
                return
        except OSError as exc:  # not listening yet
            last = exc
        time.sleep(1)
    raise RuntimeError(f"the deployment was not healthy within {timeout}s (last: {last}):\n{deployment.diagnostics()}")


def _async_database_env() -> dict[str, str]:
    """Airflow derives a ``postgresql+asyncpg`` URL for its async sessions from the sync one; without
    asyncpg installed, turn async sessions off (the components this deployment runs work without)."""
    return {} if importlib.util.find_spec("asyncpg") else {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": ""}


@contextmanager
def airflow_deployment(
    work_dir: Path,
    endpoint: str,
    sql_alchemy_conn: str,
    dags_folder: Path,
    extra_env: dict[str, str] | None = None,
    *,
    parallelism: int = 4,
    timeout: float = 300.0,
) -> Iterator[AirflowDeployment]:
    """Migrate the metadata database, start Airflow's components, yield once all report healthy.

    :param work_dir: ``airflow_home/`` and ``logs/`` (one file per component, ``cli.log``) go here.
    :param endpoint: the AWS emulator's URL, for ``aws_default`` (see ``demo.stack.airflow_env``).
    :param sql_alchemy_conn: the metadata database (PostgreSQL: the LocalExecutor runs tasks in
        parallel, which SQLite's single writer cannot take).
    :param dags_folder: the DAG bundle the DAG processor parses.
    :param extra_env: more environment for every component (DAG settings, connections).
    :param parallelism: task slots of the LocalExecutor.
    :param timeout: seconds for ``db migrate`` and for the components to report healthy.
    """
    home = work_dir / "airflow_home"
    log_dir = work_dir / "logs"
    home.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    api_port = free_port()
    api_url = f"http://127.0.0.1:{api_port}"
    env = airflow_env(
        home,
        endpoint,
        {
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": sql_alchemy_conn,
            **_async_database_env(),
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": str(parallelism),
            # Task runners report to the execution API of this API server, with tokens every
            # component signs and checks with one shared secret.
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{api_url}/execution/",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(api_port),
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
            "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
            # Log servers of the scheduler's workers and of the triggerer: free ports, not 8793/8794.
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
            # Look for new DAG files often; re-parse known ones at the default pace.
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "10",
            **(extra_env or {}),
        },
    )
    deployment = AirflowDeployment(env=env, home=home, api_url=api_url, sql_alchemy_conn=sql_alchemy_conn, log_dir=log_dir)
    deployment.cli("db", "migrate", timeout=timeout)
    commands = {
        "api-server": ["api-server", "--host", "127.0.0.1", "--port", str(api_port), "--workers", "1"],
        "dag-processor": ["dag-processor"],
        "triggerer": ["triggerer"],
        "scheduler": ["scheduler"],
    }
    try:
        for name in COMPONENTS:
            with open(log_dir / f"{name}.log", "ab") as log:
                deployment.processes[name] = subprocess.Popen(
                    [str(BIN / "airflow"), *commands[name]], env=env, stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, start_new_session=True,
                )  # fmt: skip
        _wait_healthy(deployment, timeout)
        yield deployment
    finally:
        for name in reversed(COMPONENTS):
            if name in deployment.processes:
                _stop_group(deployment.processes[name])
