"""The provider's settings from Airflow's configuration, each read when a task, sensor or trigger
runs (never when a DAG file is parsed), in one place.

* ``[operators] default_deferrable`` (Airflow's): what ``deferrable=None`` means
  (:func:`deferral_requested`);
* ``[kinesis_spark]`` (the provider's, declared in ``get_provider_info``, so ``airflow config
  list`` shows them): ``transform_allowed_modules`` (:func:`transform_allowed_modules`),
  ``describe_stream_summary_per_second`` and ``shared_state_dir`` (:func:`summary_budget_settings`).
"""

from __future__ import annotations

from airflow.sdk.configuration import conf

from airflow_kinesis_spark.core.stream_summary import DEFAULT_CALLS_PER_SECOND
from airflow_kinesis_spark.core.transform import parse_allowed_modules

__all__ = ["SECTION", "deferral_requested", "summary_budget_settings", "transform_allowed_modules"]

#: The provider's section of the Airflow configuration.
SECTION = "kinesis_spark"


def deferral_requested(deferrable: bool | None) -> bool:
    """Whether a task asked to defer: ``deferrable`` as given, or, for ``None``, Airflow's
    ``[operators] default_deferrable`` (``False`` when unset).

    Whether the run can defer (its Spark connection) is the operator's to check.
    """
    if deferrable is None:
        return conf.getboolean("operators", "default_deferrable", fallback=False)
    return deferrable


def transform_allowed_modules() -> tuple[str, ...]:
    """``[kinesis_spark] transform_allowed_modules``: the module prefixes a transform may come from
    (``()``: not set, any module outside Python's standard library).

    :raises ValueError: an entry is not a module name, or is in the standard library.
    """
    return parse_allowed_modules(conf.get(SECTION, "transform_allowed_modules", fallback="") or "")


def summary_budget_settings() -> tuple[float, str | None]:
    """``([kinesis_spark] describe_stream_summary_per_second, shared_state_dir)``: the calls per
    second this host starts at most (default
    :data:`~airflow_kinesis_spark.core.stream_summary.DEFAULT_CALLS_PER_SECOND`) and the
    directory of the host's shared cache and pacer (``None``: the default one).

    :raises AirflowConfigException: the rate is not a number (Airflow's ``getfloat``).
    """
    rate = conf.getfloat(SECTION, "describe_stream_summary_per_second", fallback=DEFAULT_CALLS_PER_SECOND)
    return rate, conf.get(SECTION, "shared_state_dir", fallback="") or None
