"""``accelplat info``: which platform this is, why, and what its devices hold.

The ``--json`` keys are documented in ``docs/json.md`` (``accelplat/schemas/info.json``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
from typing import Any

from accelplat._cli._args import add_common, path
from accelplat._cli._errors import EXIT_FAILED, EXIT_USAGE, say, shown
from accelplat._util import format_bytes


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "info",
        help="show the detected platform, why, its devices and their memory",
        description="Show the detected platform, why it was chosen, every visible device with "
        "its memory, the release profile, graph support and defaults. Creates no device context.",
    )
    parser.set_defaults(func=_run)
    add_common(parser, json=True)
    replay = "answer from a capture bundle (accelplat capture) instead of this host"
    path(parser.add_argument("--replay", metavar="BUNDLE", help=replay))


def _render_text(info: dict[str, Any]) -> str:
    chosen = info["platform"]
    lines = [f"platform: {chosen if chosen else 'none'}"]
    if info.get("driver_version"):
        lines.append(f"driver: {info['driver_version']}")
    if info.get("error"):
        lines.append(f"  error: {info['error']}")
    lines += ["detection:"] * bool(info["candidates"])  # none: a configuration error, said above
    for cand in info["candidates"]:
        mark = "*" if cand["chosen"] else ("+" if cand["available"] else "-")
        origin = "" if cand["builtin"] else " (plugin)"
        lines.append(f"  {mark} {cand['name']}{origin}: {cand['reason']}")
    if chosen is None:
        return "\n".join(shown(line) for line in lines)
    env = info["visible_devices_env"]
    if env:
        value = info["visible_devices"]
        lines.append(f"visible devices: {env}={value!r}" if value is not None else f"{env} unset")
    lines.append(f"device type: {info['device_type']}")
    lines.append(f"default memory utilization: {info['default_memory_utilization']:.2f}")
    lines.append(f"preferred start method: {info['preferred_start_method']}")
    lines.append(f"context-free queries: {'yes' if info['context_free'] else 'no'}")
    rel = info["release"]
    kind = "lazy" if rel["lazy"] else "eager"
    lines.append(
        f"release: {kind}, stable for {rel['stable_duration_s']:g} s, "
        f"timeout {rel['settle_timeout_s']:g} s, idle floor {format_bytes(rel['idle_floor_bytes'])}"
    )
    graph = info["graph"]
    api = f" ({graph['api']})" if graph["api"] else ""
    state = "available" if graph["available"] else "unavailable"
    lines.append(f"graphs: {state}{api}: {graph['reason']}")
    devices = info["devices"]
    lines.append(f"devices: {len(devices)}")
    for dev in devices:
        extra = "".join(f", {dev[key]}" for key in ("arch", "uuid") if dev[key])
        lines.append(f"  [{dev['index']}] {dev['name']} (physical {dev['physical_index']}{extra})")
        mem = dev["memory"]
        if mem is None:
            lines.append(f"      memory: unavailable: {dev['error']}")
            continue
        lines.append(
            f"      used {format_bytes(mem['used'])} / total {format_bytes(mem['total'])}, "
            f"free {format_bytes(mem['free'])}, reserved {format_bytes(mem['reserved'])} "
            f"[{mem['source']}]"
        )
    if units := info.get("lease_units"):
        lines.append(f"lease units: {len(units)} (each a child's only device)")
        for unit in units:
            mem = unit["memory"]
            size = format_bytes(mem["total"]) if mem else "memory unavailable"
            lines.append(f"  GPU {unit['physical_index']}: {unit['value']} {unit['name']}, {size}")
    if judged := info.get("requirements_judged_on"):
        lines.append(f"requirements judged on: {judged['platform']}: {judged['reason']}")
    if table := info.get("capabilities"):
        from accelplat._capabilities import table_lines
        from accelplat._requirement import Capability

        lines.append("capabilities (device 0):")
        rows = table_lines({n: Capability(**c) for n, c in table.items()})
        lines.extend(f"  {row}" for row in rows)
    return "\n".join(shown(line) for line in lines)


def _run(args: argparse.Namespace) -> int:
    from accelplat._describe import collect_info
    from accelplat.replay import replaying

    with replaying(args.replay) if args.replay else contextlib.nullcontext() as replayer:
        info = collect_info()
    if replayer is not None and not args.json:
        bundle = replayer.bundle
        source, created, version = bundle.source, bundle.created, bundle.accelplat_version
        print(shown(f"replaying {source} (captured {created}, accelplat {version})"))
    # A capture records no host name, so a replayed description has none.
    info["hostname"] = None if args.replay else socket.gethostname()
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
    else:
        print(_render_text(info))
    if info["platform"]:
        return 0
    say(f"accelplat info: error: {shown(info['error'] or 'no platform detected')}")
    # Detection reports a configuration error (ACCELPLAT_PLATFORM=bogus) with no candidates.
    return EXIT_FAILED if info["candidates"] else EXIT_USAGE
