"""Unit tests of the Spark runners' security helpers (no Spark, no network)."""

from __future__ import annotations

import json
import stat
import uuid

import pytest

from airflow_kinesis_spark.core.job import JobArguments

from airflow_kinesis_spark.hooks.kinesis import job_session_policy
from airflow_kinesis_spark.hooks.spark import SparkSubmitJob
from airflow_kinesis_spark.hooks.spark_connect import (
    DEFAULT_UNRESPONSIVE_TIMEOUT,
    SparkConnectJob,
    check_connect_transport,
    connect_session_id,
    session_secret,
    unresponsive_timeout,
    worker_secret_path,
)
from airflow_kinesis_spark.hooks.spark_settings import SparkJobSettings


def test_a_session_id_cannot_be_derived_without_the_secret():
    names = ("KinesisToSparkOperator", "orders", "lake")
    mine = connect_session_id(b"worker-a secret", *names)
    assert mine == connect_session_id(b"worker-a secret", *names)  # stable: reused across batches
    assert mine != connect_session_id(b"worker-b secret", *names)  # another secret, another id
    assert mine != connect_session_id(b"worker-a secret", "KinesisToSparkOperator", "orders", "other")
    # earlier versions: a uuid5 of the names, which anyone could compute
    assert mine != str(uuid.uuid5(uuid.UUID("6d2f3c1e-8a4b-4f0e-9c57-1b2a3d4e5f60"), "/".join(names)))
    assert uuid.UUID(mine).version == 4


