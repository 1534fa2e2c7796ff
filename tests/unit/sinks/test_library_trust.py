"""``sinks.files.check_library_trust`` sends nothing when there is nothing to check: no CA bundle
in the storage options, or a local location (the HTTPS cases run against a server in
tests/integration/test_aws_arguments.py)."""

from __future__ import annotations

from airflow_kinesis_spark.sinks.files import CA_BUNDLE_OPTION, aws_storage_options, check_library_trust

# An endpoint nothing listens on (TEST-NET-1, RFC 5737): a request to it would hang or fail.
NOWHERE = {"AWS_ENDPOINT_URL": "https://192.0.2.1:9", "AWS_REGION": "eu-west-1"}


def test_without_a_ca_bundle_or_for_a_local_location_nothing_is_asked(tmp_path, monkeypatch):
    import pyarrow.fs

    def no_request(*_args, **_kwargs):
        raise AssertionError("check_library_trust built an S3 filesystem")

    monkeypatch.setattr(pyarrow.fs, "S3FileSystem", no_request)
    check_library_trust("s3://lake/out", NOWHERE, "delta-rs")
    check_library_trust(str(tmp_path), {**NOWHERE, CA_BUNDLE_OPTION: "/ca.pem"}, "pyiceberg")


def test_verify_becomes_the_ca_bundle_option_only_when_it_is_a_path():
    assert aws_storage_options(None, "eu-west-1", None, "/etc/ca.pem")[CA_BUNDLE_OPTION] == "/etc/ca.pem"
    assert CA_BUNDLE_OPTION not in aws_storage_options(None, "eu-west-1", None, False)
    assert CA_BUNDLE_OPTION not in aws_storage_options(None, "eu-west-1", None, None)

