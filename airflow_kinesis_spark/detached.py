"""Run a detached job's command, then remove its private directory if the command succeeded.

``python -m airflow_kinesis_spark.detached DIRECTORY -- COMMAND ARGS...`` runs ``COMMAND`` in
``DIRECTORY`` and waits for it; exit status 0 removes ``DIRECTORY`` (its package zip and log),
any other keeps it for a look at ``spark-submit.log`` and exits with the command's status.
Started by ``SparkSubmitJob.submit_detached`` for a deferred batch on a local master, whose
driver outlives the task that started it. Standard library only.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

__all__ = ["main"]


def main(args: list[str]) -> int:
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m airflow_kinesis_spark.detached DIRECTORY -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    directory, command = args[0], args[2:]
    status = subprocess.call(command, cwd=directory)
    if status == 0:
        shutil.rmtree(directory, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
