"""The timeline report as a person sees it: rendered by a real headless Chromium.

Skips when no Chromium is installed (Debian: ``apt-get install chromium``). The page is built
from a scripted two-device session (a test double at the platform boundary): an engine start-up
with lazy release, a settle wait, a tensor-parallel test, a test that leaks 6 GiB on device 0.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import struct
import subprocess
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from html.parser import HTMLParser
from pathlib import Path

import pytest

from accelplat._platform import BasePlatform
from accelplat._types import GIB, DeviceInfo, MemoryInfo, ProbeResult
from accelplat.timeline import DeviceTrack, Recorder, Sample, TestSpan, Trace, write_report
from accelplat.timeline._render import render_html

_BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def _browser() -> str | None:
    override = os.environ.get("ACCELPLAT_TEST_CHROMIUM")
    if override:
        return override
    for name in _BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    return None


BROWSER = _browser()  # read at import: the root conftest clears ACCELPLAT_* around each test
KEEP_SCREENSHOT = os.environ.get("ACCELPLAT_TIMELINE_SCREENSHOT")  # copy the screenshot here
needs_browser = pytest.mark.skipif(
    BROWSER is None,
    reason="no Chromium found (install it, e.g. `apt-get install chromium`, to render the "
    "timeline report in a real browser)",
)

# --------------------------------------------------------------------------------------------
# a scripted session

H200_TOTAL = 140 * GIB
IDLE = GIB // 2


class ScriptedGpu(BasePlatform):
    """Two devices whose used memory follows a function of the (fake) time."""

    name = "simulated"
    device_type = "cuda"

    def __init__(self, usage: Callable[[int, float], float], clock: Callable[[], float]) -> None:
        self._usage = usage
        self._clock = clock

    @classmethod
    def probe(cls) -> ProbeResult:
        return ProbeResult(True, "scripted")

    def devices(self) -> Sequence[DeviceInfo]:
        return [DeviceInfo(i, i, "Simulated H200") for i in range(2)]

    def _memory_info(self, device: int) -> MemoryInfo:
        used = int(self._usage(device, self._clock()))
        return MemoryInfo(free=H200_TOTAL - used, total=H200_TOTAL, used=used, source="script")


def _ramp(t: float, t0: float, t1: float, lo: float, hi: float) -> float:
    if t <= t0:
        return lo
    if t >= t1:
        return hi
    return lo + (hi - lo) * (t - t0) / (t1 - t0)


def _usage(device: int, t: float) -> float:
    used = float(IDLE)
    if device == 0:  # engine start-up, tensor parallel 1: weights, then KV cache, lazy release
        used += _ramp(t, 0.4, 1.8, 0, 16 * GIB) + _ramp(t, 2.0, 2.3, 0, 108 * GIB)
        used -= _ramp(t, 5.2, 7.2, 0, 124 * GIB)
    # tensor parallel 2 on both devices
    used += _ramp(t, 7.8, 8.6, 0, 8 * GIB) + _ramp(t, 8.8, 9.0, 0, 100 * GIB)
    used -= _ramp(t, 11.0, 11.3, 0, 108 * GIB)
    if device == 0:  # a test that forgets a 6 GiB buffer
        used += _ramp(t, 12.0, 12.4, 0, 6 * GIB)
    used += 2 * GIB if 14.6 < t < 15.2 else 0  # a small op that frees what it takes
    return used


LEAKY = "tests/models/test_kv_cache.py::test_prefix_cache_reuse[tp2]"
TESTS = (
    ("tests/engine/test_startup.py::test_engine_starts[tp1]", 0.2, 5.4, "passed"),
    ("tests/engine/test_generate.py::test_generate[tp2]", 5.6, 11.5, "passed"),
    (LEAKY, 11.7, 14.0, "passed"),
    ("tests/ops/test_small_ops.py::test_rms_norm", 14.4, 15.5, "passed"),
    ("tests/ops/test_small_ops.py::test_rotary[fp8]", 15.6, 16.4, "failed"),
)
WAIT = (5.7, 7.25)  # the settle fixture of test_generate waits for the lazy release


def build_demo_trace() -> Trace:
    """Record the scripted session at 20 samples per second on a fake clock."""
    now = [0.0]
    gpu = ScriptedGpu(_usage, lambda: now[0])
    rec = Recorder(gpu, hz=20, clock=lambda: now[0], wall_clock=lambda: 1_767_225_600.0)
    events: list[tuple[float, int, Callable[[], None]]] = []
    for nodeid, start, end, outcome in TESTS:
        events.append((start, 0, lambda n=nodeid: rec.begin_test(n)))
        body = WAIT[1] + 0.05 if nodeid == TESTS[1][0] else start + 0.1  # after the settle wait
        events.append((body, 2, lambda n=nodeid: rec.begin_body(n)))
        events.append((end, 2, lambda n=nodeid, o=outcome: rec.end_test(n, o)))
    token: list[int] = []
    events.append((WAIT[0], 1, lambda: token.append(rec.begin_wait("settle", [0, 1]))))
    events.append((WAIT[1], 1, lambda: rec.end_wait(token[0])))
    events.sort(key=lambda e: (e[0], e[1]))
    rec.sampler.sample()
    step = 0.05
    for i in range(1, int(16.8 / step) + 1):
        t = i * step
        while events and events[0][0] <= t:
            when, _, action = events.pop(0)
            now[0] = when
            action()
        now[0] = t
        rec.sampler.sample()
    return rec.stop()


def _long_wait_usage(device: int, t: float) -> float:
    if device == 1:
        return 20 * GIB  # flat all along
    used = IDLE + _ramp(t, 0.3, 2.0, 0, 60 * GIB) - _ramp(t, 4.0, 5.0, 0, 40 * GIB)
    used += _ramp(t, 5.2, 5.6, 0, 30 * GIB) - _ramp(t, 5.8, 6.0, 0, 30 * GIB)
    return used - _ramp(t, 120.0, 125.0, 0, 20 * GIB)


LONG_TESTS = (
    (
        "tests/entrypoints/openai/test_chat.py::test_stream[meta-llama/Llama-3.1-8B-Instruct]",
        0.1,
        3.0,
    ),
    ("tests/entrypoints/openai/test_chat.py::test_logprobs", 3.1, 5.9),
    ("tests/v1/engine/test_engine_shutdown.py::test_shutdown_frees_memory[tp1-fp8]", 6.0, 128.0),
)


def build_long_wait_trace() -> Trace:
    """Six busy seconds (the first test keeps 20 GiB), then a two-minute settle wait; 10 Hz."""
    now = [0.0]
    gpu = ScriptedGpu(_long_wait_usage, lambda: now[0])
    rec = Recorder(gpu, hz=10, clock=lambda: now[0], wall_clock=lambda: 1_767_225_600.0)
    events: list[tuple[float, int, Callable[[], None]]] = []
    for nodeid, start, end in LONG_TESTS:
        events.append((start, 0, lambda n=nodeid: rec.begin_test(n)))
        events.append((start + 0.05, 1, lambda n=nodeid: rec.begin_body(n)))
        events.append((end, 3, lambda n=nodeid: rec.end_test(n, "passed")))
    token: list[int] = []
    events.append((6.1, 2, lambda: token.append(rec.begin_wait("settle", [0]))))
    events.append((126.0, 2, lambda: rec.end_wait(token[0])))
    events.sort(key=lambda e: (e[0], e[1]))
    rec.sampler.sample()
    for i in range(1, 1301):
        t = i * 0.1
        while events and events[0][0] <= t:
            when, _, action = events.pop(0)
            now[0] = when
            action()
        now[0] = t
        rec.sampler.sample()
    return rec.stop()


# --------------------------------------------------------------------------------------------
# browser and image helpers


def _run_browser(args: Sequence[str], profile: Path) -> subprocess.CompletedProcess[str]:
    assert BROWSER is not None
    cmd = [
        BROWSER,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def _add(a: bytes, b: bytes) -> bytes:
    """Bytewise ``(a + b) % 256``, all bytes at once: the low seven bits of each are summed (no
    carry can leave a byte), then each top bit is the carry in xor both top bits."""
    low = bytes(len(a)).replace(b"\0", b"\x7f")
    x, y, m = int.from_bytes(a, "big"), int.from_bytes(b, "big"), int.from_bytes(low, "big")
    return (((x & m) + (y & m)) ^ ((x ^ y) & ~m)).to_bytes(len(a), "big")


def _decode_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """Return ``(width, height, rows of RGB bytes)`` of an 8-bit, non-interlaced PNG.

    The "up" and "sub" filters are undone a whole row at a time (a row of additions, and a
    prefix sum by doubling), which is what makes a 1280 px screenshot quick to read; "average"
    and "paeth" byte by byte.
    """
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    width = height = channels = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8, depth
            assert interlace == 0
            channels = {2: 3, 6: 4}[color]
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    raw = zlib.decompress(idat)
    stride = width * channels
    rows: list[bytes] = []
    prev = bytes(stride)
    for y in range(height):
        filt = raw[y * (stride + 1)]
        line = raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]
        if filt == 1:  # sub: a prefix sum per channel
            shift = channels
            while shift < stride:
                line = _add(line, bytes(shift) + line[:-shift])
                shift *= 2
        elif filt == 2:  # up
            line = _add(line, prev)
        elif filt in (3, 4):
            out = bytearray(line)
            for x in range(stride):
                a = out[x - channels] if x >= channels else 0
                b = prev[x]
                if filt == 3:
                    out[x] = (out[x] + (a + b) // 2) & 0xFF
                    continue
                c = prev[x - channels] if x >= channels else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                out[x] = (out[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
            line = bytes(out)
        prev = line
        rgb = line if channels == 3 else bytes(v for i, v in enumerate(line) if i % 4 != 3)
        rows.append(rgb)
    return width, height, rows


def _pixels(row: bytes) -> zip[tuple[int, int, int]]:
    return zip(row[0::3], row[1::3], row[2::3], strict=True)


def _histogram(rows: list[bytes]) -> Counter[tuple[int, int, int]]:
    """Count the pixels of each colour (RGB keys)."""
    hist: Counter[tuple[int, int, int]] = Counter()
    for row in rows:
        hist.update(_pixels(row))
    return hist


def _count_colour(
    hist: Counter[tuple[int, int, int]], rgb: tuple[int, int, int], tol: int = 12
) -> int:
    return sum(
        n for colour, n in hist.items() if all(abs(colour[k] - rgb[k]) <= tol for k in range(3))
    )


class _Dom(HTMLParser):
    """Collects elements by class and the text of table rows."""

    def __init__(self) -> None:
        super().__init__()
        self.classes: dict[str, list[dict[str, str]]] = {}
        self.rows: list[tuple[str, str]] = []  # (row class, text)
        self._row: tuple[str, list[str]] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        for cls in a.get("class", "").split():
            self.classes.setdefault(cls, []).append(a)
        if tag == "tr":
            self._row = (a.get("class", ""), [])

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr" and self._row is not None:
            self.rows.append((self._row[0], " ".join(self._row[1]).strip()))
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._row is not None and data.strip():
            self._row[1].append(data.strip())


# --------------------------------------------------------------------------------------------
# the tests


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("report") / "timeline.html"
    return write_report(build_demo_trace(), path, title="Device memory timeline")


def test_demo_trace_has_the_planted_leak() -> None:
    trace = build_demo_trace()
    leaks = trace.leaks()
    assert [(leak.nodeid, leak.device) for leak in leaks] == [(LEAKY, 0)]
    assert leaks[0].leaked == 6 * GIB
    (wait,) = trace.waits
    assert wait.test == TESTS[1][0]


@needs_browser
def test_browser_dom_lists_tests_and_highlights_the_leak(report: Path, tmp_path: Path) -> None:
    done = _run_browser(["--dump-dom", report.as_uri()], tmp_path / "profile")
    assert done.returncode == 0, done.stderr[-2000:]
    dom = _Dom()
    dom.feed(done.stdout)
    # per device a chart for desktops and one for phones (CSS shows one), each at two scales
    assert len(dom.classes.get("fit-scale", [])) == 4
    assert len(dom.classes.get("full-scale", [])) == 4  # the full scale hidden
    assert len(dom.classes.get("phone", [])) == 4
    assert len(dom.classes.get("used", [])) == 8  # with a drawn memory line each
    peaks = [a["data-peak"] for a in dom.classes.get("peak", []) if "data-peak" in a]
    assert peaks == [str(124 * GIB + IDLE), str(108 * GIB + IDLE)]  # named per device
    labels = {a["data-nodeid"] for a in dom.classes.get("lane-label", [])}
    assert {TESTS[0][0], TESTS[1][0], LEAKY} <= labels  # the long tests carry their names
    leak_rows = [text for cls, text in dom.rows if cls == "leak"]
    # the leak table row and the test table row of the leaking test, and nothing else
    assert len(leak_rows) == 2
    assert all(LEAKY in text for text in leak_rows)
    assert any("+6.00 GiB" in text for text in leak_rows)
    listed = " ".join(text for _, text in dom.rows)
    for nodeid, *_ in TESTS:
        assert nodeid in listed
    leaked_bands = [a["data-nodeid"] for a in dom.classes.get("leaked", [])]
    assert leaked_bands == [LEAKY] * 4  # on the device it leaked on only, in all four charts
    wait_rows = [text for cls, text in dom.rows if cls == "wait"]
    assert len(wait_rows) == 1
    assert "1.55 s" in wait_rows[0]
    assert TESTS[1][0] in wait_rows[0]


@needs_browser
def test_browser_screenshot_shows_chart_and_leak(report: Path, tmp_path: Path) -> None:
    shot = tmp_path / "timeline.png"
    done = _run_browser(
        [f"--screenshot={shot}", "--window-size=1400,1000", report.as_uri()], tmp_path / "profile"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    width, height, rows = _decode_png(shot.read_bytes())
    assert (width, height) == (1400, 1000)
    hist = _histogram(rows)
    line = _count_colour(hist, (0x1F, 0x77, 0xB4))  # device 0's memory line
    leak = _count_colour(hist, (0xD6, 0x27, 0x28))  # the leaking test's lane and marker
    wait = _count_colour(hist, (0xFF, 0x7F, 0x0E))  # the settle wait
    white = _count_colour(hist, (0xFF, 0xFF, 0xFF), tol=2)
    assert line > 300, line
    assert leak > 1000, leak  # far more than the legend's swatch (180 pixels)
    assert wait > 100, wait
    assert white < width * height * 0.9  # something was drawn
    if KEEP_SCREENSHOT:
        shutil.copyfile(shot, KEEP_SCREENSHOT)


@needs_browser
@pytest.mark.parametrize(("width", "name"), [(390, "phone"), (1280, "desktop")])
def test_browser_long_wait_is_folded_at_phone_and_desktop_width(
    tmp_path: Path, width: int, name: str
) -> None:
    """A two-minute wait folds to a band; the phone gets its own chart, drawn across its width."""
    report = write_report(build_long_wait_trace(), tmp_path / "long.html")
    shot = tmp_path / f"long-{name}.png"
    done = _run_browser(
        [f"--screenshot={shot}", f"--window-size={width},1800", report.as_uri()],
        tmp_path / "profile",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    shot_width, _, rows = _decode_png(shot.read_bytes())
    assert shot_width == width
    hist = _histogram(rows)
    assert _count_colour(hist, (0x1F, 0x77, 0xB4), tol=20) > width // 2  # device 0's line

    # The chart is drawn for the width: the desktop chart scaled down to a phone leaves device
    # 0's line too thin to keep its colour (10 pixel rows show it: the legend's swatch); the
    # phone's own chart shows it on 124 rows, the desktop on 220.
    def near(pixel: tuple[int, int, int]) -> bool:
        return all(abs(pixel[k] - (0x1F, 0x77, 0xB4)[k]) <= 40 for k in range(3))

    tall = sum(any(near(pixel) for pixel in set(_pixels(row))) for row in rows)
    assert tall > 100, tall
    # the folded band, where no wait tints it (device 1's chart)
    assert _count_colour(hist, (0xEC, 0xEE, 0xF1), tol=1) > 1000
    assert _count_colour(hist, (0xD6, 0x27, 0x28)) > 300  # the leaking test's lane and marker


_LINES_PROBE = """<script>
const out = [];
const cells = "#tests td[data-label='Start'], #tests td[data-label='Took']";
for (const td of document.querySelectorAll(cells)) {
  const range = document.createRange();
  range.selectNodeContents(td);
  const lines = new Set([...range.getClientRects()].map((r) => Math.round(r.top)));
  out.push([td.textContent, lines.size]);
}
const pre = document.createElement("pre");
pre.id = "probe";
pre.textContent = JSON.stringify(out);
document.body.append(pre);
</script></body>"""


@needs_browser
def test_start_and_took_keep_their_units_on_one_line_at_1280_px(tmp_path: Path) -> None:
    """Eight devices: the tests table is wider than the page, and its times never wrap."""
    n = 8
    samples = tuple(Sample(t * 0.5, tuple(GIB * (1 + t % 3) for _ in range(n))) for t in range(400))
    ids = ["tests/models/test_a_rather_long_module_name.py::test_generation[meta-llama-3.1-8b]"] * 3
    tests = tuple(
        TestSpan(f"{nodeid}-{k}", 60.0 * k + 0.5, 60.0 * k + 59.0, (GIB,) * n, (GIB,) * n, "passed")
        for k, nodeid in enumerate(ids)
    )
    trace = Trace(
        devices=tuple(DeviceTrack(i, "Simulated GPU", 80 * GIB) for i in range(n)),
        samples=samples,
        tests=tests,
        duration=200.0,
        sample_hz=2.0,
    )
    page = tmp_path / "probe.html"
    page.write_text(render_html(trace).replace("</body>", _LINES_PROBE))
    done = _run_browser(["--window-size=1280,800", "--dump-dom", page.as_uri()], tmp_path / "p")
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.search(r'<pre id="probe">(.*?)</pre>', done.stdout, re.DOTALL)
    assert found is not None, done.stdout[-2000:]
    lines = json.loads(html.unescape(found.group(1)))
    assert len(lines) == 6  # Start and Took of three tests
    assert {n for _, n in lines} == {1}, lines  # "58.50 s", not "58.50" over "s"
