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
import os
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from airflow.exceptions import AirflowFailException
from airflow.sdk import DAG

from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from airflow_kinesis_spark.exceptions import EndpointUnreachableError, OutputTrustError
from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator
from airflow_kinesis_spark.operators.settings import OutputSettings, ReadOptions
from airflow_kinesis_spark.sinks.files import read_text, write_text
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


# -- verify and the output's S3 endpoint --------------------------------------------------------

TABLE_LIBRARIES = {"delta": "delta-rs", "iceberg": "pyiceberg"}


def _s3(endpoint: str, ca: Path):
    return boto3.client("s3", endpoint_url=endpoint, verify=str(ca), region_name=REGION,
                        aws_access_key_id=TEST_ACCESS_KEY, aws_secret_access_key=TEST_SECRET_KEY)  # fmt: skip


def _output_settings(fmt: str, folder: Path) -> OutputSettings:
    if fmt == "iceberg":
        return OutputSettings(format="iceberg", table="lake.events", catalog_properties={"type": "sql", "uri": f"sqlite:///{folder}/catalog.db"})
    return OutputSettings(format=fmt)


def test_the_output_s_own_file_access_trusts_verify_s_ca_bundle(https_conn, tmp_path, unique_name):
    """The operator's storage options carry verify's path (AWS_CA_BUNDLE); this package's own
    pyarrow access to the S3 output (owner records, file listing) trusts it, and without it the
    same access fails on the private CA."""
    endpoint, ca = https_conn
    _s3(endpoint, ca).create_bucket(Bucket=unique_name)
    task = KinesisToSparkOperator(task_id="ingest", stream_name=unique_name, consumer_name="lake", checkpoint_table=f"{unique_name}_ckpt",
                                  output_path=f"s3://{unique_name}/out", verify=str(ca))  # fmt: skip
    options = task.sink.storage_options
    assert options["AWS_CA_BUNDLE"] == str(ca) and options["AWS_ENDPOINT_URL"] == endpoint
    write_text(f"s3://{unique_name}/out/marker.json", "{}", options)
    assert read_text(f"s3://{unique_name}/out/marker.json", options) == "{}"
    without = {k: v for k, v in options.items() if k != "AWS_CA_BUNDLE"}
    with pytest.raises(OSError, match="curlCode: 60"):
        read_text(f"s3://{unique_name}/out/marker.json", without)


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_a_table_library_that_cannot_take_the_ca_bundle_is_named_before_anything_is_read(https_conn, monkeypatch, tmp_path, unique_name, fmt):
    """delta-rs and pyiceberg take no CA bundle: with verify's private CA and no SSL_CERT_FILE, the
    run fails before its job, naming the library and the fix; nothing is read or written."""
    endpoint, ca = https_conn
    s3 = _s3(endpoint, ca)
    s3.create_bucket(Bucket=unique_name)
    kinesis = boto3.client("kinesis", endpoint_url=endpoint, verify=str(ca), region_name=REGION,
                           aws_access_key_id=TEST_ACCESS_KEY, aws_secret_access_key=TEST_SECRET_KEY)  # fmt: skip
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [("k", b"a")])
    task = KinesisToSparkOperator(task_id="ingest", stream_name=unique_name, consumer_name="lake", checkpoint_table=f"{unique_name}_ckpt",
                                  output_path=f"s3://{unique_name}/out", output_settings=_output_settings(fmt, tmp_path),
                                  verify=str(ca))  # fmt: skip
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)  # a worker without it
    with pytest.raises(AirflowFailException) as info:
        task.execute({})
    cause = info.value.__cause__
    assert isinstance(cause, OutputTrustError) and not cause.retryable
    assert (cause.library, cause.endpoint, cause.ca_bundle) == (TABLE_LIBRARIES[fmt], endpoint, str(ca))
    assert f"Set SSL_CERT_FILE={ca} in the environment of the workers that run this task" in str(cause)
    assert s3.list_objects_v2(Bucket=unique_name).get("KeyCount", 0) == 0  # no owner record, no file
    dynamodb = boto3.client("dynamodb", endpoint_url=endpoint, verify=str(ca), region_name=REGION,
                            aws_access_key_id=TEST_ACCESS_KEY, aws_secret_access_key=TEST_SECRET_KEY)  # fmt: skip
    head = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_ckpt", unique_name, "lake").head()
    assert head.committed_batch_id == 0 and head.pending_batch_id is None  # no plan


