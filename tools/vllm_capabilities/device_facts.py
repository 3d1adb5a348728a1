"""Record a GPU machine's facts for the migrated vLLM tests' skip decisions.

Run on the machine (torch and nvidia-ml-py installed; vLLM need not be)::

    PYTHONPATH=. python tools/vllm_capabilities/device_facts.py OUT.json

It writes, as JSON:

* ``torch``: what vLLM's predicates read, from torch itself: ``torch.cuda.is_available()``,
  ``torch.version.cuda``/``hip``, ``hasattr(torch, "xpu")``, the device count, and per device
  its name, compute capability and total memory;
* ``accelplat``: the platform, each device's ``DeviceInfo`` (arch, compute capability) and
  memory total, the graph support, and each device's capability table with the migration's
  ``capabilities.toml`` loaded;
* ``rules``: for every rewrite rule of ``migrate.py``, the original condition's value (computed
  from the live torch answers the way vLLM's CUDA platform computes it) next to the value of the
  requirement that replaces it (from accelplat) — equal on every row when the rewrite is
  decision-preserving on this machine.

Every section is written as soon as it is known, so a failure later loses nothing before it.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _write(path: Path, doc: dict[str, Any]) -> None:
    path.write_text(json.dumps(doc, indent=1, default=str))


def torch_facts() -> dict[str, Any]:
    """What vLLM's platform predicates read, from torch."""
    import torch

    cuda = torch.cuda.is_available()
    count = torch.cuda.device_count() if cuda else 0
    return {
        "version": torch.__version__,
        "version_cuda": torch.version.cuda,
        "version_hip": getattr(torch.version, "hip", None),
        "has_xpu": hasattr(torch, "xpu"),
        "cuda_is_available": cuda,
        "device_count": count,
        "devices": [
            {
                "name": torch.cuda.get_device_name(i),
                "capability": list(torch.cuda.get_device_capability(i)),
                "total_memory": torch.cuda.get_device_properties(i).total_memory,
            }
            for i in range(count)
        ],
    }


def accelplat_facts() -> dict[str, Any]:
    """Return accelplat's view: devices, graphs and capability tables (no device context)."""
    import accelplat
    from accelplat._capabilities import load_pyproject

    load_pyproject(HERE / "capabilities.toml")
    platform = accelplat.current_platform()
    devices = platform.devices()
    return {
        "platform": platform.name,
        "device_type": platform.device_type,
        "graph": {
            "available": platform.graph.available,
            "api": platform.graph.api,
            "reason": platform.graph.reason,
        },
        "devices": [
            {
                "name": d.name,
                "uuid": d.uuid,
                "pci_bus_id": d.pci_bus_id,
                "arch": d.arch,
                "compute_capability": list(d.compute_capability) if d.compute_capability else None,
                "total_memory": platform.memory_info(d.index).total,
            }
            for d in devices
        ],
        "capabilities": [
            {
                name: {"available": c.available, "value": c.value, "reason": c.reason}
                for name, c in accelplat.capabilities(d.index, platform=platform).items()
            }
            for d in devices
        ],
    }


def vllm_cuda_predicates(facts: dict[str, Any]) -> dict[str, Any]:
    """The values vLLM's predicates take on a CUDA machine with these torch facts.

    vLLM picks its CUDA platform when torch is a CUDA build and a GPU is present; its
    ``has_device_capability(n)`` compares ``major * 10 + minor`` of device 0 with ``n``.
    """
    cuda = bool(facts["cuda_is_available"]) and facts["version_cuda"] is not None
    rocm = facts["version_hip"] is not None
    cap = facts["devices"][0]["capability"] if facts["devices"] else None
    cap_int = cap[0] * 10 + cap[1] if cap else None
    return {
        "torch.cuda.is_available()": bool(facts["cuda_is_available"]),
        "current_platform.is_cuda()": cuda,
        "current_platform.is_rocm()": rocm,
        "current_platform.is_cuda_alike()": cuda or rocm,
        "current_platform.is_xpu()": False,
        "current_platform.is_cpu()": not (cuda or rocm),
        "current_platform.has_device_capability(90)": cap_int is not None and cap_int >= 90,
        "current_platform.has_device_capability(100)": cap_int is not None and cap_int >= 100,
        "current_platform.is_device_capability(100)": cap_int == 100,
        "current_platform.supports_fp8()": cuda and cap_int is not None and cap_int >= 89,
        "current_platform.supports_mx()": False,
        "on_gfx950()": False,
    }


def rule_rows(values: dict[str, Any], table: dict[str, Any]) -> list[dict[str, Any]]:
    """Evaluate every rewrite rule's condition and its replacement on one device."""
    import ast

    from migrate import RULES, SKIP_ON_ROCM

    def evaluate(node: ast.AST) -> bool:
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return not evaluate(node.operand)
        if isinstance(node, ast.BoolOp):
            parts = [evaluate(v) for v in node.values]
            return all(parts) if isinstance(node.op, ast.And) else any(parts)
        return bool(values[ast.unparse(node)])

    rows = []
    for condition, needs in RULES.items():
        skip_before = evaluate(ast.parse(condition, mode="eval").body)
        skip_after = not all(table[n]["available"] for n in needs)
        rows.append(
            {
                "condition": condition,
                "requires": list(needs),
                "skip_before": skip_before,
                "skip_after": skip_after,
            }
        )
    for reason, name in SKIP_ON_ROCM.items():
        skip_before = bool(values["current_platform.is_rocm()"])
        skip_after = not table[name]["available"]
        rows.append(
            {
                "condition": f"current_platform.is_rocm()  # {reason}",
                "requires": [name],
                "skip_before": skip_before,
                "skip_after": skip_after,
            }
        )
    return rows


def main() -> int:
    """Write the facts file named on the command line."""
    out = Path(sys.argv[1])
    doc: dict[str, Any] = {}
    for key, producer in (("torch", torch_facts), ("accelplat", accelplat_facts)):
        try:
            doc[key] = producer()
        except Exception:
            doc[key] = {"error": traceback.format_exc()}
        _write(out, doc)
    try:
        values = vllm_cuda_predicates(doc["torch"])
        doc["vllm_predicates"] = values
        doc["rules"] = rule_rows(values, doc["accelplat"]["capabilities"][0])
        doc["rules_equal"] = all(r["skip_before"] == r["skip_after"] for r in doc["rules"])
    except Exception:
        doc["rules"] = {"error": traceback.format_exc()}
    _write(out, doc)
    print(json.dumps(doc.get("rules_equal")), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
