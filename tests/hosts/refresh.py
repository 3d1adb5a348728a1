"""Refresh the golden ``info.json`` of committed bundles after a deliberate change of the output.

The records (every vendor answer) are left exactly as captured; only ``info.json`` becomes what
replaying them prints now, and ``CONTENTS.txt`` says so, with the reason given. Review the diff
of ``accelplat info --replay`` before and after: a refresh must follow a change you intended.

    python -m tests.hosts.refresh --reason "capability table: fp8 means supports_fp8()" [BUNDLE …]

With no bundle named, every ``tests/hosts/*.tar.gz`` is refreshed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
from pathlib import Path

from accelplat import __version__
from accelplat._describe import collect_info
from accelplat._replay._bundle import HOST_MEMBER, bundle_bytes
from accelplat.replay import compare_info, load_bundle, replaying
from tests._hosts import BUNDLES

NOTE = "info.json refreshed by accelplat {version}: {reason}"


def refresh(path: Path, reason: str) -> list[str]:
    """Rewrite ``path``'s golden info from a replay of its own records; return what changed."""
    bundle = load_bundle(path)
    with replaying(bundle):
        info = collect_info()
    changed = compare_info(bundle.info or {}, info)
    if not changed and bundle.info is not None:
        return []
    with tarfile.open(path) as tar:  # a committed bundle of ours, already checked by load_bundle
        member = tar.extractfile(HOST_MEMBER)
        assert member is not None
        host = json.loads(member.read())

    note = NOTE.format(version=__version__, reason=reason)
    contents = bundle.contents.rstrip("\n") + f"\n\n{note}\n"
    path.write_bytes(bundle_bytes(host, info, contents))
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reason", required=True, help="why the output changed (kept in CONTENTS)")
    parser.add_argument("bundles", nargs="*", type=Path, help="default: every committed bundle")
    args = parser.parse_args(argv)
    for path in args.bundles or BUNDLES:
        changed = refresh(path, args.reason)
        print(f"{path.name}: {len(changed)} value(s) changed")
        for line in changed:
            print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
