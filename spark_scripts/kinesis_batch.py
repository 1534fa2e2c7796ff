"""The PySpark job's entry point: the application spark-submit (and a cluster's job task: EMR,
Glue, Databricks, Kubernetes, ...) runs for one Kinesis batch::

    kinesis_batch.py --checkpoint-table T --stream S --consumer C --batch-id N --lease-owner O
                     [--lease-seconds 60] [--records-expected] [--region R] [--transform module:function]

The job itself is the Airflow-free package ``airflow_kinesis_spark.job`` (its command line:
``airflow_kinesis_spark.job.cli``), which comes with the package zip on ``--py-files``
(``kinesis-spark package``, ``hooks.spark_package.core_zip``) or with the installed package.
"""

from __future__ import annotations

import sys

from airflow_kinesis_spark.job import main

if __name__ == "__main__":
    sys.exit(main())
