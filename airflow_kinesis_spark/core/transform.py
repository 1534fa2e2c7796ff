"""Resolve the user transform given as ``module:function`` (DataFrame -> DataFrame)."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from typing import Any

__all__ = ["resolve_transform", "check_transform_spec"]

_SPEC = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")


def check_transform_spec(spec: str) -> tuple[str, str]:
    """Split ``package.module:function``.

    :raises ValueError: when ``spec`` does not have that shape.
    """
    if not isinstance(spec, str) or not _SPEC.match(spec):
        raise ValueError(
            f"transform {spec!r} is not of the form 'package.module:function' (a function taking and "
            "returning a pyspark DataFrame), e.g. 'airflow_kinesis_spark.transforms.apache_log:parse_combined_log'"
        )
    module_name, _, func_name = spec.partition(":")
    return module_name, func_name


def resolve_transform(spec: str | None) -> Callable[[Any], Any] | None:
    """Import the transform; ``None`` when there is none.

    :raises ValueError: when the spec is malformed, the module does not import, or the function
        is missing or not callable.
    """
    if not spec:
        return None
    module_name, func_name = check_transform_spec(spec)
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"transform {spec!r}: module {module_name!r} does not import ({err})") from err
    func = getattr(module, func_name, None)
    if not callable(func):
        raise ValueError(f"transform {spec!r}: module {module_name!r} has no function {func_name!r}")
    return func
