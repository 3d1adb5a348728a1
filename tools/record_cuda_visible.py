"""Record what CUDA itself makes visible for many ``CUDA_VISIBLE_DEVICES`` forms.

Ground truth for ``accelplat._visible.cuda``: for every form, a fresh Python process is started
with only that value of ``CUDA_VISIBLE_DEVICES`` (``CUDA_DEVICE_ORDER`` unset) and reports

* the CUDA driver's own answer: ``cuInit``'s result (and its error name), ``cuDeviceGetCount``
  and each visible device's UUID (through ``libcuda`` with ``ctypes``, no context created);
* torch's answer: ``torch.cuda.device_count()`` and each device's UUID from
  ``torch.cuda.get_device_properties`` (skipped when torch is missing).

The forms are built from the host's own GPU UUIDs (whole UUIDs, prefixes, case, dashes,
white space, separators, signs, leading zeros, hex, overflow, numerals of other scripts,
duplicates, empty entries, MIG spellings…). The result is one JSON file: the host's GPUs in
CUDA's order (what the driver reports with the variable unset), driver/CUDA/torch versions, and
one record per form. ``tests/visible/test_cuda_ground_truth.py`` replays every record through
the parser, mapping physical GPUs by UUID, so the file is valid on any host.

``--one-gpu`` hides every GPU but the first from the driver before recording (a private mount
namespace in which ``/dev`` holds only the first GPU's device node, as a container given one GPU
by the NVIDIA container toolkit has); it needs root and ``unshare``.

Subprocesses run in parallel (``--jobs``, default: the CPU count) and each result is appended
to ``<out>.jsonl`` as it arrives, so an interrupted run keeps what it measured.

Usage (from the repository root, on a host with NVIDIA GPUs)::

    python tools/record_cuda_visible.py --out cuda_visible.json [--one-gpu] [--jobs 16]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PROBE = r"""
