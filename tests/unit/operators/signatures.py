"""The keyword parameters an operator takes, collected through its MRO: an operator's own
``__init__`` names only what it adds, the rest comes from its bases (``operators.base``,
the settings mixins, ``KinesisAwsBaseOperator``, Airflow's ``BaseOperator``)."""

from __future__ import annotations

import inspect


def mro_parameters(cls: type, *, provider_only: bool = False) -> set[str]:
    """The names of the keyword parameters of every ``__init__`` in ``cls``'s MRO (with
    ``provider_only``: only those of the provider's own classes, not Airflow's)."""
    return {p.name for c in cls.__mro__ if "__init__" in vars(c) and c is not object
            and (not provider_only or c.__module__.startswith("airflow_kinesis_spark."))
            for p in inspect.signature(c.__init__).parameters.values()
            if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self"}  # fmt: skip
