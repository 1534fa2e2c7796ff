"""Provider metadata read by Airflow's ProvidersManager (``apache_airflow_provider`` entry point)."""

from __future__ import annotations

from typing import Any

from airflow_kinesis_spark import __version__


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-kinesis-spark",
        "name": "Kinesis to Spark",
        "description": "Exactly-once, bounded Amazon Kinesis Data Streams to PySpark micro-batches "
        "with atomic DynamoDB checkpoints.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "Amazon Kinesis Data Streams to Spark",
                "external-doc-url": "https://docs.aws.amazon.com/kinesis/latest/APIReference/Welcome.html",
                "tags": ["aws", "apache"],
            }
        ],
        "operators": [
            {
                "integration-name": "Amazon Kinesis Data Streams to Spark",
                "python-modules": [
                    "airflow_kinesis_spark.operators.kinesis_to_spark",
                    "airflow_kinesis_spark.operators.window",
                    "airflow_kinesis_spark.operators.checkpoints",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": "Amazon Kinesis Data Streams to Spark",
                "python-modules": ["airflow_kinesis_spark.sensors.kinesis"],
            }
        ],
        "triggers": [
            {
                "integration-name": "Amazon Kinesis Data Streams to Spark",
                "python-modules": ["airflow_kinesis_spark.triggers.kinesis"],
            }
        ],
        "hooks": [
            {
                "integration-name": "Amazon Kinesis Data Streams to Spark",
                "python-modules": ["airflow_kinesis_spark.hooks.kinesis", "airflow_kinesis_spark.hooks.dynamodb"],
            }
        ],
        "config": {
            "kinesis_spark": {
                "description": "Settings of the Kinesis to Spark provider, for the Airflow deployment (not the DAGs).\n",
                "options": {
                    "transform_allowed_modules": {
                        "description": "Comma-separated module prefixes a ``transform`` may come from: a module is "
                        "allowed when it is a listed one or inside it (``my_company`` allows\n"
                        "``my_company.kinesis``, not ``my_company_other``). Checked on the worker before the "
                        "module is imported, and again for the module that\ndefines the function. The "
                        "provider's own ``airflow_kinesis_spark.transforms`` is always allowed; Python's "
                        "standard library\nnever is. Empty: any module outside the standard library.\n",
                        "version_added": None,
                        "type": "string",
                        "example": "my_company.kinesis_transforms,team_b.transforms",
                        "default": "",
                    },
                    "describe_stream_summary_per_second": {
                        "description": "DescribeStreamSummary calls this host starts per second at most, per endpoint, "
                        "shared by every process of the host\n(the resharding and retention sensors' pokes and their triggers) "
                        "through a file under ``shared_state_dir``. The service allows 20 a second per\naccount: keep "
                        "hosts x this value under 20.\n",
                        "version_added": None,
                        "type": "float",
                        "example": "5",
                        "default": "10",
                    },
                    "shared_state_dir": {
                        "description": "Directory of the host's shared DescribeStreamSummary cache and pacer (created "
                        "with mode 0700; it must belong to\nthe user Airflow runs as). Empty: "
                        "``airflow-kinesis-spark-<uid>`` in the system's temporary directory.\n",
                        "version_added": None,
                        "type": "string",
                        "example": "/var/run/airflow-kinesis-spark",
                        "default": "",
                    },
                },
            },
        },
    }
