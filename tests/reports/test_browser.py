"""report.html in headless Chromium: loads without console errors, every image decodes, tables.

Chromium runs from the command line only (--dump-dom, --screenshot): a probe script added to a
copy of the page records errors and each image's natural size into the DOM, which --dump-dom
returns; console messages also reach stderr with --enable-logging. CI installs Debian's
chromium (.ci/run); elsewhere the test is skipped if it is absent.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hetbench.reports.report import write_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium; .ci/run does)")

# First in <head>: record script errors, console.error/warn and failed resource loads.
HOOK = """<script>
window.__errors = [];
window.addEventListener("error", function (e) {
  window.__errors.push(e.message || ("failed to load " + (e.target.src || e.target.tagName)));
}, true);
["error", "warn"].forEach(function (level) {
  var original = console[level];
  console[level] = function () {
    window.__errors.push(level + ": " + Array.from(arguments).join(" "));
    original.apply(console, arguments);
  };
});
</script>"""
# Last in <body>: after load, write what the test checks into the DOM: the page's own width
# against the window's, where the headline figure starts, and a table sorted by a click.
PROBE = """<script>
function layout() {
  var headline = document.getElementById("headline");
  var table = Array.from(document.querySelectorAll("table.sortable")).sort(function (a, b) {
    return b.rows.length - a.rows.length; })[0];
  var column = function () {
    return table ? Array.from(table.tBodies[0].rows).map(function (r) {
      return r.cells[0].textContent.trim(); }) : []; };
  var before = column();
  if (table) { table.querySelector("thead th").click(); }
  return {scrollWidth: document.documentElement.scrollWidth, innerWidth: window.innerWidth,
          innerHeight: window.innerHeight,
          headlineTop: headline ? headline.getBoundingClientRect().top : null,
          before: before, after: column()};
}
window.addEventListener("load", function () {
  var out = document.createElement("pre");
  out.id = "probe";
  out.textContent = JSON.stringify({
    errors: window.__errors,
    images: Array.from(document.images).map(function (i) {
      return {alt: i.alt, width: i.naturalWidth, height: i.naturalHeight}; }),
    tables: Array.from(document.querySelectorAll("table")).map(function (t) {
      return t.rows.length; }),
    title: document.title,
    layout: layout()});
  document.body.appendChild(out);
});
</script>"""


def chromium(tmp_path: Path, page: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr",
         "--v=0", "--virtual-time-budget=5000", *args, page.as_uri()],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def probe(tmp_path: Path, html: str) -> tuple[dict, list[str]]:
    """Load `html` with the hook and probe added; (probe result, console lines on stderr)."""
    page = tmp_path / "probed.html"
    page.write_text(html.replace("<head>", "<head>" + HOOK, 1).replace("</body>",
                                                                      PROBE + "</body>", 1))
    result = chromium(tmp_path, page, "--dump-dom", "--window-size=1400,900")
    assert result.returncode == 0, result.stderr[-2000:]
    found = re.search(r'<pre id="probe">(.*?)</pre>', result.stdout, re.S)
    assert found, "probe did not run; stderr: " + result.stderr[-2000:]
    text = found.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">")
    console = [line for line in result.stderr.splitlines() if "CONSOLE" in line]
    return json.loads(text.replace("&amp;", "&")), console


def test_report_html_in_headless_chromium(results, tmp_path):
    paths = write_report(results)
    html = paths["html"].read_text()
    found, console = probe(tmp_path, html)
    assert found["errors"] == [] and console == []
    pngs = [p for p in paths.values() if p.suffix == ".png"]
    # The headline, 2 convergence plots, the timeline, who waited for whom.
    assert len(found["images"]) == len(pngs) == 5
    for image in found["images"]:
        assert image["width"] > 0 and image["height"] > 0, image
    # Time-to-target speedups, Prague blocks (none, prob:3), synchronization health,
    # who waited for whom (runs, and the timeline's run per worker), throughput, time to
    # target, runs not ok, metadata.
    assert len(found["tables"]) == 10 and all(rows >= 2 for rows in found["tables"])
    assert found["title"].startswith("hetbench report")
    layout = found["layout"]
    # At 1400 px nothing runs off the page's right edge (wide tables scroll in their box),
    # and the headline figure starts above the fold.
    assert layout["scrollWidth"] <= layout["innerWidth"], layout
    assert layout["headlineTop"] is not None and layout["headlineTop"] < layout["innerHeight"]
    # A click on a header sorts its table by that column.
    assert layout["after"] == sorted(layout["before"]) and layout["before"], layout
    shot = tmp_path / "report.png"
    result = chromium(tmp_path, paths["html"], f"--screenshot={shot}", "--window-size=1280,3000")
    assert result.returncode == 0 and shot.stat().st_size > 10_000, result.stderr[-2000:]


def test_the_probe_sees_broken_images_and_script_errors(tmp_path):
    """The checks above can fail: a broken image and a throwing script are both reported."""
    html = ("<!DOCTYPE html><html><head><title>t</title></head><body>"
            '<img alt="bad" src="data:image/png;base64,AAAA">'
            "<script>undefinedFunction();</script></body></html>")
    found, console = probe(tmp_path, html)
    assert found["images"] == [{"alt": "bad", "width": 0, "height": 0}]
    assert any("undefinedFunction" in e for e in found["errors"])
    assert any("failed to load" in e for e in found["errors"])
    assert any("undefinedFunction" in line for line in console)
