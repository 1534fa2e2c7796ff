"""The CLI's storage options for an s3:// output root come from one function with the operators'
(sinks.files.aws_storage_options): --endpoint-url reaches them (it was dropped: the leftovers
command then listed the real S3 instead of the emulator the other commands used)."""

from __future__ import annotations

import click

from airflow_kinesis_spark.cli.leftovers import _storage_options


def context(**opts: object) -> click.Context:
    ctx = click.Context(click.Command("kinesis-spark"))
    ctx.obj = {"endpoint_url": None, "region": "eu-west-1", "profile": None, "aws_conn_id": None, "verbose": False, **opts}
    return ctx


def test_the_endpoint_url_reaches_the_storage_options(monkeypatch):
    monkeypatch.delenv("AWS_CA_BUNDLE", raising=False)  # the chain's CA bundle is the next test's
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    options = _storage_options(context(endpoint_url="http://127.0.0.1:4566"), "s3://lake/out", {})
    assert options == {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret", "AWS_REGION": "eu-west-1",
                       "AWS_ENDPOINT_URL": "http://127.0.0.1:4566", "AWS_ALLOW_HTTP": "true"}  # fmt: skip
    assert _storage_options(context(), "s3://lake/out", {"AWS_REGION": "us-east-2"})["AWS_REGION"] == "us-east-2"
    assert _storage_options(context(endpoint_url="http://127.0.0.1:4566"), "/data/out", {}) is None


def test_a_connection_s_ca_bundle_reaches_the_storage_options(monkeypatch, tmp_path):
    """--aws-conn-id's ``verify`` extra (a CA bundle's path) becomes AWS_CA_BUNDLE, which this
    package's pyarrow access to the output trusts (sinks.files.filesystem)."""
    import json

    bundle = tmp_path / "ca.pem"
    bundle.write_text("")
    extra = {"endpoint_url": "https://127.0.0.1:4566", "verify": str(bundle), "region_name": "eu-west-1"}
    monkeypatch.setenv("AIRFLOW_CONN_LAKE", json.dumps({"conn_type": "aws", "login": "AKIDEXAMPLE", "password": "secret", "extra": extra}))
    options = _storage_options(context(aws_conn_id="lake"), "s3://lake/out", {})
    assert options is not None and options["AWS_CA_BUNDLE"] == str(bundle) and options["AWS_ENDPOINT_URL"] == "https://127.0.0.1:4566"


def test_boto3_s_ca_bundle_reaches_the_storage_options(monkeypatch, tmp_path):
    """Without --aws-conn-id, the chain's CA bundle (AWS_CA_BUNDLE, or a profile's ca_bundle), which
    the command's boto3 clients trust, is the output's too."""
    bundle = tmp_path / "ca.pem"
    bundle.write_text("")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv("AWS_CA_BUNDLE", str(bundle))
    options = _storage_options(context(endpoint_url="https://127.0.0.1:4566"), "s3://lake/out", {})
    assert options is not None and options["AWS_CA_BUNDLE"] == str(bundle)
    config = tmp_path / "config"
    config.write_text(f"[profile lake]\nregion = eu-west-1\nca_bundle = {bundle}\n")
    monkeypatch.delenv("AWS_CA_BUNDLE")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    options = _storage_options(context(profile="lake"), "s3://lake/out", {})
    assert options is not None and options["AWS_CA_BUNDLE"] == str(bundle)