def test_the_worker_secret_is_made_once_and_private(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW_KINESIS_SPARK_STATE_DIR", str(tmp_path / "state"))
    first = session_secret()
    assert len(first) == 32 and session_secret() == first
    assert stat.S_IMODE(worker_secret_path().stat().st_mode) == 0o600
    assert session_secret("from the connection") == b"from the connection"


@pytest.mark.parametrize("url", ["sc://127.0.0.1:15002/", "sc://localhost:15002/", "sc://[::1]:15002/",
                                 "sc://spark.example:443/;use_ssl=true", "sc://spark.example:443/;token=abc"])  # fmt: skip
def test_loopback_or_tls_servers_may_receive_credentials(url):
    check_connect_transport(url, "spark_connect_default")


def test_a_plaintext_remote_server_is_refused_unless_allowed():
    with pytest.raises(ValueError, match=r"sc://10\.0\.0\.5:15002 of connection 'c' over plaintext gRPC.*use_ssl"):
        check_connect_transport("sc://10.0.0.5:15002/", "c")
    check_connect_transport("sc://10.0.0.5:15002/", "c", allow_insecure=True)


def test_the_session_policy_allows_reading_one_stream_only():
    policy = job_session_policy("orders", "eu-west-1", "aws")
    json.dumps(policy)
    kinesis, fan_out, kms = policy["Statement"]
    assert sorted(kinesis["Action"]) == ["kinesis:DescribeStreamSummary", "kinesis:GetRecords", "kinesis:GetShardIterator", "kinesis:ListShards"]
    assert kinesis["Resource"] == ["arn:aws:kinesis:eu-west-1:*:stream/orders"]
    assert sorted(fan_out["Action"]) == ["kinesis:DescribeStreamConsumer", "kinesis:SubscribeToShard"]
    assert fan_out["Resource"] == ["arn:aws:kinesis:eu-west-1:*:stream/orders/consumer/*"]  # its consumers only
    shared = job_session_policy("arn:aws:kinesis:eu-west-1:111122223333:stream/orders", "eu-west-1", "aws")["Statement"]
    assert shared[0]["Resource"] == ["arn:aws:kinesis:eu-west-1:111122223333:stream/orders"]  # a given ARN as it is
    assert kms["Action"] == ["kms:Decrypt"] and kms["Condition"] == {"StringEquals": {"kms:ViaService": "kinesis.eu-west-1.amazonaws.com"}}


def test_an_s3_output_location_may_be_written_and_nothing_else():
    policy = job_session_policy("orders", "eu-west-1", "aws", output_location="s3a://lake/orders/batch_id=7")
    objects, bucket, kms = policy["Statement"][3:]
    # the batch directory and its staging directories (core.job.staging_location): `*` spans `/`
    assert objects["Resource"] == ["arn:aws:s3:::lake/orders/batch_id=7", "arn:aws:s3:::lake/orders/batch_id=7/*",
                                   "arn:aws:s3:::lake/orders/_staging/batch_id=7-*"]
    assert "s3:PutObject" in objects["Action"] and bucket == {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": ["arn:aws:s3:::lake"]}
    assert kms["Condition"] == {"StringEquals": {"kms:ViaService": "s3.eu-west-1.amazonaws.com"}}
    assert len(job_session_policy("orders", "eu-west-1", output_location="/local/out/batch_id=7")["Statement"]) == 3


def test_a_job_that_takes_its_batch_from_the_store_may_touch_its_consumers_items_only():
    policy = job_session_policy("orders", "eu-west-1", "aws", checkpoint_table="ckpt", store_key="orders|etl")
    table = policy["Statement"][-1]
    assert sorted(table["Action"]) == ["dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Query", "dynamodb:UpdateItem"]
    assert table["Resource"] == ["arn:aws:dynamodb:eu-west-1:*:table/ckpt"]
    assert table["Condition"] == {"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": ["orders|etl"]}}
    assert "dynamodb:DeleteItem" not in json.dumps(policy) and "dynamodb:Scan" not in json.dumps(policy)


def test_the_connect_servers_unresponsive_timeout_is_a_number_of_seconds():
    assert unresponsive_timeout({}, "c") == DEFAULT_UNRESPONSIVE_TIMEOUT == 60.0
    assert unresponsive_timeout({"unresponsive_timeout": 12}, "c") == unresponsive_timeout({"unresponsive_timeout": "12"}, "c") == 12.0
    for bad in (0, -5, "soon", True, float("inf"), float("nan"), [30]):
        with pytest.raises(ValueError, match=r"spark_connect connection 'c': extra 'unresponsive_timeout' must be a number of seconds > 0"):
            unresponsive_timeout({"unresponsive_timeout": bad}, "c")


def test_a_connect_session_is_kept_across_batches_only_on_request():
    assert SparkJobSettings(spark_conn_id="spark_default", kinesis_hook=None).reuse_connect_session is False


class _RecordingSubmitHook:
    """Stands in for ``BatchSparkSubmitHook``: keeps its arguments."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs


class _RegionOnly:
    """``job_credentials='none'``: the job's environment names the region only."""

    def spark_environment(self, credentials):
        assert credentials is None
        return {"AWS_DEFAULT_REGION": "eu-west-1"}


@pytest.mark.parametrize(("transform", "allowed", "expected"), [
    ("my_co.kinesis.clean:parse", ("my_co.kinesis", "team_b"),
     ["--transform", "my_co.kinesis.clean:parse", "--transform-allowed-modules", "my_co.kinesis,team_b"]),
    ("my_co.kinesis.clean:parse", (), ["--transform", "my_co.kinesis.clean:parse"]),
    (None, ("my_co.kinesis",), []),
])  # fmt: skip
def test_spark_submit_gives_the_job_the_transform_allow_list(monkeypatch, tmp_path, transform, allowed, expected):
    from airflow_kinesis_spark.hooks import spark_submit

    monkeypatch.setattr(spark_submit, "BatchSparkSubmitHook", _RecordingSubmitHook)
    settings = SparkJobSettings(spark_conn_id="spark_default", kinesis_hook=_RegionOnly(), transform=transform,
                                transform_allowed_modules=allowed, job_credentials="none")  # fmt: skip
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", "spark://local%5B2%5D")  # a local master (no lookup of a missing one)
    from airflow_kinesis_spark.hooks.spark_submit import spark_connection

    arguments = JobArguments(checkpoint_table="kinesis_checkpoints", stream_name="orders", consumer_name="lake", batch_id=7,
                             lease_owner="plan-task", lease_seconds=60)  # fmt: skip
    job = SparkSubmitJob(settings)._job(spark_connection("spark_default"), arguments, str(tmp_path / "core.zip"), None)
    hook = job.hook()
    assert hook.kwargs["application_args"] == [*arguments.to_args(), *settings.read_options.job_args(False), *expected]


def test_the_connect_runner_checks_the_transform_against_the_allow_list(monkeypatch):
    from airflow_kinesis_spark.core import transform as transforms

    calls = []

    def resolve(spec, allowed_modules=None):
        calls.append((spec, allowed_modules))
        raise LookupError("stopped before any connection")

    monkeypatch.setattr(transforms, "resolve_transform", resolve)
    settings = SparkJobSettings(spark_conn_id="spark_connect_default", kinesis_hook=None,
                                transform="my_co.kinesis.clean:parse", transform_allowed_modules=("my_co.kinesis",))  # fmt: skip
    with pytest.raises(LookupError, match="stopped before any connection"):
        SparkConnectJob(settings).run_handed(JobArguments(checkpoint_table="t_ckpt", stream_name="s", consumer_name="c",
                                                          batch_id=1, lease_owner="run-1", lease_seconds=60))  # fmt: skip
    assert calls == [("my_co.kinesis.clean:parse", ("my_co.kinesis",))]
