"""Example: split tasks with the batch's Spark job on EMR Serverless (amazon provider).

``kinesis_batch_task_group`` builds three tasks per batch:

* ``ingest.plan`` (``KinesisPlanBatchOperator``, on the Airflow worker) plans the batch, or
  re-uses the pending one, persists it in the checkpoint table and pushes the job's arguments
  (XCom ``job_arguments``: a list of strings, no credential among them).
* ``ingest.job`` (``EmrServerlessStartJobOperator``) starts a job run of ``kinesis_batch.py`` on
  the EMR Serverless application with those arguments as ``entryPointArguments`` and the
  package's Airflow-free code as ``--py-files``, and waits for it in the triggerer. The driver
  takes its batch from the checkpoint store (claim, lease, publish, report) with the job run's
  execution role: give that role the least policy of docs/platforms.md.
* ``ingest.commit`` (``KinesisCommitBatchOperator``, deferrable) waits in the triggerer until the
  job's report is in the store, checks it against the plan and advances every checkpoint in one
  conditional write. With no new records the plan task skips the job.

Upload the job first, one folder per package version (``KINESIS_SPARK_JOB_S3``)::

    kinesis-spark package build/kinesis-spark-job
    aws s3 cp build/kinesis-spark-job s3://my-bucket/kinesis-spark/0.1.0/ --recursive

The application's Python needs boto3, aws-kinesis-agg, protobuf and pyarrow (docs/platforms.md):
a custom image, or a packed virtual environment (``KINESIS_EMR_PYTHON_ARCHIVE``, used as
``spark.archives`` with its ``bin/python`` as the driver's and the executors' Python).

==========================  =============================================  ==========================================
variable                    meaning                                        default
==========================  =============================================  ==========================================
KINESIS_STREAM              stream name                                    apache-access-log
KINESIS_EMR_CONSUMER        consumer (application) name                    parquet-lake-emr
KINESIS_CHECKPOINT_TABLE    DynamoDB table of the checkpoints              kinesis_spark_checkpoints
KINESIS_EMR_OUTPUT_PATH     Parquet root (s3:// on EMR)                    s3://my-lake/access-log-emr
KINESIS_SPARK_JOB_S3        S3 folder of kinesis_batch.py and the zip      s3://my-bucket/kinesis-spark/{version}
EMR_SERVERLESS_APP_ID       the EMR Serverless application (Spark)         00fexampleapp0001
EMR_SERVERLESS_JOB_ROLE     the job run's execution role ARN               arn:aws:iam::123456789012:role/kinesis-batch-job
KINESIS_EMR_PYTHON_ARCHIVE  packed virtual environment (s3://...tar.gz)    (empty: the application's image has the packages)
==========================  =============================================  ==========================================
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.providers.amazon.aws.operators.emr import EmrServerlessStartJobOperator
from airflow.sdk import dag

import airflow_kinesis_spark
from airflow_kinesis_spark.operators.split import kinesis_batch_task_group

JOB_CODE = os.environ.get("KINESIS_SPARK_JOB_S3", f"s3://my-bucket/kinesis-spark/{airflow_kinesis_spark.__version__}").rstrip("/")
SCRIPT = f"{JOB_CODE}/kinesis_batch.py"
CODE_ZIP = f"{JOB_CODE}/airflow_kinesis_spark_core.zip"
PYTHON_ARCHIVE = os.environ.get("KINESIS_EMR_PYTHON_ARCHIVE", "")


def spark_submit_parameters() -> str:
    """``--py-files`` with the package zip; with a packed virtual environment, its Python for the
    driver and the executors (EMR Serverless user guide, "Using Python libraries")."""
    parameters = [f"--py-files {CODE_ZIP}"]
    if PYTHON_ARCHIVE:
        parameters += [
            f"--conf spark.archives={PYTHON_ARCHIVE}#environment",
            "--conf spark.emr-serverless.driverEnv.PYSPARK_DRIVER_PYTHON=./environment/bin/python",
            "--conf spark.emr-serverless.driverEnv.PYSPARK_PYTHON=./environment/bin/python",
            "--conf spark.executorEnv.PYSPARK_PYTHON=./environment/bin/python",
        ]
    return " ".join(parameters)


# [START howto_split_emr_serverless]
@dag(
    dag_id="kinesis_emr_serverless",
    schedule=timedelta(minutes=10),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    # retry_delay above the batch's lease_seconds (60 s): a retried job finds a dead driver's lease expired.
    default_args={"retries": 2, "retry_delay": timedelta(minutes=3)},
    tags=["kinesis", "spark", "emr-serverless", "example"],
)
def kinesis_emr_serverless():
    kinesis_batch_task_group(
        "ingest",
        job=lambda arguments: EmrServerlessStartJobOperator(
            task_id="job",
            application_id=os.environ.get("EMR_SERVERLESS_APP_ID", "00fexampleapp0001"),
            execution_role_arn=os.environ.get("EMR_SERVERLESS_JOB_ROLE", "arn:aws:iam::123456789012:role/kinesis-batch-job"),
            job_driver={
                "sparkSubmit": {
                    "entryPoint": SCRIPT,
                    "entryPointArguments": arguments,  # the plan task's XCom job_arguments, a list of strings
                    "sparkSubmitParameters": spark_submit_parameters(),
                }
            },
            name="kinesis-batch-{{ run_id }}",
            wait_for_completion=True,
            deferrable=True,  # wait for the job run in the triggerer
            waiter_delay=30,
            waiter_max_attempts=120,  # one hour
            aws_conn_id="aws_default",
        ),
        stream_name=os.environ.get("KINESIS_STREAM", "apache-access-log"),
        consumer_name=os.environ.get("KINESIS_EMR_CONSUMER", "parquet-lake-emr"),
        checkpoint_table=os.environ.get("KINESIS_CHECKPOINT_TABLE", "kinesis_spark_checkpoints"),
        output_path=os.environ.get("KINESIS_EMR_OUTPUT_PATH", "s3://my-lake/access-log-emr"),
        transform="airflow_kinesis_spark.transforms.apache_log:parse_combined_log",
        max_records_per_shard=100_000,
        deferrable=True,  # the commit task waits in the triggerer until the job's report is recorded
        # a job run may wait in the application's queue before its driver claims the batch
        commit_kwargs={"job_start_timeout": 1800.0, "poke_interval": 15.0},
        aws_conn_id="aws_default",
    )


# [END howto_split_emr_serverless]

kinesis_emr_serverless()
