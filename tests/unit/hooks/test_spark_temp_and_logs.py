"""The spark-submit runner's logging configuration and its private temporary directories (issue 17,
item 4): Spark's INFO off unless asked for; left-overs of killed runs removed by the next run,
never a directory a live run uses. No Spark, no network."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from airflow_kinesis_spark.hooks import spark_temp
from airflow_kinesis_spark.hooks.spark import SparkJob
from airflow_kinesis_spark.hooks.spark_logs import LOG4J_CONFIG, log4j_config_path, with_log_config
from airflow_kinesis_spark.hooks.spark_settings import SparkJobSettings
from airflow_kinesis_spark.hooks.spark_temp import (
    TEMP_DIR_MAX_AGE,
    TEMP_DIR_OWNER_FILE,
    batch_temp_dir,
    make_batch_temp_dir,
    sweep_leftover_temp_dirs,
)

DRIVER, EXECUTOR = "spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"


def test_the_log4j_configuration_is_shipped_and_keeps_spark_at_warn():
    path = Path(log4j_config_path())
    assert path.name == LOG4J_CONFIG and path.is_file()
    text = path.read_text()
    assert "rootLogger.level = ${sys:airflow_kinesis_spark.log.level:-warn}" in text


def test_a_local_master_passes_the_configuration_to_the_driver_only():
    conf, files = with_log_config({"spark.ui.enabled": "false"}, master="local[*]", cluster_deploy_mode=False)
    assert conf[DRIVER] == f"-Dairflow_kinesis_spark.log.level=warn -Dlog4j2.configurationFile={log4j_config_path()}"
    assert EXECUTOR not in conf and files is None and conf["spark.ui.enabled"] == "false"
    conf, files = with_log_config({}, master="local-cluster[2,1,512]", cluster_deploy_mode=False)  # executor JVMs here
    assert conf[EXECUTOR] == conf[DRIVER] and files is None


def test_yarn_gets_the_file_with_files_and_its_name_for_the_jvms_it_starts():
    conf, files = with_log_config({DRIVER: "-XX:+UseG1GC"}, master="yarn", cluster_deploy_mode=False)
    assert files == log4j_config_path()
    assert conf[DRIVER] == f"-XX:+UseG1GC -Dairflow_kinesis_spark.log.level=warn -Dlog4j2.configurationFile={files}"  # appended
    assert conf[EXECUTOR] == f"-Dairflow_kinesis_spark.log.level=warn -Dlog4j2.configurationFile={LOG4J_CONFIG}"
    cluster, _ = with_log_config({}, master="yarn", cluster_deploy_mode=True)  # the driver runs where --files are put
    assert cluster[DRIVER].endswith(f"-Dlog4j2.configurationFile={LOG4J_CONFIG}")


@pytest.mark.parametrize("master", ["spark://10.0.0.1:7077", "k8s://https://10.0.0.1:6443"])
def test_standalone_and_kubernetes_executors_get_the_level_from_their_start(master):
    # Their executors fetch --files with their first task, after log4j started: the file's name
    # would find nothing (and Spark's INFO defaults would be loaded), so they get the level alone.
    conf, files = with_log_config({"spark.executor.extraJavaOptions": "-XX:+UseSerialGC"}, master=master, cluster_deploy_mode=False)
    assert conf[EXECUTOR] == "-XX:+UseSerialGC -Dlog4j2.level=WARN" and files is None
    assert conf[DRIVER].endswith(f"-Dlog4j2.configurationFile={log4j_config_path()}")  # client mode: starts here
    cluster, files = with_log_config({"spark.log.level": "info"}, master=master, cluster_deploy_mode=True)
    assert (cluster[DRIVER], cluster[EXECUTOR], files) == ("-Dlog4j2.level=INFO", "-Dlog4j2.level=INFO", None)
    # ERROR would be taken by Spark for "log4j not configured" (and its INFO defaults loaded)
    error, _ = with_log_config({"spark.log.level": "ERROR"}, master=master, cluster_deploy_mode=False)
    assert error[EXECUTOR] == "-Dlog4j2.level=WARN"


def test_spark_log_level_turns_sparks_info_back_on_and_an_own_configuration_wins():
    conf, _ = with_log_config({"spark.log.level": "info"}, master="local[*]", cluster_deploy_mode=False)
    assert "-Dairflow_kinesis_spark.log.level=info " in conf[DRIVER] and conf["spark.log.level"] == "info"
    own = {DRIVER: "-Dlog4j2.configurationFile=/etc/spark/mine.properties"}
    assert with_log_config(own, master="yarn", cluster_deploy_mode=False) == (own, None)
    with pytest.raises(ValueError, match="'spark.log.level' must be one of ALL, DEBUG, ERROR, FATAL, INFO, OFF, TRACE, WARN; got 'LOUD'"):
        with_log_config({"spark.log.level": "LOUD"}, master="local[*]", cluster_deploy_mode=False)


@pytest.fixture
def temp_root(tmp_path, monkeypatch):
    """A temporary directory of its own for the runners (tempfile.gettempdir())."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(spark_temp.tempfile, "tempdir", str(root))
    return root


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    for p in [path, *path.iterdir()]:
        os.utime(p, (then, then))


def test_a_run_removes_its_directory_after_success_and_failure(temp_root):
    with batch_temp_dir(3) as tmp:
        assert Path(tmp).parent == temp_root and Path(tmp).name.startswith("kinesis-batch-3-")
        owner = json.loads((Path(tmp) / TEMP_DIR_OWNER_FILE).read_text())
        assert owner["pid"] == os.getpid()
    assert not Path(tmp).exists()
    with pytest.raises(RuntimeError), batch_temp_dir(4) as tmp:
        raise RuntimeError("the Spark job failed")
    assert not Path(tmp).exists()


