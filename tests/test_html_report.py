"""The HTML report as a person sees it: `opdump compare --html` on the
battery's Llama (CPU against testdev with silu scaled by 1.01), opened in
headless Chromium at a wide and a narrow window. The module tree and the
plot must be drawn, the path to the fault open, and clicking a module (the
page's fragment) must hide the other modules' points. `opdump summary
--html` on the reference dump draws the same tree with op calls and NaN/Inf
counts per module.

Skipped where Chromium is not installed (CI installs none)."""

import json
import re
import shutil
import struct
import subprocess
import tempfile
import zlib
from pathlib import Path

import pytest

from conftest import CLI
from tests.battery import run as battery

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed")

FAULT = "aten::silu=scale:1.01"
# The plot's point colours (report/compare/html.rs): introduced, within tolerance.
RED = (0xD6, 0x27, 0x28)
BLUE = (0x4A, 0x78, 0xB5)


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    out = tmp_path_factory.mktemp("html-report")
    a = battery.dump("llama", "cpu", out)[0]
    b = battery.dump("llama", "testdev", out, fault=FAULT)[0]
    return out, a, b


@pytest.fixture(scope="module")
def page(dumps):
    out, a, b = dumps
    html = out / "report.html"
    p = subprocess.run([str(CLI), "compare", str(a), str(b), "--html", str(html)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 1, p.stdout + p.stderr
    _, report = battery.compare(a, b)
    return html, report["first_introduced"]["module"]


@pytest.fixture(scope="module")
def summary_page(dumps):
    """`opdump summary --html` of A, with its JSON."""
    out, a, _ = dumps
    html = out / "summary.html"
    p = subprocess.run([str(CLI), "summary", str(a), "--html", str(html)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    p = subprocess.run([str(CLI), "summary", str(a), "--json"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return html, json.loads(p.stdout)["ranks"][0]


def ancestry(module):
    """`layers.0` -> ["layers", "layers.0"]."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def chromium(url, *args, width, height=1000):
    """Runs headless Chromium on `url` with `args`; returns its stdout."""
    with tempfile.TemporaryDirectory() as profile:
        p = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
             f"--user-data-dir={profile}", f"--window-size={width},{height}", *args, url],
            capture_output=True, text=True, timeout=120, cwd=profile)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout


def screenshot(url, png, width):
    chromium(url, f"--screenshot={png}", width=width)
    return decode_png(Path(png).read_bytes())


def decode_png(data):
    """(width, height, rows of RGB tuples) of an 8-bit RGB or RGBA PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    bpp = 3 if color == 2 else 4
    raw = zlib.decompress(idat)
    stride = w * bpp
    prev = bytearray(stride)
    rows = []
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        unfilter(f, line, prev, bpp)
        rows.append([tuple(line[x:x + 3]) for x in range(0, stride, bpp)])
        prev = line
    return w, h, rows


def unfilter(f, line, prev, bpp):
    """Undoes PNG filter `f` on `line` in place (`prev`: the line above)."""
    if f == 0:
        return
    if f == 2:
        line[:] = bytes((a + b) & 0xFF for a, b in zip(line, prev))
        return
    for i in range(len(line)):
        left = line[i - bpp] if i >= bpp else 0
        up = prev[i]
        if f == 1:
            line[i] = (line[i] + left) & 0xFF
        elif f == 3:
            line[i] = (line[i] + (left + up) // 2) & 0xFF
        else:
            ul = prev[i - bpp] if i >= bpp else 0
            p = left + up - ul
            pa, pb, pc = abs(p - left), abs(p - up), abs(p - ul)
            pred = left if pa <= pb and pa <= pc else up if pb <= pc else ul
            line[i] = (line[i] + pred) & 0xFF


def count(rows, colour):
    return sum(row.count(colour) for row in rows)


def colours(rows):
    return {px for row in rows for px in row}


@pytest.mark.parametrize("width", [1280, 480])
def test_tree_and_plot_are_drawn(page, tmp_path, width):
    page, fault_module = page
    dom = chromium(page.as_uri(), "--dump-dom", width=width)
    # The plot with its points, the fault's triangle among them.
    assert re.search(r'<svg[^>]*class="plot"', dom)
    assert dom.count('class="pt ') > 50
    assert re.search(r'<path class="pt [^"]*" d="M[^"]*" fill="#d62728"><title>aten::silu', dom)
    # The tree: the path to the fault open, its modules nested.
    open_paths = re.findall(r'<details class="mod[^"]*" data-path="([^"]*)" data-worst="[^"]*" open', dom)
    assert open_paths == ancestry(fault_module)
    assert "\u25b2 aten::silu" in dom
    _, _, rows = screenshot(page.as_uri(), tmp_path / "page.png", width)
    assert len(colours(rows)) > 50, "the page looks blank"
    assert count(rows, RED) > 20, "no introduced triangle or marker drawn"
    assert count(rows, BLUE) > 20, "no points within tolerance drawn"


def test_clicking_a_module_filters_the_plot(page, tmp_path):
    page, _ = page
    html = page.read_text()
    # The first module link and the id its filter line has.
    target = re.search(r'<a href="#(m\d+)">([^<]*)</a>', html).group(1)
    full = screenshot(page.as_uri(), tmp_path / "all.png", 1280)[2]
    filtered = screenshot(page.as_uri() + "#" + target, tmp_path / "one.png", 1280)[2]
    # The filter line shows; some points of other modules are gone.
    dom = chromium(page.as_uri() + "#" + target, "--dump-dom", width=1280)
    assert f'class="flt" id="{target}"' in dom
    assert 0 < count(filtered, BLUE) < count(full, BLUE)


def test_summary_tree_is_drawn(summary_page, tmp_path):
    page, rank = summary_page
    dom = chromium(page.as_uri(), "--dump-dom", width=1280)
    nodes = re.findall(r'<details class="mod[^"]*" data-path="([^"]*)" data-calls="(\d+)" data-nan="(\d+)" '
                       r'data-inf="(\d+)"( open)?', dom)
    assert nodes, "no module tree"
    calls = {path: (int(c), int(n), int(i)) for path, c, n, i, _ in nodes}
    # Each innermost module's calls are in its node and every ancestor's; the
    # top-level nodes add up to every call of the dump.
    for m in rank["per_module"]:
        for up in ancestry(m["module"]):
            assert calls[up][0] >= m["calls"], (up, m)
    tops = [p for p in calls if "." not in p]
    assert sum(calls[p][0] for p in tops) == rank["dump"]["op_calls"]
    assert sum(calls[p][1] for p in tops) == sum(m["calls_nan_out"] for m in rank["per_module"]) \
        + rank["calls_outside_modules_nan_out"]
    # The path to where NaN or Inf first came from finite inputs is open.
    first = (rank["first_nonfinite_from_finite"] or {}).get("module")
    if first:
        assert [p for p, *_, o in nodes if o] == ancestry(first)
    _, _, rows = screenshot(page.as_uri(), tmp_path / "summary.png", 1280)
    assert len(colours(rows)) > 20, "the page looks blank"
