"""Resolve the user transform given as ``module:function`` (DataFrame -> DataFrame).

A transform is code the job runs, so it comes from the DAG file (the operators do not template
it) and is checked before its module is imported:

* the spec has the shape ``package.module:function``;
* its module is not part of Python's standard library (``sys.stdlib_module_names``, and
  ``__main__``): no function there takes and returns a pyspark DataFrame, and these are the
  modules that run commands or remove files (``os:system``, ``shutil:rmtree``);
* the function's name is not a dunder (``__import__``, ``__class__``, ...);
* with an allow-list (the provider's ``[kinesis_spark] transform_allowed_modules`` option), the
  module is one of the listed packages or inside one. :data:`SHIPPED_TRANSFORMS` is always allowed.

After the import the same rules apply to the module that defines the function (its
``__module__``), so an allowed module cannot hand on a function it imported from elsewhere
(``from shutil import rmtree``). Not a sandbox: an allowed module runs with the job's rights.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Callable, Iterable
from typing import Any

__all__ = [
    "ALLOWED_MODULES_OPTION",
    "SHIPPED_TRANSFORMS",
    "check_transform_spec",
    "parse_allowed_modules",
    "resolve_transform",
]

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_MODULE = re.compile(rf"^{_NAME}(\.{_NAME})*$")
_SPEC = re.compile(rf"^{_NAME}(\.{_NAME})*:{_NAME}$")
#: Where the allow-list is configured on the Airflow side (named in errors).
ALLOWED_MODULES_OPTION = "[kinesis_spark] transform_allowed_modules"
#: The provider's own transforms: allowed whatever the allow-list says (they ship with every job).
SHIPPED_TRANSFORMS = "airflow_kinesis_spark.transforms"
#: Top-level modules a transform never comes from.
_REFUSED_TOP_LEVEL = frozenset(sys.stdlib_module_names) | {"__main__"}


def parse_allowed_modules(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """The allow-list of module prefixes, from a comma-separated string or a sequence.

    :returns: the prefixes, in order, without blanks; ``()`` for none (any module outside the
        standard library is allowed).
    :raises ValueError: an entry is not a dotted module name, or is in the standard library
        (naming :data:`ALLOWED_MODULES_OPTION`).
    """
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    prefixes: list[str] = []
    for item in items:
        prefix = str(item).strip()
        if not prefix:
            continue
        if not _MODULE.match(prefix):
            raise ValueError(f"{ALLOWED_MODULES_OPTION}: {prefix!r} is not a module name (comma-separated dotted "
                             "module names, e.g. 'my_company.kinesis_transforms, team_b.transforms')")  # fmt: skip
        if prefix.split(".", 1)[0] in _REFUSED_TOP_LEVEL:
            raise ValueError(f"{ALLOWED_MODULES_OPTION}: {prefix!r} is in Python's standard library, which is never "
                             "allowed as a transform's module")  # fmt: skip
        prefixes.append(prefix)
    return tuple(prefixes)


def _under(module_name: str, prefix: str) -> bool:
    """``module_name`` is ``prefix`` or inside it (a package boundary: ``a.b`` is not under ``a.bc``)."""
    return module_name == prefix or module_name.startswith(prefix + ".")


def _refusal(module_name: str, allowed: tuple[str, ...]) -> str | None:
    """Why functions of ``module_name`` may not be transforms, or ``None``."""
    if module_name.split(".", 1)[0] in _REFUSED_TOP_LEVEL:
        return f"{module_name!r} is in Python's standard library, which has no transforms"
    if allowed and not any(_under(module_name, p) for p in (*allowed, SHIPPED_TRANSFORMS)):
        return (f"module {module_name!r} is not under a prefix of {ALLOWED_MODULES_OPTION} "
                f"({', '.join(allowed)}); add its package there, or use a transform from one of those")  # fmt: skip
    return None


def check_transform_spec(spec: str, allowed_modules: str | Iterable[str] | None = None) -> tuple[str, str]:
    """Split ``package.module:function`` and check it may be imported; imports nothing.

    :param allowed_modules: the allow-list of module prefixes (see :func:`parse_allowed_modules`);
        ``None`` or empty: any module outside the standard library.
    :returns: ``(module name, function name)``.
    :raises ValueError: ``spec`` does not have that shape, or names a module or function that
        may not be a transform (the message says which rule, and names the option when it is the
        allow-list's).
    """
    if not isinstance(spec, str) or not _SPEC.match(spec):
        raise ValueError(
            f"transform {spec!r} is not of the form 'package.module:function' (a function taking and "
            "returning a pyspark DataFrame), e.g. 'airflow_kinesis_spark.transforms.apache_log:parse_combined_log'"
        )
    module_name, _, func_name = spec.partition(":")
    if func_name.startswith("__") and func_name.endswith("__"):
        raise ValueError(f"transform {spec!r}: {func_name!r} is a special attribute, not a transform function")
    reason = _refusal(module_name, parse_allowed_modules(allowed_modules))
    if reason:
        raise ValueError(f"transform {spec!r} refused before importing it: {reason}")
    return module_name, func_name


def resolve_transform(spec: str | None, allowed_modules: str | Iterable[str] | None = None) -> Callable[[Any], Any] | None:
    """Check the spec (:func:`check_transform_spec`), import the transform; ``None`` when there is none.

    :param allowed_modules: as :func:`check_transform_spec`; also applied to the module that
        defines the function, after the import.
    :raises ValueError: when the spec is malformed or refused (nothing imported), the module
        does not import, the function is missing or not callable, or it is defined in a module
        that may not hold transforms.
    """
    if not spec:
        return None
    allowed = parse_allowed_modules(allowed_modules)
    module_name, func_name = check_transform_spec(spec, allowed)
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"transform {spec!r}: module {module_name!r} does not import ({err})") from err
    func = getattr(module, func_name, None)
    if not callable(func):
        raise ValueError(f"transform {spec!r}: module {module_name!r} has no function {func_name!r}")
    defined_in = getattr(func, "__module__", None)
    if not isinstance(defined_in, str) or not _MODULE.match(defined_in):
        raise ValueError(f"transform {spec!r}: {func_name!r} does not say which module defines it (__module__ "
                         f"{defined_in!r}); make it a function defined with def in {module_name!r}")  # fmt: skip
    reason = _refusal(defined_in, allowed)
    if reason:
        raise ValueError(f"transform {spec!r}: {func_name!r} is defined in {defined_in!r}, not a transform's module: {reason}")
    return func
