"""The package evaluates nothing and runs no shell."""

from __future__ import annotations

import re

from tests._hostile import PACKAGE, REPO

_FORBIDDEN = {
    "eval(": re.compile(r"(?<![\w.])eval\("),
    "exec(": re.compile(r"(?<![\w.])exec\("),
    "shell=True": re.compile(r"shell\s*=\s*True"),
    "os.system": re.compile(r"\bos\.system\b"),
    "os.popen": re.compile(r"\bos\.popen\b"),
}


def test_the_package_evaluates_nothing_and_runs_no_shell() -> None:
    sources = sorted(PACKAGE.rglob("*.py"))
    assert len(sources) > 20
    found = [
        f"{path.relative_to(REPO)}:{n}: {what}"
        for path in sources
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        for what, pattern in _FORBIDDEN.items()
        if pattern.search(line)
    ]
    assert found == []


def test_the_forbidden_patterns_do_find_what_they_look_for() -> None:
    assert _FORBIDDEN["eval("].search("x = eval(text)")
    assert not _FORBIDDEN["eval("].search("literal_eval(text)")
    assert _FORBIDDEN["exec("].search("exec(code)")
    assert not _FORBIDDEN["exec("].search("spec.loader.exec_module(m)")
    assert _FORBIDDEN["shell=True"].search("subprocess.run(cmd, shell = True)")
    assert _FORBIDDEN["os.system"].search("os.system('ls')")
