"""Fetch vLLM's source distribution from the package index and unpack its tests.

``pip download`` of the sdist tries to build its metadata (which needs CUDA tooling), so the
file is taken from the simple index (PEP 503) directly: the link named ``vllm-<version>.tar.gz``
carries the file's sha256 in its fragment, which is checked before anything is unpacked. Only
``tests/`` and ``pyproject.toml`` (pytest's markers) are extracted, as regular files and
directories inside the destination.

Usage: python fetch_sdist.py VERSION DEST [SHA256]   (prints the unpacked tree's path)

With ``SHA256`` the file must also have that digest (a pin: the index cannot change it).
"""

from __future__ import annotations

import hashlib
import re
import sys
import tarfile
import urllib.request
from pathlib import Path

INDEX = "https://pypi.org/simple/vllm/"


def main() -> None:
    """Fetch, check and unpack the sdist named on the command line."""
    version, dest = sys.argv[1], Path(sys.argv[2])
    pinned = sys.argv[3] if len(sys.argv) > 3 else None
    name = f"vllm-{version}.tar.gz"
    with urllib.request.urlopen(INDEX, timeout=60) as response:
        page = response.read().decode("utf-8", "replace")
    match = re.search(r'href="([^"#]*/' + re.escape(name) + r')#sha256=([0-9a-f]{64})"', page)
    if match is None:
        sys.exit(f"fetch_sdist: {name} with a sha256 is not listed on {INDEX}")
    url, expected = match.group(1), match.group(2)
    if pinned is not None and pinned != expected:
        sys.exit(f"fetch_sdist: the index lists {name} with sha256 {expected}, pinned {pinned}")
    dest.mkdir(parents=True, exist_ok=True)
    archive = dest / name
    digest = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=300) as response, archive.open("wb") as out:
        while chunk := response.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != expected:
        sys.exit(f"fetch_sdist: sha256 of {url} is {digest.hexdigest()}, the index says {expected}")
    root = f"vllm-{version}"
    wanted = (f"{root}/tests/", f"{root}/pyproject.toml")
    with tarfile.open(archive) as tar:
        members = [
            m
            for m in tar.getmembers()
            if (m.isfile() or m.isdir())
            and m.name.startswith(wanted)
            and ".." not in Path(m.name).parts
        ]
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(dest, members=members, **safe)  # type: ignore[arg-type]
    archive.unlink()
    print(dest / root)


if __name__ == "__main__":
    main()
