"""The AWS arguments every operator and sensor takes from one base (``KinesisAwsBaseOperator``):
``aws_conn_id``, ``region_name``, ``verify``, ``botocore_config``, as the amazon provider's
operators take them, filled by a DAG's ``default_args``, and passed on to the triggers and (a CA
bundle's path) to the Spark job.

``verify`` is exercised for real: moto's server over HTTPS on 127.0.0.1 with a certificate of a
private CA made here, which botocore's own CA bundle does not trust.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from airflow.sdk import DAG

from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from airflow_kinesis_spark.exceptions import EndpointUnreachableError
from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator
from airflow_kinesis_spark.operators.settings import ReadOptions
from airflow_kinesis_spark.operators.checkpoints import KinesisDiscardPendingBatchOperator
from airflow_kinesis_spark.operators.split import kinesis_batch_task_group
from airflow_kinesis_spark.sensors.kinesis import KinesisShardLagSensor
from airflow_kinesis_spark.triggers.kinesis import KinesisShardLagTrigger
from demo.producer import committed_rows, put_plain
from demo.producer import verify as verify_rows
from demo.stack import BIN, free_port
from tests.conftest import REGION, TEST_ACCESS_KEY, TEST_SECRET_KEY, _start, aws_connection, create_stream

pytestmark = pytest.mark.integration

CONSUMER = dict(stream_name="orders", consumer_name="lake", checkpoint_table="orders_ckpt")


def private_ca_certificate(folder: Path) -> tuple[Path, Path, Path]:
    """``(CA bundle, server certificate, server key)``: a CA of its own and a certificate it
    signed for 127.0.0.1 (PEM files in ``folder``)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    import ipaddress

    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test private CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
          .not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(ca_key, hashes.SHA256()))  # fmt: skip
    paths = folder / "ca.pem", folder / "server.pem", folder / "server-key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))  # fmt: skip
    return paths


@pytest.fixture(scope="module")
def https_moto(tmp_path_factory) -> Iterator[tuple[str, Path]]:
    """moto's server over HTTPS with a private CA's certificate: ``(endpoint, CA bundle)``."""
    ca, cert, key = private_ca_certificate(tmp_path_factory.mktemp("tls"))
    port = free_port()
    proc = _start([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port), "-c", str(cert), "-k", str(key)],
                  port, "moto server (https)")  # fmt: skip
    try:
        yield f"https://127.0.0.1:{port}", ca
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def https_conn(monkeypatch, https_moto) -> tuple[str, Path]:
    endpoint, ca = https_moto
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", aws_connection(endpoint))
    return endpoint, ca