def test_a_killed_runs_directory_is_removed_by_the_next_run_and_a_live_one_is_not(temp_root):
    # A run killed with SIGKILL (a real process, killed while it holds its directory).
    code = ("import sys, time; from airflow_kinesis_spark.hooks.spark_temp import batch_temp_dir\n"
            "with batch_temp_dir(7) as d:\n    print(d, flush=True); time.sleep(600)")  # fmt: skip
    env = {**os.environ, "TMPDIR": str(temp_root)}
    victim = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    killed = Path(victim.stdout.readline().strip())
    # A live run in another process, and one in this process.
    survivor = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    live_elsewhere = Path(survivor.stdout.readline().strip())
    try:
        assert killed.parent == temp_root and killed.is_dir()
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        assert killed.is_dir()  # left behind
        age(live_elsewhere, 2 * TEMP_DIR_MAX_AGE)  # however old, a directory whose owner runs stays
        SparkJob(SparkJobSettings(spark_conn_id="spark_default", kinesis_hook=None))  # the next run starts
        assert not killed.exists()  # and removed it
        with batch_temp_dir(8) as mine:
            assert live_elsewhere.is_dir() and Path(mine).is_dir()
            assert sweep_leftover_temp_dirs() == []  # nothing of a live run
            assert Path(mine).is_dir()
    finally:
        survivor.kill()
        survivor.wait()


def test_only_this_projects_directories_whose_owner_is_gone_are_removed(temp_root):
    def leftover(name: str, pid: int | None = None, **owner) -> Path:
        path = temp_root / name
        path.mkdir()
        if pid is not None:
            (path / TEMP_DIR_OWNER_FILE).write_text(json.dumps({"host": socket.gethostname(), "pid": pid, "started": None, **owner}))
        (path / "airflow_kinesis_spark_core.zip").write_bytes(b"zip")
        return path

    dead = leftover("kinesis-batch-1-dead", dead_pid())
    reused = leftover("kinesis-batch-2-reused", os.getpid(), started=-1)  # this pid, but another process's start time
    other_host = leftover("kinesis-batch-3-elsewhere", dead_pid(), host="another-worker")
    no_owner_young = leftover("kinesis-batch-4-old-version")
    no_owner_old = leftover("kinesis-batch-5-old-version")
    age(no_owner_old, TEMP_DIR_MAX_AGE + 60)
    failed_detached = leftover("kinesis-batch-6-detached", dead_pid())
    (failed_detached / "spark-submit.log").write_text("the failed job's output")
    old_failed_detached = leftover("kinesis-batch-7-detached", dead_pid())
    (old_failed_detached / "spark-submit.log").write_text("the failed job's output")
    age(old_failed_detached, TEMP_DIR_MAX_AGE + 60)
    not_ours = leftover("spark-1234", dead_pid())
    a_file = temp_root / "kinesis-batch-9-file"
    a_file.write_text("not a directory")

    removed = sweep_leftover_temp_dirs()
    assert sorted(Path(p).name for p in removed) == ["kinesis-batch-1-dead", "kinesis-batch-2-reused",
                                                     "kinesis-batch-5-old-version", "kinesis-batch-7-detached"]  # fmt: skip
    for kept in (other_host, no_owner_young, failed_detached, not_ours, a_file):
        assert kept.exists(), kept
    for gone in (dead, reused, no_owner_old, old_failed_detached):
        assert not gone.exists(), gone


def test_a_detached_jobs_directory_names_the_detached_process(temp_root):
    tmp = Path(make_batch_temp_dir(5))
    try:
        assert json.loads((tmp / TEMP_DIR_OWNER_FILE).read_text())["pid"] == os.getpid()
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        spark_temp._write_owner(str(tmp), child.pid)  # as submit_detached does once the job started
        try:
            assert sweep_leftover_temp_dirs() == [] and tmp.is_dir()
        finally:
            child.kill()
            child.wait()
        assert [Path(p) for p in sweep_leftover_temp_dirs()] == [tmp]  # its job is gone, it kept no log
    finally:
        if tmp.exists():
            import shutil

            shutil.rmtree(tmp)


def test_a_failed_detached_jobs_directory_goes_once_a_later_commit_of_its_consumer_proves_it_dead(temp_root):
    """A failed detached job keeps its directory (and spark-submit.log) for a day, to be read;
    once its consumer committed that batch or a later one, nothing can still use it."""
    tmp = Path(make_batch_temp_dir(4, consumer="orders/lake"))
    spark_temp._write_owner(str(tmp), dead_pid())  # the detached job, which has failed
    (tmp / "spark-submit.log").write_text("the failed job's output")
    other = Path(make_batch_temp_dir(4, consumer="orders/other"))
    spark_temp._write_owner(str(other), dead_pid())
    (other / "spark-submit.log").write_text("another consumer's failed job")

    assert sweep_leftover_temp_dirs() == [] and tmp.is_dir()  # kept for its log
    assert sweep_leftover_temp_dirs(committed={"orders/lake": 3}) == [] and tmp.is_dir()  # batch 4 not committed yet
    assert [Path(p) for p in sweep_leftover_temp_dirs(committed={"orders/lake": 4})] == [tmp]
    assert other.is_dir()  # another consumer's: its own commits decide
