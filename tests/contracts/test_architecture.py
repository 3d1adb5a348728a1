"""The layering of docs/architecture.md, enforced: no import runs up a layer, no platform branch.

Every module of the package is placed in one layer; a module may import its own layer and the
layers below. Platform names are compared only in ``accelplat/_backends/`` and
``accelplat/_visible/``: everywhere else platform differences are backend data.
"""

from __future__ import annotations

import ast
import graphlib
import re
from pathlib import Path

import pytest

from accelplat._registry import BUILTINS

PACKAGE = Path(__file__).resolve().parents[2] / "accelplat"

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("core", ("errors", "_types", "_util", "_lazy", "_validate", "_files", "_boundary", "_vendor",
              "_version")),
    ("vendor bindings", ("_vendor.nvml", "_vendor.levelzero", "_vendor.procs", "_vendor.versions")),
    ("contract", ("_platform",)),
    ("visibility", ("_visible",)),
    ("backends", ("_backends",)),
    ("discovery", ("_registry",)),
    ("features", ("_owners", "_memory", "_shm", "_sizing", "_leaks", "_requirement",
                  "_capabilities", "_needs", "_describe", "_leasing", "_enforce", "_scan",
                  "_translate", "_replay", "_capture", "timeline", "testing", "integrations")),
    ("faces", ("", "types", "replay")),
    ("front ends", ("_cli", "pytest_plugin", "__main__")),
)  # fmt: skip
"""Layers from the bottom up; a name stands for a module or a whole package (a package sits on
one floor, except ``_vendor``, whose quiet import is core and whose bindings sit above it). The
bundle formats and the code that installs a recorder or a replayer are the private package
``_replay`` (a feature: a replay applies the variables the registry's backends read); their
public face is the module ``replay``, with the package's other faces."""

PLATFORM_NAMES = frozenset({row.name for row in BUILTINS} | {"hip"})
"""Every built-in platform's name (a new backend's row adds its own), and ROCm's runtime."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer_of(module: str) -> int:
    best: tuple[int, int] | None = None  # (specificity, layer)
    for index, (_, names) in enumerate(LAYERS):
        for name in names:
            if module == name or (name and module.startswith(name + ".")):
                rank = len(name)
                if best is None or rank > best[0]:
                    best = (rank, index)
    if best is None:
        raise LookupError(module)
    return best[1]


def _is_module(dotted: str) -> bool:
    relative = Path(*dotted.split(".")[1:])
    return (PACKAGE / relative).with_suffix(".py").is_file() or (PACKAGE / relative).is_dir()


def _imports(path: Path) -> set[str]:
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    return _imports_of_source(path, package=package)


def _imports_of_source(path: Path, *, package: str) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
                target = f"accelplat.{target}" if target else "accelplat"
            else:
                target = node.module or ""
            if target == "accelplat" or target.startswith("accelplat."):
                # ``from package import module`` imports that module; any other name imports
                # the package (``from accelplat import __version__`` imports the face).
                for alias in node.names:
                    named = f"{target}.{alias.name}"
                    found.add(named if _is_module(named) else target)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("accelplat."))
        # A module named in a string is imported too: import_module("accelplat.x"), the
        # registry's "accelplat._backends.cuda:CudaPlatform", a lazy face's {name: module}.
        named: list[ast.expr] = []
        if isinstance(node, ast.Call):
            named = list(node.args)
        elif isinstance(node, ast.Dict):
            named = [v for v in node.values if v is not None]
        elif isinstance(node, ast.Constant) and ":" in str(node.value):
            named = [node]
        for value in named:
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                match = _MODULE_STRING.fullmatch(value.value)
                if match:
                    found.add(match.group(1))
    return {"" if name == "accelplat" else name.removeprefix("accelplat.") for name in found}


_MODULE_STRING = re.compile(r"(accelplat(?:\.[A-Za-z_]\w*)+)(?::[A-Za-z_]\w*)?")


SOURCES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_module_has_a_layer_and_imports_none_above_it(path: Path) -> None:
    module = _module_name(path)
    own = _layer_of(module)
    for target in sorted(_imports(path)):
        try:
            layer = _layer_of(target)
        except LookupError:
            continue  # a name imported from a package's namespace, checked where defined
        assert layer <= own, (
            f"{module} ({LAYERS[own][0]}) imports {target} ({LAYERS[layer][0]}), a higher layer"
        )


def _platform_comparisons(path: Path) -> list[str]:
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Compare):
            continue
        for side in (node.left, *node.comparators):
            elements = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
            for element in elements:
                if (
                    isinstance(element, ast.Constant)
                    and isinstance(element.value, str)
                    and element.value.strip().lower() in PLATFORM_NAMES
                ):
                    found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize(
    "path",
    [p for p in SOURCES if p.relative_to(PACKAGE).parts[0] not in ("_backends", "_visible")],
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_no_platform_name_is_compared_outside_backends_and_visible(path: Path) -> None:
    assert _platform_comparisons(path) == []


def test_the_checks_find_what_they_look_for(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text('if platform.name == "rocm" or kind in ("XPU", "other"):\n    pass\n')
    assert len(_platform_comparisons(sample)) == 2
    assert _layer_of("_backends.cuda") > _layer_of("_platform")
    assert _layer_of("_cli.wait") > _layer_of("_registry")
    assert _layer_of("pytest_plugin._timeline") > _layer_of("timeline._trace")
    assert _layer_of("replay") < _layer_of("_cli.info")  # a capture must not reach into the CLI
    from_face = tmp_path / "from_face.py"
    from_face.write_text("from accelplat import __version__, _files\n")
    assert _imports_of_source(from_face, package="") == {"", "_files"}  # the face, a module
    reaching_up = tmp_path / "accelplat_replay_sample.py"
    reaching_up.write_text("def capture():\n    from accelplat._cli.info import collect_info\n")
    assert "_cli.info" in _imports_of_source(reaching_up, package="replay")
    by_name = tmp_path / "by_name.py"
    by_name.write_text(
        'importlib.import_module("accelplat.replay")\nT = "accelplat._memory:x"\n'
        'L = {"name": "accelplat._shm"}\nFORMAT = "accelplat.timeline"\n'
    )
    found = _imports_of_source(by_name, package="_boundary")
    assert {"replay", "_memory", "_shm"} <= found
    assert "timeline" not in found  # a plain string constant is not an import
    assert _layer_of("_registry") < _layer_of("_replay._install") == _layer_of("_replay._bundle")
    assert _layer_of("_replay._bundle") < _layer_of("replay")  # the folder, then its face
    with pytest.raises(LookupError):
        _layer_of("brand_new_module")


def _graph() -> dict[str, set[str]]:
    """Every module and the modules it imports (string imports included), by dotted name."""
    modules = {_module_name(p): p for p in SOURCES}

    def resolve(name: str) -> str | None:
        while name not in modules:
            if not name:
                return None
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = {resolve(t) for t in _imports(path)}
        graph[module] = {t for t in targets if t is not None and t != module}
    return graph


def test_the_import_graph_has_no_circle() -> None:
    graph = _graph()
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        pytest.fail(f"import circle: {' -> '.join(exc.args[1])}")