def test_verify_reaches_the_clients_of_operators_and_sensors(https_conn):
    _, ca = https_conn
    with DAG("aws_arguments", schedule=None, start_date=dt.datetime(2026, 1, 1)):
        untrusted = KinesisShardLagSensor(task_id="untrusted", **CONSUMER)
        trusted = KinesisShardLagSensor(task_id="trusted", verify=str(ca), **CONSUMER)
        unchecked = KinesisDiscardPendingBatchOperator(task_id="unchecked", verify=False, **CONSUMER)
    with pytest.raises(EndpointUnreachableError, match="CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        untrusted.kinesis_hook.conn  # botocore's CA bundle does not trust the private CA
    assert trusted.kinesis_hook.conn.list_streams()["StreamNames"] == []
    assert trusted.checkpoint_hook.conn.list_tables()["TableNames"] == []
    assert unchecked.kinesis_hook.conn.list_streams()["StreamNames"] == []


def test_default_args_fill_the_aws_arguments_and_botocore_config_reaches_the_clients(https_conn):
    _, ca = https_conn
    config = {"read_timeout": 7, "retries": {"mode": "standard", "max_attempts": 2}}
    default_args = {"verify": str(ca), "botocore_config": config, "region_name": "eu-west-1"}
    with DAG("aws_default_args", schedule=None, start_date=dt.datetime(2026, 1, 1), default_args=default_args):
        sensor = KinesisShardLagSensor(task_id="lag", **CONSUMER)
        group = kinesis_batch_task_group("batch", job=lambda arguments: KinesisShardLagSensor(task_id="job", **CONSUMER),
                                         output_path="/unused", **CONSUMER)  # fmt: skip
    tasks = [sensor, group.children["batch.plan"], group.children["batch.commit"]]
    assert [(t.verify, t.botocore_config, t.region_name) for t in tasks] == [(str(ca), config, "eu-west-1")] * 3
    client = sensor.kinesis_hook.conn
    assert client.meta.config.read_timeout == 7 and client.meta.config.retries == {"mode": "standard", "total_max_attempts": 3}  # botocore counts the first call
    assert client.meta.region_name == "eu-west-1"
    assert client.list_streams()["StreamNames"] == []


def test_triggers_carry_the_aws_arguments_and_use_them(https_conn):
    _, ca = https_conn
    with DAG("aws_trigger", schedule=None, start_date=dt.datetime(2026, 1, 1)):
        sensor = KinesisShardLagSensor(task_id="lag", verify=str(ca), botocore_config={"read_timeout": 9}, **CONSUMER)
    trigger = sensor.trigger()
    path, kwargs = trigger.serialize()
    assert (kwargs["verify"], kwargs["botocore_config"]) == (str(ca), {"read_timeout": 9})
    rebuilt = KinesisShardLagTrigger(**kwargs)  # as the triggerer builds it from the serialized form

    async def list_streams() -> tuple[list[str], int]:
        async with rebuilt._clients() as (kinesis, dynamodb):
            return (await kinesis.list_streams())["StreamNames"], kinesis.meta.config.read_timeout

    assert asyncio.run(list_streams()) == ([], 9)


def test_a_ca_bundle_path_goes_to_the_spark_job_and_verify_false_is_said_not_to(https_conn, caplog, capfd):
    _, ca = https_conn
    with DAG("aws_job_env", schedule=None, start_date=dt.datetime(2026, 1, 1)):
        trusted = KinesisShardLagSensor(task_id="trusted", verify=str(ca), **CONSUMER)
        unchecked = KinesisShardLagSensor(task_id="unchecked", verify=False, **CONSUMER)
    assert trusted.kinesis_hook.spark_environment()["AWS_CA_BUNDLE"] == str(ca)
    assert "AWS_CA_BUNDLE" not in unchecked.kinesis_hook.spark_environment()
    captured = capfd.readouterr()  # Airflow's task logging writes to the process's streams
    assert "verify=False applies to this task's AWS clients, not to the Spark job's" in caplog.text + captured.out + captured.err


@pytest.mark.spark
@pytest.mark.slow
def test_a_batch_is_read_over_tls_with_the_ca_bundle_it_was_given(https_conn, tmp_path, unique_name):
    """End to end: spark-submit, the job's Kinesis and DynamoDB clients (from its environment) trust
    the private CA through AWS_CA_BUNDLE, and the batch is committed exactly once."""
    endpoint, ca = https_conn
    kinesis = boto3.client("kinesis", endpoint_url=endpoint, verify=str(ca), region_name=REGION,
                           aws_access_key_id=TEST_ACCESS_KEY, aws_secret_access_key=TEST_SECRET_KEY)  # fmt: skip
    dynamodb = boto3.client("dynamodb", endpoint_url=endpoint, verify=str(ca), region_name=REGION,
                            aws_access_key_id=TEST_ACCESS_KEY, aws_secret_access_key=TEST_SECRET_KEY)  # fmt: skip
    create_stream(kinesis, unique_name, 2)
    produced = put_plain(kinesis, unique_name, [(f"k{i}", f"tls {i}".encode()) for i in range(30)])
    output = tmp_path / "out"
    task = KinesisToSparkOperator(task_id="ingest", stream_name=unique_name, consumer_name="tls",
                                  checkpoint_table=f"{unique_name}_ckpt", output_path=str(output), read_options=ReadOptions(min_call_interval=0.0),
                                  verify=str(ca))  # fmt: skip
    summary = task.execute({})
    assert summary["status"] == "committed" and summary["records"] == 30
    store = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_ckpt", unique_name, "tls")
    verdict = verify_rows(produced, committed_rows(output, store.head().committed_batch_id))
    assert verdict.ok, verdict
