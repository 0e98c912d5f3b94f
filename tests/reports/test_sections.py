"""report.md and report.html are rendered from one list of sections (reports/sections.py):
neither file may drop, add or reorder a section, a table or a plot of that list."""

import html
import re

from hetbench.reports import report as report_module
from hetbench.reports.report import write_report
from hetbench.reports.sections import Section


def test_both_files_show_the_one_list_of_sections_in_its_order(results, monkeypatch):
    # The list write_report renders, recorded as it passes.
    recorded = []
    build = report_module.report_sections

    def recording(report, images):
        recorded.append(build(report, images))
        return recorded[-1]

    monkeypatch.setattr(report_module, "report_sections", recording)
    paths = write_report(results, extra=lambda report: [Section(
        "Published vs measured", "Ours beside theirs.",
        report.throughput[["algorithm", "slowdown"]])])
    (sections,) = recorded
    md, page = paths["md"].read_text(), paths["html"].read_text()
    headings = [section.heading for section in sections]
    assert "Published vs measured" in headings and "Timeline" in headings

    # report.md's headings are the list's, one for one.
    md_outline = [line for line in md.splitlines() if line.startswith("#")]
    assert md_outline == [f"{'#' * s.level} {s.heading}" for s in sections]
    # report.html shows each heading, in the list's order, as a heading or (in the headline
    # view, which shares one heading) in its table's caption; and no heading of its own.
    elements = re.findall(r"<(h[1-6]|caption)>(.*?)</\1>", page)
    outline = "\n".join(text for _, text in elements)
    at = 0
    for heading in map(html.escape, headings):
        found = outline.find(heading, at)
        assert found >= 0, f"report.html lacks {heading!r} after the sections before it"
        at = found + len(heading)
    assert {text for tag, text in elements if tag != "caption"} <= {
        html.escape(heading) for heading in headings}

    # Every table in both; every section's definitions in both; every PNG written shown in
    # the section that illustrates it, in both.
    tables = sum(s.table is not None for s in sections)
    assert md.count("\n|---") == page.count("<table") == tables
    for section in sections:
        assert section.text in md and html.escape(section.text) in page
    shown = [image for section in sections for image in section.images]
    written = [path for path in paths.values() if path.suffix == ".png"]
    assert sorted(shown) == sorted(written)
    for image in shown:
        assert f"![{image.stem}]({image.name})" in md and f'alt="{image.stem}"' in page
