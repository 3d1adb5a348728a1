"""The modelled hosts of the vocabulary proof, and accelplat's answers on each.

Each host is a set of vendor facts (platform, arch, compute capability, torch, libraries).
accelplat answers on a host by replaying its bundle from ``tests/hosts`` in a child interpreter
(``ACCELPLAT_REPLAY``), through the same code as a live host. A host whose bundle is not in the
repository yet is answered by :func:`spec_answer`, a model of the requirement vocabulary as
``docs/capabilities.md`` defines it; the proof's output names which hosts were replayed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from vllm_model import Host, capability, gcn_capability

REPO = Path(__file__).resolve().parents[2]
BUNDLES = REPO / "tests" / "hosts"

HOSTS = (
    Host("nvidia-sm75", "cuda", "Tesla T4", "sm_75", (7, 5), bundles=("nvidia-t4*",)),
    Host(
        "nvidia-sm80",
        "cuda",
        "A100",
        "sm_80",
        (8, 0),
        bundles=("nvidia-a100-x1*", "nvidia-a100-x8*"),
    ),
    Host("nvidia-sm89", "cuda", "L40S", "sm_89", (8, 9), bundles=("nvidia-l40s*", "nvidia-l4-*")),
    Host("nvidia-sm90", "cuda", "H200", "sm_90", (9, 0), bundles=("nvidia-h200-x1*",)),
    Host("nvidia-sm100", "cuda", "B200", "sm_100", (10, 0), bundles=("nvidia-b200*",)),
    Host(
        "amd-gfx90a",
        "rocm",
        "MI250X",
        "gfx90a",
        gcn_arch="gfx90a:sramecc+:xnack-",
        bundles=("amd-mi250*",),
    ),
    Host(
        "amd-gfx942",
        "rocm",
        "MI300X",
        "gfx942",
        gcn_arch="gfx942:sramecc+:xnack-",
        bundles=("amd-mi300x-x2*",),
    ),
    Host(
        "amd-gfx950",
        "rocm",
        "MI355X",
        "gfx950",
        gcn_arch="gfx950:sramecc+:xnack-",
        bundles=("amd-mi355*", "amd-mi350*"),
    ),
    Host(
        "amd-gfx1100",
        "rocm",
        "Radeon RX 7900 XTX",
        "gfx1100",
        gcn_arch="gfx1100",
        bundles=("amd-rx7900*",),
    ),
    Host("intel-max", "xpu", "Intel Data Center GPU Max 1550", "pvc", bundles=("intel-max*",)),
    Host("intel-bmg", "xpu", "Intel Arc B580", "bmg", bundles=("intel-arc-b580*",)),
    Host("cpu", "cpu", "x86_64 CPU", "x86-64-v4", bundles=("cpu-x86_64*",)),
)


def bundle(host: Host, directory: Path = BUNDLES) -> Path | None:
    """The host's replay bundle in ``directory`` (``tests/hosts``), if one is there."""
    for pattern in host.bundles:
        found = sorted(directory.glob(pattern + ".tar.gz"))
        if found:
            return found[0]
    return None


_CHILD = """
import json, sys
import accelplat
texts = json.load(sys.stdin)
platform = accelplat.current_platform()
devices = platform.devices()
first = devices[0] if devices else None
facts = {
    "platform": platform.name,
    "arch": first.arch if first else None,
    "capability": list(first.compute_capability) if first and first.compute_capability else None,
}
print(json.dumps({"facts": facts, "answers": {t: bool(accelplat.has(t)) for t in texts}}))
"""


def replayed_answers(path: Path, texts: list[str]) -> tuple[dict[str, object], dict[str, bool]]:
    """The replayed host's platform, arch and capability, and accelplat's answers."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("VISIBLE_DEVICES")}
    env.update(ACCELPLAT_REPLAY=str(path), PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-c", _CHILD], input=json.dumps(texts), capture_output=True,
        text=True, env=env, check=True, timeout=300,
    )  # fmt: skip
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    return doc["facts"], doc["answers"]


def can_replay_requirements() -> bool:
    """Whether this checkout's accelplat decides requirement expressions (not only names)."""
    return (REPO / "accelplat" / "_requirement.py").is_file()


