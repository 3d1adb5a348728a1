"""The footprint store: each test's peak device memory, learned by ``--accelplat-pack`` runs.

A small JSON document (``docs/leasing.md``): ``{"format": "accelplat.footprints", "version": 1,
"tests": {"<node id>": {"peaks": [<bytes>, ...]}}}``, the newest of at most five figures last. It
is untrusted input when read, and written whole (mode 0644) under a lock beside it, so sessions
that finish together lose none of each other's figures.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path

from accelplat import _files
from accelplat._leasing._locks import try_lock, unlock
from accelplat._types import GIB, MIB
from accelplat._validate import JsonFields
from accelplat.errors import ConfigurationError

FOOTPRINTS_FORMAT = "accelplat.footprints"
FOOTPRINTS_VERSION = 1
MAX_FOOTPRINTS_BYTES = 16 * MIB
MAX_PEAK_BYTES = 2**50  # 1 PiB
KEPT = 5  # figures kept per test: the budget's margin is their spread
MARGIN_BYTES = GIB  # the least margin: allocator rounding, a newer driver's context
LOCK_TIMEOUT_S = 10.0

Footprints = dict[str, tuple[int, ...]]  # node id -> peaks, newest last
_FIELDS = JsonFields("footprints", max_items=KEPT, max_text=4096)  # the bytes bound the rest


def budget_for(peaks: Sequence[int]) -> int:
    """The budget of a test measured at ``peaks`` (newest last): the newest figure and a margin.

    The margin is the figures' spread, at least 1 GiB: ``budget_for([8 GiB]) == 9 GiB``,
    ``budget_for([12 GiB, 8 GiB]) == 12 GiB``.
    """
    return peaks[-1] + max(max(peaks) - min(peaks), MARGIN_BYTES)


def is_stale(peak: int, budget: int) -> bool:
    """Whether a learned budget no longer fits: exceeded, or twice the peak and 1 GiB more."""
    return peak > budget or (2 * peak < budget and budget - peak > GIB)


def load_footprints(path: str | os.PathLike[str]) -> Footprints:
    """Read a footprint store; a missing file is an empty store.

    Raises:
        ConfigurationError: For a file that is not a regular file, too large or malformed,
            naming the file and the field.
    """
    if not os.path.lexists(path):
        return {}
    raw = _files.read_document(path, limit=MAX_FOOTPRINTS_BYTES, what="footprint store")
    try:
        data = json.loads(raw.decode("utf-8"))
        top = _FIELDS.mapping(
            data, "top level", {"format", "version", "tests"}, {"format", "tests"}
        )
        if top["format"] != FOOTPRINTS_FORMAT:
            raise _FIELDS.error("format", repr(FOOTPRINTS_FORMAT), top["format"])
        if top.get("version", 1) != FOOTPRINTS_VERSION:
            raise _FIELDS.error("version", str(FOOTPRINTS_VERSION), top.get("version"))
        tests = _FIELDS.mapping(top["tests"], "tests")
        out = {}
        for nodeid, entry in tests.items():
            where = f"tests[{_FIELDS.text(nodeid, 'tests key')!r}]"
            peaks = _FIELDS.mapping(entry, where, {"peaks"}, {"peaks"})["peaks"]
            if not _FIELDS.array(peaks, f"{where}.peaks"):
                raise _FIELDS.problem(f"{where}.peaks", "no figures")
            out[nodeid] = tuple(
                _FIELDS.integer(p, f"{where}.peaks", minimum=0, maximum=MAX_PEAK_BYTES)
                for p in peaks
            )
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        said = exc if isinstance(exc, ConfigurationError) else "not JSON text"
        raise ConfigurationError(f"footprint store {os.fspath(path)}: {said}") from None
    return out


def save_footprints(
    path: str | os.PathLike[str],
    learned: Mapping[str, int | None],
    restart: Collection[str] = (),
) -> Path:
    """Merge ``learned`` peaks into the store at ``path`` under its lock, and write it whole.

    Newer figures win: each is appended to its test's last ones (those of a test in ``restart``,
    found stale, are dropped first); ``None`` forgets a test, which then runs alone and is
    measured anew. The tests written last are kept when the store outgrows its bounds.

    Raises:
        ConfigurationError: When the existing store is malformed (it is not overwritten).
        OSError: When the file cannot be written; ``TimeoutError`` when its lock stays held.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.with_name(f".{target.name}.lock")):
        tests = load_footprints(target)
        for nodeid, peak in learned.items():
            before = tests.pop(nodeid, ())  # re-inserted last: the newest entries are kept
            if peak is not None:
                tests[nodeid] = (*(() if nodeid in restart else before), peak)[-KEPT:]
        while True:
            doc = {"format": FOOTPRINTS_FORMAT, "version": FOOTPRINTS_VERSION,
                   "tests": {k: {"peaks": list(v)} for k, v in tests.items()}}  # fmt: skip
            text = json.dumps(doc, separators=(",", ":")) + "\n"
            if len(text) <= MAX_FOOTPRINTS_BYTES:
                return _files.write_text_atomic(target, text, mode=0o644)
            tests = dict(list(tests.items())[len(tests) // 10 + 1 :])  # the oldest tenth goes


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold ``path``'s lock (made 0644 if missing), waiting at most ``LOCK_TIMEOUT_S``."""
    deadline = time.monotonic() + LOCK_TIMEOUT_S
    while (fd := try_lock(path)) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} stayed locked for {LOCK_TIMEOUT_S:g} s")
        time.sleep(0.05)
    try:
        yield
    finally:
        unlock(fd)
