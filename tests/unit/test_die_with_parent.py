"""The spark-submit wrapper: the command dies with the process that started it (Linux)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from airflow_kinesis_spark import die_with_parent

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")

PARENT = """
import subprocess, sys, time
from airflow_kinesis_spark import die_with_parent
child = subprocess.Popen(die_with_parent.command([sys.executable, "-c", "import time; time.sleep(60)"]))
print(child.pid, flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
        return fh.read().split()[2] != "Z"  # a zombie is dead


def test_the_command_is_killed_when_its_parent_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    time.sleep(0.5)  # the wrapper has exec'd the command
    assert _alive(child)
    with open(f"/proc/{child}/cmdline", "rb") as fh:
        assert b"time.sleep(60)" in fh.read()  # the same process id runs the command (execvp)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_a_parent_that_is_already_gone_starts_nothing():
    wrapped = die_with_parent.command(["true"], parent_pid=1 if os.getppid() != 1 else 2)
    result = subprocess.run(wrapped, capture_output=True, text=True)
    assert result.returncode == 1 and "exited before the Spark job started" in result.stderr


def test_the_command_does_not_inherit_airflow_environment_variables():
    env = {**os.environ, "AIRFLOW_CONN_AWS_DEFAULT": '{"password": "s3cret"}', "AIRFLOW__CORE__FERNET_KEY": "k", "KEEP_ME": "1"}
    shown = subprocess.run(die_with_parent.command(["env"]), env=env, capture_output=True, text=True, check=True).stdout
    assert "KEEP_ME=1" in shown and "s3cret" not in shown and "AIRFLOW__CORE__FERNET_KEY" not in shown
