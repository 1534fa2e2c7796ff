"""Example: split tasks (plan, job, commit) with the apache-spark provider's SparkSubmitOperator as the job.

``kinesis_batch_task_group`` builds three tasks per batch:

* ``split.plan`` (``KinesisPlanBatchOperator``) plans the batch, or re-uses the pending one,
  persists it in the checkpoint table and pushes the job's arguments (XCom ``job_arguments``: a
  list of strings). It writes nothing else: no plan file, no temporary directory.
* ``split.job`` is ``SparkSubmitOperator`` running ``kinesis_batch.py`` with those arguments and
  ``airflow_kinesis_spark_core.zip`` as ``--py-files`` (both written by
  ``kinesis-spark package DIR``). spark-submit, its driver and Python workers are a process tree
  of their own, started in a directory of their own (one per task attempt, see
  ``JOB_DIRECTORY``) that is also their ``TMPDIR``, Spark's local directory and the JVM's
  ``java.io.tmpdir``. The driver takes its batch from the checkpoint store (it claims the batch,
  holds its lease, publishes its output and records its report there), with the AWS credentials
  of the environment it runs in (here the worker's; on a cluster, the cluster's role).
* ``split.commit`` (``KinesisCommitBatchOperator``) checks the recorded report against the plan
  and advances every checkpoint in one conditional write. With no new records the plan task
  skips the job and the commit returns the plan task's summary.

Settings come from environment variables (as in kinesis_microbatch.py); this DAG has its own
consumer and output defaults, so it does not share checkpoints or batch directories with
kinesis_microbatch:

==========================  ==========================================  ==================================
variable                    meaning                                     default
==========================  ==========================================  ==================================
KINESIS_STREAM              stream name                                 apache-access-log
KINESIS_SPLIT_CONSUMER      consumer (application) name                 parquet-lake-split
KINESIS_CHECKPOINT_TABLE    DynamoDB table of the checkpoints           kinesis_spark_checkpoints
KINESIS_SPLIT_OUTPUT_PATH   Parquet root (local path, s3a://...)        /tmp/kinesis_spark_output_split
KINESIS_SPARK_JOB_PACKAGE   directory written by kinesis-spark package  /opt/airflow/kinesis-spark-job
KINESIS_SPARK_JOB_ROOT      where each job attempt gets its directory   /tmp/kinesis_spark_jobs
==========================  ==========================================  ==================================
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import dag

from airflow_kinesis_spark.operators.split import kinesis_batch_task_group

JOB_PACKAGE = os.environ.get("KINESIS_SPARK_JOB_PACKAGE", "/opt/airflow/kinesis-spark-job").rstrip("/")
#: One directory per job task attempt (``ti.id`` is unique per try): the job's working
#: directory, TMPDIR and Spark scratch space. Nothing else writes there.
JOB_DIRECTORY = os.environ.get("KINESIS_SPARK_JOB_ROOT", "/tmp/kinesis_spark_jobs").rstrip("/") + "/{{ ti.id }}"


class SparkSubmitInDirectoryOperator(SparkSubmitOperator):
    """``SparkSubmitOperator`` whose spark-submit process starts in ``working_dir`` (templated;
    created when missing). Everything else is the provider's operator (``SparkSubmitHook.submit``
    passes extra keyword arguments to ``subprocess.Popen``)."""

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "working_dir")

    def __init__(self, *, working_dir: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.working_dir = working_dir

    def _get_hook(self) -> Any:
        hook = super()._get_hook()
        os.makedirs(self.working_dir, exist_ok=True)
        hook.submit = functools.partial(hook.submit, cwd=self.working_dir)
        return hook


# [START howto_split_spark_submit]
@dag(
    dag_id="kinesis_split",
    schedule=timedelta(minutes=10),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    # retry_delay above the batch's lease_seconds (60 s): a retried job finds a dead driver's lease expired.
    default_args={"retries": 2, "retry_delay": timedelta(minutes=3)},
    tags=["kinesis", "spark", "example"],
)
def kinesis_split():
    kinesis_batch_task_group(
        "split",
        job=lambda arguments: SparkSubmitInDirectoryOperator(
            task_id="job",
            conn_id="spark_default",
            application=f"{JOB_PACKAGE}/kinesis_batch.py",
            py_files=f"{JOB_PACKAGE}/airflow_kinesis_spark_core.zip",
            application_args=arguments,  # the plan task's XCom job_arguments, a list of strings
            name="kinesis-batch-{{ run_id }}",
            working_dir=JOB_DIRECTORY,
            env_vars={"TMPDIR": JOB_DIRECTORY},
            conf={
                "spark.local.dir": JOB_DIRECTORY,
                "spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={JOB_DIRECTORY}",
                "spark.ui.enabled": "false",
            },
        ),
        stream_name=os.environ.get("KINESIS_STREAM", "apache-access-log"),
        consumer_name=os.environ.get("KINESIS_SPLIT_CONSUMER", "parquet-lake-split"),
        checkpoint_table=os.environ.get("KINESIS_CHECKPOINT_TABLE", "kinesis_spark_checkpoints"),
        output_path=os.environ.get("KINESIS_SPLIT_OUTPUT_PATH", "/tmp/kinesis_spark_output_split"),
        transform="airflow_kinesis_spark.transforms.apache_log:parse_combined_log",
        max_records_per_shard=100_000,
        aws_conn_id="aws_default",
    )


# [END howto_split_spark_submit]

kinesis_split()
