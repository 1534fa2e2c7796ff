"""core/transform.py: which ``module:function`` may be a transform, checked before the import."""

from __future__ import annotations

import importlib
import sys
import types

import pytest

from airflow_kinesis_spark.core import transform as transform_module
from airflow_kinesis_spark.core.transform import (
    ALLOWED_MODULES_OPTION,
    check_transform_spec,
    parse_allowed_modules,
    resolve_transform,
)

SHIPPED = "airflow_kinesis_spark.transforms.apache_log:parse_combined_log"


@pytest.fixture
def imports(monkeypatch) -> list[str]:
    """The modules ``resolve_transform`` imports (recorded, then imported as usual)."""
    seen: list[str] = []
    real = transform_module.importlib.import_module

    def import_module(name: str) -> types.ModuleType:
        seen.append(name)
        return real(name)

    monkeypatch.setattr(transform_module, "importlib", types.SimpleNamespace(import_module=import_module))
    return seen


@pytest.fixture
def modules(tmp_path, monkeypatch):
    """Write modules ``{dotted name: source}`` under a fresh ``sys.path`` entry."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(sources: dict[str, str]) -> None:
        for name, source in sources.items():
            path = tmp_path.joinpath(*name.split(".")).with_suffix(".py")
            path.parent.mkdir(parents=True, exist_ok=True)
            for parent in list(path.parents)[: len(name.split(".")) - 1]:
                (parent / "__init__.py").touch()
            path.write_text(source, encoding="utf-8")
            parts = name.split(".")
            for i in range(1, len(parts) + 1):  # a package of the same name another test imported
                monkeypatch.delitem(sys.modules, ".".join(parts[:i]), raising=False)
        importlib.invalidate_caches()

    return write


@pytest.mark.parametrize("spec", ["os:system", "shutil:rmtree", "subprocess:run", "builtins:eval", "importlib:import_module",
                                  "os.path:join", "antigravity:geohash", "__main__:main"])  # fmt: skip
def test_the_standard_library_is_refused_before_anything_is_imported(spec, imports):
    with pytest.raises(ValueError, match="refused before importing it: .* Python's standard library"):
        resolve_transform(spec)
    assert imports == []


@pytest.mark.parametrize("spec", ["json:__class__", "airflow_kinesis_spark.transforms.apache_log:__getattr__"])
def test_dunder_names_are_refused(spec, imports):
    with pytest.raises(ValueError, match="special attribute"):
        resolve_transform(spec)
    assert imports == []


def test_without_an_allow_list_a_module_outside_the_standard_library_resolves(imports):
    func = resolve_transform(SHIPPED)
    assert func.__name__ == "parse_combined_log" and imports == ["airflow_kinesis_spark.transforms.apache_log"]
    assert resolve_transform(None) is None and resolve_transform("") is None


def test_with_an_allow_list_other_modules_are_refused_before_the_import(modules, imports):
    modules({"my_co.kinesis": "def ok(df):\n    return df\n", "my_co_x.evil": "def bad(df):\n    return df\n"})
    assert resolve_transform("my_co.kinesis:ok", "my_co").__name__ == "ok"
    with pytest.raises(ValueError) as err:
        resolve_transform("my_co_x.evil:bad", "my_co")  # a package boundary, not a string prefix
    assert ALLOWED_MODULES_OPTION in str(err.value) and "'my_co_x.evil'" in str(err.value)
    assert imports == ["my_co.kinesis"]
    # the provider's own transforms are always allowed
    assert resolve_transform(SHIPPED, ["my_co"]) is not None
    assert check_transform_spec("my_co:f", ("my_co", "team_b")) == ("my_co", "f")


def test_a_function_handed_on_from_a_refused_module_is_refused_after_the_import(modules):
    modules({
        "my_co.reexport": "from shutil import rmtree\nfrom os import system\n",
        "my_co.helpers": "from other_team.lib import clean\n",
        "other_team.lib": "def clean(df):\n    return df\n",
    })  # fmt: skip
    with pytest.raises(ValueError, match=r"'rmtree' is defined in 'shutil', not a transform's module: .*standard library"):
        resolve_transform("my_co.reexport:rmtree")
    with pytest.raises(ValueError, match=r"'system' is defined in 'posix'"):
        resolve_transform("my_co.reexport:system")
    with pytest.raises(ValueError, match=r"'clean' is defined in 'other_team.lib', .*transform_allowed_modules"):
        resolve_transform("my_co.helpers:clean", "my_co")
    assert resolve_transform("my_co.helpers:clean") is not None  # no allow-list: any module outside the stdlib


@pytest.mark.parametrize("spec", ["os", "a:b:c", "a.:b", "{{ dag_run.conf['t'] }}", ":f", 42, None])
def test_malformed_specs(spec):
    with pytest.raises(ValueError, match="is not of the form 'package.module:function'"):
        check_transform_spec(spec)  # type: ignore[arg-type]


def test_parse_allowed_modules():
    assert parse_allowed_modules(None) == parse_allowed_modules("") == parse_allowed_modules(" , ") == ()
    assert parse_allowed_modules(" my_co.kinesis , team_b ,") == ("my_co.kinesis", "team_b")
    assert parse_allowed_modules(["a", " b.c "]) == ("a", "b.c")
    with pytest.raises(ValueError, match=r"\[kinesis_spark\] transform_allowed_modules: 'my co' is not a module name"):
        parse_allowed_modules("my_co, my co")
    with pytest.raises(ValueError, match=r"transform_allowed_modules: 'os.path' is in Python's standard library"):
        parse_allowed_modules("my_co,os.path")