import ctypes, json, sys
out = {}
try:
    lib = ctypes.CDLL("libcuda.so.1")
    rc = lib.cuInit(0)
    out["cu_init"] = rc
    if rc != 0:
        name = ctypes.c_char_p()
        lib.cuGetErrorName(rc, ctypes.byref(name))
        out["cu_error"] = (name.value or b"").decode()
        out["cu_count"] = 0
        out["cu_uuids"] = []
    else:
        n = ctypes.c_int(0)
        lib.cuDeviceGetCount(ctypes.byref(n))
        out["cu_count"] = n.value
        uuids = []
        for i in range(n.value):
            dev = ctypes.c_int(0)
            lib.cuDeviceGet(ctypes.byref(dev), i)
            raw = (ctypes.c_ubyte * 16)()
            lib.cuDeviceGetUuid(raw, dev)
            h = bytes(raw).hex()
            uuids.append("GPU-%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:]))
        out["cu_uuids"] = uuids
except Exception as exc:
    out["cu_exception"] = repr(exc)
if "--torch" in sys.argv:
    try:
        import torch
        n = torch.cuda.device_count()
        out["torch_count"] = n
        out["torch_uuids"] = [
            "GPU-" + str(torch.cuda.get_device_properties(i).uuid) for i in range(n)
        ]
    except Exception as exc:
        out["torch_exception"] = repr(exc)
print(json.dumps(out), flush=True)
"""

VERSIONS = r"""
import ctypes, json
out = {}
try:
    lib = ctypes.CDLL("libcuda.so.1")
    v = ctypes.c_int(0)
    lib.cuDriverGetVersion(ctypes.byref(v))
    out["cuda_driver_api"] = v.value
except Exception as exc:
    out["cuda_driver_api_error"] = repr(exc)
try:
    import pynvml
    pynvml.nvmlInit()
    d = pynvml.nvmlSystemGetDriverVersion()
    out["driver"] = d.decode() if isinstance(d, bytes) else d
    names = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        u = pynvml.nvmlDeviceGetUUID(h)
        n = pynvml.nvmlDeviceGetName(h)
        names.append({"nvml_index": i, "uuid": u.decode() if isinstance(u, bytes) else u,
                      "name": n.decode() if isinstance(n, bytes) else n})
    out["nvml_gpus"] = names
except Exception as exc:
    out["nvml_error"] = repr(exc)
try:
    import torch
    out["torch"] = torch.__version__
    out["torch_cuda"] = torch.version.cuda
except Exception as exc:
    out["torch_error"] = repr(exc)
print(json.dumps(out), flush=True)
"""


def _digits(uuid: str) -> str:
    return uuid[4:].replace("-", "")


def _dashed(hexdigits: str) -> str:
    h = hexdigits
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def build_forms(uuids: list[str]) -> list[str | None]:
    """Return every form to record, built from the host's GPU UUIDs in CUDA order."""
    n = len(uuids)
    u0 = uuids[0]
    d0 = _digits(u0)
    forms: list[str | None] = [None, "", " ", "\t", ",", ",,", "NoDevFiles", "none", "all"]
    # Ordinals: signs, white space, zeros, hex, floats, overflow, truncation to 32 bits.
    forms += [
        "0",
        str(n - 1),
        str(n),
        "-1",
        "-0",
        "+0",
        "+1",
        "--0",
        "+-0",
        "-+0",
        "00",
        "000",
        "01",
        "0001",
        "0x0",
        "0x1",
        "0X1",
        "0b1",
        "0o1",
        "1e0",
        "0.0",
        "1.0",
        "0.5",
        "1.",
        ".1",
        " 0",
        "0 ",
        " 0 ",
        "\t0",
        "\n0",
        "\v0",
        "\f0",
        "\r0",
        "0\t",
        "0\n",
        "  +0",
        "+ 0",
        "- 0",
        "0abc",
        "0-1",
        "0 1",
        "0;1",
        "0:1",
        "0|1",
        "0/1",
        "0_0",
        "0,",
        "0,,",
        "0, ",
        ",0",
        " ,0",
        "0,,0",
        "4294967296",
        "4294967297",
        "2147483648",
        "-2147483648",
        "-4294967295",
        "18446744073709551615",
        "18446744073709551616",
        "-18446744073709551615",
        "-18446744073709551616",
        "9" * 25,
        "0" * 40 + "1",
        "4294967296" + "0" * 10,
        "\u0660",
        "\u0661",
        "\uff10",
        "\uff11",
        "\u00b9",
        "\u2460",
        "\U0001d7ce",
        "\u0967",
        "\u00a00",
        "\u20030",
        "0\u00a0",
        "\u200b0",
        "\ufeff0",
        "零",
        "٠,1",
    ]
    # UUIDs: whole, prefixes of every length, case, dashes, white space, trailing text.
    forms += [u0, "GPU-" + d0, "GPU-" + d0.upper(), "GPU-" + _dashed(d0).upper()]
    forms += [u0[:k] for k in (4, 5, 6, 8, 12, 13, 14, 20, 30, 39)]
    forms += [
        "gpu-" + u0[4:],
        "Gpu-" + u0[4:],
        "GPU_" + u0[4:],
        "GPU" + u0[4:],
        "GPU-" + u0[4:12].upper(),
        "GPU--" + u0[4:],
        "GPU-" + "-".join(d0),
        "GPU-" + d0[:4] + "--" + d0[4:12],
        "GPU-" + d0 + "0",
        "GPU-" + d0 + "x",
        u0 + "x",
        u0 + "-",
        u0 + "0",
        u0 + " ",
        u0 + "\t",
        " " + u0,
        "\t" + u0,
        u0[:12] + " ",
        u0[:12] + "x",
        u0[:12] + "-x",
        u0[:12] + "g",
        "GPU-" + "g" + d0[1:12],
        "GPU- " + u0[4:],
        "GPU-{" + u0[4:] + "}",
        "GPU-0x" + d0[:8],
        "GPU-" + d0[:8] + "Z" + d0[8:],
        "GPU-ffffffff",
        "GPU-ffffffff-ffff-ffff-ffff-ffffffffffff",
        "GPU-00000000",
        "GPU-" + ("f" if d0[0] != "f" else "e"),
        "GPU-",
        "GPU-\u0661",
        u0[4:],
        d0,
        _dashed(d0),
        "{" + u0[4:] + "}",
    ]
    # Mixed forms, duplicates, separators after UUIDs.
    forms += [
        f"{u0},0",
        f"0,{u0}",
        f"{u0},{u0}",
        f"{u0},{u0[:12]}",
        f"{u0[:12]},{u0}",
        f"{u0},GPU-{d0.upper()}",
        f"{u0},GPU-ffffffff",
        f"{u0},GPU-ffffffff,{u0}",
        f"{u0},",
        f",{u0}",
        f"{u0},,",
        f"{u0}, {u0}",
        f"{u0};{u0}",
        f"{u0} {u0}",
        "0,0",
        f"0,{n}",
        f"0,{n},0",
        "0,-1",
        "0,x",
        "0,x,0",
        "0,+0",
        "0,00",
        "0,-0",
        f"0,{u0[:12]}",
        "0,GPU-ffffffff",
        "NoDevFiles,0",
    ]
    # MIG spellings on GPUs without MIG devices.
    forms += [
        "MIG-",
        "MIG-" + u0[4:],
        "MIG-" + d0[:12],
        "MIG-GPU-" + u0[4:],
        f"MIG-{u0}/0/0",
        f"MIG-{u0}/1/0",
        f"MIG-{u0[:12]}/0/0",
        f"MIG-{u0}/0",
        f"{u0}/0/0",
        "mig-" + u0[4:],
        f"{u0},MIG-{u0[4:]}",
        f"MIG-{u0[4:]},{u0}",
        "MIG-ffffffff",
    ]
    if n >= 2:
        u1 = uuids[1]
        d1 = _digits(u1)
        common = next((d0[:i] for i in range(len(d0), 0, -1) if d1.startswith(d0[:i])), "")
        forms += [
            "1",
            "1,0",
            "0,1",
            "0, 1",
            "0 ,1",
            " 0 , 1 ",
            "0,1,",
            "0,,1",
            "0;1",
            "1 0",
            "0,1,0",
            "1,1",
            "1,0,1",
            "+1,-0",
            "01,00",
            "1gpu2,0",
            "1,x,0",
            f"1,{n},0",
            "4294967297,0",
            "0,4294967297",
            "-18446744073709551615,0",
            "\u0661,0",
            "0,\u0661",
            u1,
            f"{u1},{u0}",
            f"{u0},{u1}",
            f"{u1[:12]},0",
            f"0,{u1}",
            f"{u1},0",
            f"{u1[:12]},{u0[:12]}",
            f"GPU-{d1.upper()},{u0}",
            f"{u0},{u1},{u0}",
            f"{u0},GPU-ffffffff,{u1}",
            f"{u0},,{u1}",
            f"{u0}, {u1}",
            f"{u0} ,{u1}",
            f"{u1[:9]}",
            f"{u1}x,{u0}",
            f"{u0},1",
            f"1,{u0}",
            f"MIG-{u1}/0/0,{u0}",
        ]
        if common:
            forms += ["GPU-" + common, f"GPU-{common},{u0}", "GPU-" + common.upper()]
        else:
            forms += ["GPU-" + d0[0] + d1[0]]
    # No duplicates, order kept.
    seen: set[str | None] = set()
    unique: list[str | None] = []
    for form in forms:
        if form not in seen:
            seen.add(form)
            unique.append(form)
    return unique


def _env(form: str | None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "PYTORCH_NVML_BASED_CUDA_CHECK")
    }
    if form is not None:
        env["CUDA_VISIBLE_DEVICES"] = form
    return env


