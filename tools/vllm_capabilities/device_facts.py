"""Record a GPU machine's facts for the migrated vLLM tests' skip decisions.

Run on the machine (torch and nvidia-ml-py installed; vLLM need not be)::

    PYTHONPATH=. python tools/vllm_capabilities/device_facts.py OUT.json

It writes, as JSON:

* ``torch``: what vLLM's predicates read, from torch itself: ``torch.cuda.is_available()``,
  ``torch.version.cuda``/``hip``, ``hasattr(torch, "xpu")``, the device count, and per device
  its name, compute capability and total memory;
* ``accelplat``: the platform, each device's ``DeviceInfo`` (arch, compute capability) and
  memory total, the graph support, and each device's capability table.

The static proof (``prove.py``) checks its host model of this machine against these facts
(``tests/integrations/test_vllm_capability_migration.py``).

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
    return 0


if __name__ == "__main__":
    sys.exit(main())