# -- the spec model, for hosts without a bundle yet -------------------------------------------

_FP8_NATIVE = re.compile(r"^(gfx94\d|gfx950|gfx12\d\d)$")


def _builtin(host: Host, word: str) -> bool:
    cap = _capability(host)
    gfx = host.arch or ""
    if word == "cuda-api":
        return host.platform in ("cuda", "rocm")
    if word == "accelerator":
        return host.platform != "cpu"
    if word == "fp8":
        if host.platform == "cuda":
            return cap is not None and cap >= 89
        if host.platform == "rocm":
            return gfx.startswith(("gfx9", "gfx11", "gfx12"))
        return host.platform == "xpu"
    if word == "fp8-fnuz":
        return gfx.startswith("gfx94")
    if word == "fp8-native":
        return (cap is not None and host.platform == "cuda" and cap >= 89) or bool(
            _FP8_NATIVE.match(gfx)
        )
    raise ValueError(f"spec model: unknown word {word!r}")


def _capability(host: Host) -> int | None:
    if host.platform == "cuda" and host.nvml_capability:
        return host.nvml_capability[0] * 10 + host.nvml_capability[1]
    if host.platform == "rocm" and host.arch:
        cc = gcn_capability(host.arch)
        return None if cc is None else cc[0] * 10 + cc[1]
    return None


def _atom(host: Host, word: str) -> bool:
    if word in ("cuda", "rocm", "xpu", "cpu", "tpu"):
        return host.platform == word
    m = re.fullmatch(r"capability(>=|<=|==|!=|>|<)(\d+)(x?)", word)
    if m:
        cap = _capability(host)
        if cap is None:
            return False
        have, want = (cap // 10, int(m[2])) if m[3] else (cap, int(m[2]))
        return {
            ">=": have >= want, "<=": have <= want, "==": have == want, "!=": have != want,
            ">": have > want, "<": have < want,
        }[m[1]]  # fmt: skip
    if word.startswith("gfx"):
        arch = host.arch or ""
        return arch.startswith(word[:-1]) if word.endswith("*") else arch == word
    if word.startswith("sm_"):
        return host.arch == word
    return _builtin(host, word)


def spec_answer(host: Host, text: str) -> bool:
    """The requirement's truth on ``host`` as the vocabulary spec defines it."""
    tokens = re.findall(r"\(|\)|[^\s()]+", text.replace("capability ", "capability"))
    pos = 0

    def expr() -> bool:
        nonlocal pos
        value = term()
        while pos < len(tokens) and tokens[pos] == "or":
            pos += 1
            value = term() or value
        return value

    def term() -> bool:
        nonlocal pos
        value = factor()
        while pos < len(tokens) and tokens[pos] == "and":
            pos += 1
            value = factor() and value
        return value

    def factor() -> bool:
        nonlocal pos
        token = tokens[pos]
        pos += 1
        if token == "not":
            return not factor()
        if token == "(":
            value = expr()
            pos += 1  # ")"
            return value
        return _atom(host, token)

    return expr()


def answers(host: Host, texts: list[str], directory: Path = BUNDLES) -> tuple[dict[str, bool], str]:
    """Accelplat's answers on ``host`` and where they came from (a bundle, or the spec)."""
    path = bundle(host, directory)
    if path is not None and can_replay_requirements():
        facts, said = replayed_answers(path, texts)
        cc = capability(host)  # vLLM's number: accelplat's DeviceInfo must say the same
        mine = {"platform": host.platform, "arch": host.arch, "capability": cc and list(cc)}
        if facts != mine:  # the wrong bundle, or a capability number that is not vLLM's
            raise ValueError(f"{path.name} replays {facts}, not {mine} ({host.name})")
        return said, f"replayed {path.name}"
    return {t: spec_answer(host, t) for t in texts}, "spec model (no bundle yet)"
