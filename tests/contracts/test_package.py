"""Package-level promises: lazy import, public names resolvable, no torch, typed."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

import accelplat


def _run(code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELPLAT_")}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )


def test_import_loads_no_backend_vendor_library_or_torch() -> None:
    proc = _run(
        "import sys, accelplat\n"
        "bad = [m for m in ('torch', 'pynvml', 'amdsmi', 'accelplat._backends.cuda',"
        " 'accelplat._registry', 'accelplat._memory') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ""


def test_detect_and_query_never_import_torch() -> None:
    proc = _run(
        "import sys, accelplat\n"
        "p = accelplat.current_platform()\n"
        "p.memory_info(0)\n"
        "print('psutil' in sys.modules)\n"
        "accelplat.snapshot()\n"
        "accelplat.record_usage_stats()\n"
        "print('torch' in sys.modules)\n"
    )
    assert proc.returncode == 0, proc.stderr
    # psutil is imported only to name the holders of device memory, never to detect or read
    assert proc.stdout.split() == ["False", "False"]


def test_every_public_name_resolves() -> None:
    for name in accelplat.__all__:
        assert getattr(accelplat, name) is not None, name
    assert sorted(accelplat.__all__) == sorted(set(accelplat.__all__))


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        accelplat.no_such_name


def test_package_is_typed() -> None:
    spec = importlib.util.find_spec("accelplat")
    assert spec is not None
    assert spec.origin is not None
    assert (Path(spec.origin).parent / "py.typed").is_file()


REPO = Path(__file__).resolve().parents[2]
_SDIST_NEEDS = ("tests", "examples", "docs", "accelplat", "tools/vllm_capabilities", ".ci")
_SDIST_FILES = (
    "conftest.py",
    "mkdocs.yml",
    "LICENSE",
    "README.md",
    "pyproject.toml",
    "tools/nvml_mock.py",
)


def _tree(root: Path, top: str) -> set[str]:
    return {
        path.relative_to(root).as_posix()
        for path in (root / top).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


def _build(kind: str, out: Path) -> Path:
    pytest.importorskip("hatchling")
    proc = subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", kind, "-d", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    (built,) = out.iterdir()
    return built


def test_the_sdist_holds_everything_its_own_tests_read(tmp_path: Path) -> None:
    import tarfile

    sdist = _build("sdist", tmp_path)
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    wanted = set(_SDIST_FILES)
    for top in _SDIST_NEEDS:
        wanted |= _tree(REPO, top)
    assert sorted(wanted - names) == []
    assert not any("__pycache__" in name or name.endswith(".pyc") for name in names)


def test_the_wheel_carries_the_license_and_no_tests(tmp_path: Path) -> None:
    import zipfile

    wheel = _build("wheel", tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    licenses = [n for n in names if ".dist-info/licenses/" in n]
    assert [n.rsplit("/", 1)[1] for n in licenses] == ["LICENSE"]
    license_text = zipfile.ZipFile(wheel).read(licenses[0]).decode()
    assert "Apache License" in license_text
    assert "Version 2.0, January 2004" in license_text
    assert not [n for n in names if n.startswith(("tests/", "examples/", "benchmarks/"))]
    assert "accelplat/py.typed" in names
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    lines = zipfile.ZipFile(wheel).read(metadata).decode().splitlines()
    assert f"Version: {accelplat.__version__}" in lines  # the one place the version is written
    schemas = sorted(f"accelplat/schemas/{p.name}" for p in (REPO / "accelplat/schemas").iterdir())
    assert schemas, "the JSON Schemas of the command line's --json documents"
    assert [n for n in schemas if n not in names] == []


def test_the_metadata_says_where_the_project_lives_and_what_it_runs_on() -> None:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert set(meta["urls"]) >= {"Documentation", "Source", "Issues", "Changelog"}
    pythons = {c.rsplit(" ", 1)[1] for c in meta["classifiers"] if c.count("::") == 2}
    assert {"3.10", "3.11", "3.12", "3.13"} <= pythons
    assert meta["requires-python"] == ">=3.10"
    assert any(c.startswith("Development Status ::") for c in meta["classifiers"])
    assert "Topic :: Software Development :: Testing" in meta["classifiers"]
    dev = meta["optional-dependencies"]["dev"]
    assert {d.split(">")[0] for d in dev} >= {"accelplat[test]", "mypy", "ruff", "hatchling"}


def test_every_extra_is_documented_with_what_the_machine_needs() -> None:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = set(meta["optional-dependencies"]) - {"test", "docs", "dev"}
    page = (REPO / "docs" / "getting-started.md").read_text()
    table = page.split("## Extras", 1)[1]
    documented = {
        line.split("|")[1].strip().strip("`")
        for line in table.splitlines()
        if line.startswith("| `")
    }
    assert documented == extras


def test_python_dash_m_and_version_match_the_metadata() -> None:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"]  # one place: read from accelplat/_version.py
    assert pyproject["project"]["dynamic"] == ["version"]
    assert pyproject["tool"]["hatch"]["version"]["path"] == "accelplat/_version.py"
    version = accelplat.__version__
    proc = subprocess.run(
        [sys.executable, "-m", "accelplat", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"accelplat {version}"


def test_backend_methods_that_replace_the_base_class_say_so() -> None:
    # @override lets mypy report a method whose BasePlatform counterpart was renamed or removed;
    # every built-in backend marks each method it takes over from the base class. Read from the
    # source: before Python 3.12 the decorator leaves no mark at run time.
    import ast
    import inspect

    from accelplat._platform import BasePlatform
    from accelplat._registry import BUILTINS

    checked = 0
    for row in BUILTINS:
        module_name, _, class_name = row.target.partition(":")
        tree = ast.parse(inspect.getsource(importlib.import_module(module_name)))
        (cls,) = (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
        for func in cls.body:
            if not isinstance(func, ast.FunctionDef) or func.name.startswith("__"):
                continue
            if func.name == "default_memory_utilization":
                continue  # a property that replaces the base's class attribute
            base = inspect.getattr_static(BasePlatform, func.name, None)
            if not isinstance(base, (property, classmethod, staticmethod)) and not callable(base):
                continue  # absent, or class attributes (RELEASE, name …): data, not methods
            marks = {ast.unparse(d) for d in func.decorator_list}
            assert "override" in marks, f"{class_name}.{func.name} lacks @override"
            checked += 1
    assert checked >= 20