_WITH_SSL_CERT_FILE = """
import sys
import pyarrow as pa
from airflow_kinesis_spark.sinks.build import build_sink
from airflow_kinesis_spark.sinks.files import check_library_trust
fmt, location, options, catalog = sys.argv[1], sys.argv[2], dict(a.split("=", 1) for a in sys.argv[4:]), sys.argv[3]
iceberg = {"table": "lake.events", "catalog_properties": {"type": "sql", "uri": catalog}} if fmt == "iceberg" else {}
sink = build_sink(fmt, location, storage_options=options, stream_name="s", consumer_name="c", **iceberg)
check_library_trust(location, options, sink.library)
rows = pa.table({"n": [1, 2, 3]})
if fmt == "delta":
    import deltalake
    deltalake.write_deltalake(location, rows, storage_options=options)
    print(sink.load().to_pyarrow_table().num_rows)
else:
    catalog = sink.catalog()
    catalog.create_namespace_if_not_exists("lake")
    table = catalog.create_table("lake.events", schema=rows.schema, location=location)
    table.append(rows)
    print(catalog.load_table("lake.events").scan().to_arrow().num_rows)
# The work is done and printed. Leave without the interpreter's teardown: pyarrow's S3 client can
# abort there now and then ("terminate called without an active exception", apache/arrow#34314).
sys.stdout.flush()
import os
os._exit(0)
"""


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_the_fix_the_error_names_works_ssl_cert_file_makes_the_table_library_trust_the_ca(https_conn, tmp_path, unique_name, fmt):
    """The fix OutputTrustError names, for real: in a worker process whose SSL_CERT_FILE is the CA
    bundle, the check passes and the table library writes and reads the table over TLS; in one
    without it, the library itself fails on the certificate (what the check finds first)."""
    import subprocess
    import sys

    endpoint, ca = https_conn
    _s3(endpoint, ca).create_bucket(Bucket=unique_name)
    options = {"AWS_ACCESS_KEY_ID": TEST_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": TEST_SECRET_KEY, "AWS_REGION": REGION,
               "AWS_ENDPOINT_URL": endpoint, "AWS_CA_BUNDLE": str(ca), "AWS_S3_ALLOW_UNSAFE_RENAME": "true"}  # fmt: skip
    command = [sys.executable, "-c", _WITH_SSL_CERT_FILE, fmt, f"s3://{unique_name}/{fmt}", f"sqlite:///{tmp_path}/catalog.db",
               *(f"{k}={v}" for k, v in options.items())]  # fmt: skip
    environment = {k: v for k, v in os.environ.items() if k != "SSL_CERT_FILE"}
    trusted = subprocess.run(command, env={**environment, "SSL_CERT_FILE": str(ca)}, capture_output=True, text=True, timeout=300)
    assert trusted.returncode == 0, trusted.stderr[-3000:]
    assert trusted.stdout.split()[-1] == "3"
    untrusted = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=300)
    assert untrusted.returncode != 0 and "OutputTrustError" in untrusted.stderr, untrusted.stderr[-3000:]


def test_an_iceberg_glue_catalog_uses_the_connection_s_glue_client_verify_included(https_conn, tmp_path, unique_name):
    """A Glue catalog without client settings of its own talks to Glue through the operator's
    connection: its endpoint, and verify's CA bundle (pyiceberg's own client would not have it)."""
    endpoint, ca = https_conn

    def task(**aws):
        settings = OutputSettings(format="iceberg", table=f"{unique_name}.events", catalog_properties={"type": "glue"})
        return KinesisToSparkOperator(task_id="ingest", stream_name=unique_name, consumer_name="lake", checkpoint_table=f"{unique_name}_ckpt",
                                      output_path=str(tmp_path / "lake"), output_settings=settings, **aws)  # fmt: skip

    catalog = task(verify=str(ca), botocore_config={"read_timeout": 11}).sink.catalog()
    assert (catalog.glue.meta.endpoint_url, catalog.glue.meta.config.read_timeout) == (endpoint, 11)
    catalog.create_namespace(unique_name)
    assert (unique_name,) in catalog.list_namespaces()
    from botocore.exceptions import SSLError

    with pytest.raises(SSLError, match="CERTIFICATE_VERIFY_FAILED"):
        task().sink.catalog().list_namespaces()  # the same connection without the CA bundle
