"""MkDocs hook: the published inventory (``objects.inv``) names each object at its public path.

mkdocstrings registers every object under its documented path and, as aliases, under its
canonical path and the other modules that import it (``accelplat._memory.snapshot``,
``accelplat.errors.UsageSnapshot``). Cross-references within the site keep those aliases; the
inventory other projects link against keeps only the documented, public paths.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocstrings import Inventory


def _public(name: str) -> bool:
    return not any(part.startswith("_") for part in name.split(".")[1:] if part != "__version__")


def on_post_build(config: Any, **kwargs: Any) -> None:
    """Drop the aliases (second priority) and any private path from the built inventory."""
    path = Path(config["site_dir"]) / "objects.inv"
    if not path.is_file():
        return
    with path.open("rb") as file:
        inventory = Inventory.parse_sphinx(file)
    kept = Inventory(
        [item for item in inventory.values() if item.priority == 1 and _public(item.name)],
        project=config["site_name"],
    )
    path.write_bytes(kept.format_sphinx())
