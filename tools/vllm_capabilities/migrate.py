"""Rewrite vLLM test files' platform skip conditions as declared accelplat requirements.

Usage::

    python tools/vllm_capabilities/migrate.py VLLM_SOURCE_ROOT [--files LIST | --all] [--dry-run]

For every ``pytest.mark.skipif(<condition>, reason=...)`` whose condition is one of the platform
predicates in :data:`RULES`, the call (and only its lines) becomes
``pytest.mark.accelplat_requires(...)`` naming what the test needs; nothing else in the file
changes. The project capabilities the requirements use are appended, once, to vLLM's
``pyproject.toml`` from ``capabilities.toml`` next to this script. The files are edited in
place, so run it on a copy of the source distribution.

``--all`` rewrites every test file (the whole-tree projection); ``--files`` takes a list such as
``files.txt`` (paths relative to ``tests/``, ``#`` comments allowed). Prints one line per file:
how many conditions it rewrote.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

RULES: dict[str, tuple[str, ...]] = {
    "not torch.cuda.is_available()": ("cuda-api",),
    "not current_platform.is_cuda_alike()": ("cuda-api",),
    "not (current_platform.is_cuda() or current_platform.is_rocm())": ("cuda-api",),
    "not current_platform.is_cuda()": ("cuda-kernels",),
    "not current_platform.is_rocm()": ("rocm-kernels",),
    "not current_platform.is_cpu()": ("cpu-kernels",),
    "current_platform.is_cpu()": ("accelerator",),
    "not (current_platform.is_cuda_alike() or current_platform.is_xpu())": ("triton-gpu",),
    "not current_platform.has_device_capability(90)": ("sm90",),
    "not current_platform.has_device_capability(100)": ("sm100",),
    "not current_platform.is_device_capability(100)": ("sm100-only",),
    "not current_platform.supports_fp8()": ("fp8",),
    "not on_gfx950()": ("gfx950",),
    "not (current_platform.is_rocm() and current_platform.supports_fp8())": (
        "rocm-kernels",
        "fp8",
    ),
    "not current_platform.is_rocm() or not current_platform.supports_mx()": (
        "rocm-kernels",
        "mxfp4",
    ),
}
"""Skip condition (as ``ast.unparse`` spells it) -> the capabilities a test needs instead."""

SKIP_ON_ROCM: dict[str, str] = {
    "TileLang JIT monitoring is disabled on ROCm": "tilelang-jit-monitor",
    "Xformers backend is not supported on ROCm.": "xformers",
    "check_moe_marlin_supports_config rejects every config on ROCm": "moe-marlin",
}
"""``skipif(current_platform.is_rocm(), reason=R)``: the capability each reason describes."""


def _reason(call: ast.Call) -> str | None:
    for kw in call.keywords:
        if kw.arg == "reason" and isinstance(kw.value, ast.Constant):
            return str(kw.value.value)
    return None


def _requirement(call: ast.Call) -> tuple[str, ...] | None:
    func = ast.unparse(call.func)
    if not func.endswith("mark.skipif") or len(call.args) != 1:
        return None
    condition = ast.unparse(call.args[0])
    if condition in RULES:
        return RULES[condition]
    if condition == "current_platform.is_rocm()":
        name = SKIP_ON_ROCM.get(_reason(call) or "")
        return (name,) if name else None
    return None


def rewrite(source: str) -> tuple[str, int]:
    """Return ``source`` with every recognised skip condition rewritten, and how many.

    Only the lines of each rewritten ``skipif(...)`` call change: the call becomes
    ``<same prefix>.accelplat_requires("name", ...)`` on its first line.
    """
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    edits: list[tuple[int, int, int, int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        needs = _requirement(node)
        if needs is None or node.end_lineno is None or node.end_col_offset is None:
            continue
        prefix = ast.unparse(node.func)[: -len("skipif")]
        text = f"{prefix}accelplat_requires({', '.join(repr(n) for n in needs)})"
        text = text.replace("'", '"')
        edits.append((node.lineno, node.col_offset, node.end_lineno, node.end_col_offset, text))
    for start, col, end, end_col, text in sorted(edits, reverse=True):
        first, last = lines[start - 1], lines[end - 1]
        head = first.encode()[:col].decode()
        tail = last.encode()[end_col:].decode()
        lines[start - 1 : end] = [head + text + tail]
    return "".join(lines), len(edits)


def _files(tests: Path, listing: Path | None) -> list[Path]:
    if listing is None:
        return sorted(p for p in tests.rglob("*.py") if p.is_file() and not p.is_symlink())
    names = [
        line.strip()
        for line in listing.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    return [tests / name for name in names]


def main(argv: list[str] | None = None) -> int:
    """Run the migration; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="vLLM source root (holds tests/, pyproject.toml)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--files", type=Path, default=HERE / "files.txt")
    group.add_argument("--all", action="store_true", help="every test file")
    parser.add_argument("--dry-run", action="store_true", help="count, change nothing")
    args = parser.parse_args(argv)
    tests = args.root / "tests"
    total = 0
    for path in _files(tests, None if args.all else args.files):
        try:
            source = path.read_text(encoding="utf-8")
            new, count = rewrite(source)
        except (OSError, SyntaxError, UnicodeDecodeError) as exc:
            print(f"{path.relative_to(tests)}: skipped ({type(exc).__name__})", file=sys.stderr)
            continue
        if count and not args.dry_run:
            path.write_text(new, encoding="utf-8")
        if count or not args.all:
            print(f"{path.relative_to(tests)}: {count} condition(s) rewritten")
        total += count
    pyproject = args.root / "pyproject.toml"
    table = (HERE / "capabilities.toml").read_text(encoding="utf-8")
    if not args.dry_run and "[tool.accelplat.capabilities]" not in pyproject.read_text():
        with open(pyproject, "a", encoding="utf-8") as f:
            f.write("\n" + table)
    print(f"total: {total} condition(s) rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