def probe(form: str | None, use_torch: bool, timeout: float) -> dict[str, Any]:
    """Run one fresh process with ``form`` and return its report (never raises)."""
    args = [sys.executable, "-c", PROBE] + (["--torch"] if use_torch else [])
    started = time.monotonic()
    try:
        done = subprocess.run(
            args, env=_env(form), capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return {"form": form, "error": f"timed out after {timeout} s"}
    result: dict[str, Any] = {"form": form}
    lines = done.stdout.strip().splitlines()
    try:
        result.update(json.loads(lines[-1]))
    except (IndexError, ValueError):
        result["error"] = f"rc {done.returncode}: {done.stderr[-500:]}"
    result["seconds"] = round(time.monotonic() - started, 2)
    return result


def main() -> int:
    """Record every form (see the module docstring); return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="JSON file to write")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 4)
    parser.add_argument("--no-torch", action="store_true", help="record the driver only")
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds per form")
    parser.add_argument("--config", default=None, help="name of this configuration")
    parser.add_argument("--one-gpu", action="store_true", help="hide all GPUs but the first")
    ns = parser.parse_args()
    if ns.one_gpu and not os.environ.get("_ACCELPLAT_REC_INNER"):
        return _reexec_with_one_gpu(ns)
    versions = json.loads(
        subprocess.run(
            [sys.executable, "-c", VERSIONS], capture_output=True, text=True, check=False
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    base = probe(None, False, ns.timeout)
    uuids = base.get("cu_uuids") or []
    if not uuids:
        print(f"no CUDA device visible: {base}", file=sys.stderr)
        return 1
    forms = build_forms(uuids)
    print(f"{len(uuids)} GPU(s), {len(forms)} forms, {ns.jobs} jobs", flush=True)
    partial = ns.out.with_suffix(".jsonl")
    records: list[dict[str, Any]] = []
    started = time.monotonic()
    header = {"header": True, "versions": versions, "gpus_in_cuda_order": uuids}
    with (
        partial.open("w", encoding="utf-8") as sink,
        concurrent.futures.ThreadPoolExecutor(ns.jobs) as pool,
    ):
        sink.write(json.dumps(header) + "\n")
        futures = {
            pool.submit(probe, f, not ns.no_torch, ns.timeout): i for i, f in enumerate(forms)
        }
        for future in concurrent.futures.as_completed(futures):
            record = future.result()
            record["order"] = futures[future]
            records.append(record)
            sink.write(json.dumps(record) + "\n")
            sink.flush()
    records.sort(key=lambda r: r.pop("order"))
    data = {
        "config": ns.config or ("one-gpu" if ns.one_gpu else f"{len(uuids)}-gpu"),
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": platform.python_version(),
        "versions": versions,
        "gpus_in_cuda_order": uuids,
        "seconds": round(time.monotonic() - started, 1),
        "records": records,
    }
    ns.out.write_text(json.dumps(data, indent=1, ensure_ascii=True) + "\n", encoding="utf-8")
    print(f"wrote {len(records)} records to {ns.out} in {data['seconds']} s", flush=True)
    return 0


_ONE_GPU_SETUP = r"""
set -e
mkdir -p /tmp/_rec_olddev
mount --bind /dev /tmp/_rec_olddev
mount -t tmpfs -o mode=755 none /dev
for f in null zero full random urandom tty ptmx nvidiactl nvidia-uvm nvidia-uvm-tools \
         nvidia-modeset nvidia0 shm pts mqueue fd stdin stdout stderr nvidia-caps; do
  src=/tmp/_rec_olddev/$f
  [ -e "$src" ] || [ -L "$src" ] || continue
  if [ -L "$src" ]; then cp -P "$src" /dev/$f; continue; fi
  if [ -d "$src" ]; then mkdir -p /dev/$f; else : > /dev/$f; fi
  mount --bind "$src" /dev/$f
done
mount -o remount,ro,bind /dev || mount -o remount,ro /dev || true
ls /dev | tr '\n' ' '; echo
exec "$@"
"""


def _reexec_with_one_gpu(ns: argparse.Namespace) -> int:
    """Re-run this script in a private mount namespace whose /dev has only the first GPU."""
    if shutil.which("unshare") is None:
        print("--one-gpu needs unshare(1)", file=sys.stderr)
        return 3
    env = dict(os.environ, _ACCELPLAT_REC_INNER="1")
    args = list(sys.argv[1:])
    cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", _ONE_GPU_SETUP, "sh"]
    cmd += [sys.executable, __file__, *args]
    return subprocess.run(cmd, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
