"""Run a command that is killed when the process that started it dies (Linux ``PR_SET_PDEATHSIG``),
without the starting process's Airflow environment variables.

``python -m airflow_kinesis_spark.die_with_parent PARENT_PID -- COMMAND ARGS...`` sets the
parent-death signal to ``SIGKILL``, checks that ``PARENT_PID`` is still its parent (the parent may
have died before the signal was set), then replaces itself with ``COMMAND`` (``execvp``: same
process id, so the caller can still kill it; the signal survives ``execve``, Linux ``prctl(2)``).

A worker killed hard (OOM killer, ``kill -9``) would otherwise leave a local or client-mode Spark
job running, which could write the batch's output after a retry started writing it. This
replaces ``subprocess.Popen(preexec_fn=...)``, which is not safe in a process with threads (the
lease heartbeat runs in one; Python's subprocess documentation).

The command gets this process's environment without :data:`SCRUBBED_ENV_PREFIXES`: an Airflow
worker's ``AIRFLOW_CONN_*`` (connections, with their secrets), ``AIRFLOW_VAR_*`` and
``AIRFLOW__*`` (configuration such as the database URL or the Fernet key) never reach Spark's
processes, which need none of them. Standard library only.
"""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["command", "main", "SCRUBBED_ENV_PREFIXES"]

#: Environment variables the command does not inherit (Airflow's own).
SCRUBBED_ENV_PREFIXES = ("AIRFLOW_", "_AIRFLOW")

#: ``prctl`` option that sets the parent-death signal (``<linux/prctl.h>``).
PR_SET_PDEATHSIG = 1


def command(argv: list[str], parent_pid: int | None = None) -> list[str]:
    """``argv`` wrapped so that it dies with ``parent_pid`` (default: this process)."""
    return [sys.executable, "-m", "airflow_kinesis_spark.die_with_parent", str(parent_pid or os.getpid()), "--", *argv]


def main(args: list[str]) -> int:
    """:returns: only on error (1: the parent already died; 2: bad arguments); else never (exec)."""
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m airflow_kinesis_spark.die_with_parent PARENT_PID -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    parent, argv = int(args[0]), args[2:]
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL)) != 0:
            reason = os.strerror(ctypes.get_errno())
            print(f"airflow_kinesis_spark: could not set the parent-death signal ({reason}); the Spark job will "
                  "not stop by itself if the Airflow worker is killed", file=sys.stderr)  # fmt: skip
        elif os.getppid() != parent:
            print("airflow_kinesis_spark: the Airflow worker exited before the Spark job started; not starting it", file=sys.stderr)
            return 1
    env = {k: v for k, v in os.environ.items() if not k.startswith(SCRUBBED_ENV_PREFIXES)}
    os.execvpe(argv[0], argv, env)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
