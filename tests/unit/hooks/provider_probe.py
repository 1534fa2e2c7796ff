"""Run BatchSparkSubmitHook against whichever apache-spark provider this interpreter imports and
print what it saw as one JSON line (tests/unit/hooks/test_spark_submit_provider.py runs it with the
installed provider and with the oldest supported one, in a scratch environment).

spark-submit is a fake (a shell script named ``spark-submit`` first on the job's PATH): it records
its arguments, its environment and its process id, prints a failed PySpark job's output and exits 1;
with ``--name sleepy`` it sleeps instead, to be killed through the hook's ``on_kill``."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time

OUTPUT = """\
26/11/24 00:16:27 INFO SparkContext: Running Spark version 4.1.1
Traceback (most recent call last):
  File "/opt/job/kinesis_batch.py", line 600, in main
py4j.protocol.Py4JJavaError: An error occurred while calling o45.parquet.
: org.apache.spark.SparkException: Job aborted due to stage failure
\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages(DAGScheduler.scala:2856)
Caused by: java.io.IOException: Mkdirs failed to create file:/readonly/lake/_staging/batch_id=1-ab12
\tat org.apache.hadoop.fs.ChecksumFileSystem.create(ChecksumFileSystem.java:515)
26/11/24 00:16:28 INFO ShutdownHookManager: Shutdown hook called
"""

FAKE = """#!/bin/sh
printf '%s\\n' "$@" > "$RECORD.args"
echo $$ > "$RECORD.pid"
env > "$RECORD.env"
case " $* " in *" sleepy "*) exec sleep 60 ;; esac
cat "$RECORD.output"
exit 1
"""


def main() -> None:
    os.environ["AIRFLOW_CONN_KS_YARN"] = json.dumps({"conn_type": "spark", "host": "yarn", "extra": {"deploy-mode": "cluster"}})
    os.environ["AIRFLOW_VAR_SECRET_THING"] = "must-not-reach-spark"
    from airflow.exceptions import AirflowException
    from airflow.providers.apache.spark import __version__ as provider_version

    from airflow_kinesis_spark.hooks.spark_submit import BatchSparkSubmitHook, spark_connection

    work, bin_dir = tempfile.mkdtemp(), tempfile.mkdtemp()
    fake = os.path.join(bin_dir, "spark-submit")
    with open(fake, "w") as fh:
        fh.write(FAKE)
    os.chmod(fake, 0o755)
    record = os.path.join(work, "record")
    with open(record + ".output", "w") as fh:
        fh.write(OUTPUT)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "RECORD": record, "KS_JOB_SETTING": "1"}
    result: dict = {"provider": provider_version}

    hook = BatchSparkSubmitHook(conn_id="ks_missing", conf={"spark.ui.enabled": "false"}, py_files="core.zip",
                                application_args=["--batch-id", "7"], env_vars=env, name="job", work_dir=work)  # fmt: skip
    try:
        hook.submit(application="app.py")
        result["raised"] = None
    except AirflowException as err:
        result["raised"] = type(err).__name__
    with open(record + ".args") as fh:
        result["args"] = fh.read().splitlines()
    with open(record + ".env") as fh:
        names = {line.split("=", 1)[0] for line in fh.read().splitlines()}
    result["airflow_env"] = sorted(n for n in names if n.startswith("AIRFLOW_"))
    result["job_env"] = "KS_JOB_SETTING" in names
    result["cause"] = hook.failure_cause

    sleepy = BatchSparkSubmitHook(conn_id="ks_missing", env_vars=env, name="sleepy", work_dir=work)
    thread = threading.Thread(target=lambda: _quiet(sleepy.submit, "app.py"), daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (os.path.exists(record + ".pid") and open(record + ".args").read().count("sleepy")):
        time.sleep(0.05)
    pid = int(open(record + ".pid").read())
    sleepy.on_kill()
    thread.join(20)
    result["killed"] = not thread.is_alive() and not _alive(pid)

    yarn = spark_connection("ks_yarn")
    result["yarn"] = [yarn.master, yarn.deploy_mode, yarn.env_goes_on_command_line]
    print(json.dumps(result))


def _quiet(call, *args):
    try:
        call(*args)
    except Exception:  # noqa: BLE001 - the killed job's submit fails: expected
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:  # a zombie has not been reaped yet: dead
        return fh.read().split(") ", 1)[1][0] != "Z"


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    main()
