"""What report.md and report.html both say, as one ordered list of sections, and the two
renderers that walk it.

report.py decides what the report says and in what order (`report_sections`); a renderer only
decides how it looks. report.md reads top to bottom. report.html lays the same sections out to
be read at a glance, as each section's hints ask: the headline sections in one view, their
figure beside their tables; a plot beside the table it illustrates; a section folded. Neither
renderer adds, drops or reorders a section, so the two files cannot drift apart
(tests/reports/test_sections.py checks it on a real report)."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby
from pathlib import Path

import pandas as pd

from hetbench.reports.html import Page
from hetbench.reports.tables import to_markdown


@dataclass(frozen=True)
class Warnings:
    """Lines a reader must see before trusting any number, under their head: bold in
    report.md, red in report.html."""

    head: str
    lines: tuple[str, ...]


@dataclass(frozen=True)
class Section:
    """One section of the report, in both files. Its first three fields are all an added
    section needs (`bench reproduce`'s published vs measured, the tolerance curves)."""

    heading: str
    #: How to read the section (its definitions): a paragraph in report.md; folded under "How
    #: to read this" in report.html, so that the numbers come first.
    text: str = ""
    table: pd.DataFrame | None = None
    #: 1 for the report's title (the opening section), 2 for a section, 3 for a part of the
    #: section above it.
    level: int = 2
    #: Said as they are, after the text: the run count, or why there is no table.
    paragraphs: tuple[str, ...] = ()
    warnings: tuple[Warnings, ...] = ()
    bullets: tuple[str, ...] = ()
    #: Plots of the section: after its table in report.md, beside it in report.html.
    images: tuple[Path, ...] = ()
    #: Layout hint: part of the headline, report.html's first view. Consecutive headline
    #: sections share the first one's heading, with their figures on the left and their
    #: tables, each captioned with its section's heading, on the right.
    headline: bool = False
    #: Layout hint: report.html folds the section's content under this line (what few readers
    #: need, such as the run metadata).
    fold: str = ""


def render_markdown(sections: list[Section]) -> str:
    """report.md: every section in order, each plot after its table, the PNGs linked beside
    the file."""
    blocks = []
    for section in sections:
        blocks.append(f"{'#' * section.level} {section.heading}")
        blocks += [text for text in (section.text, *section.paragraphs) if text]
        for warning in section.warnings:
            blocks += [f"**{warning.head}**", "\n".join(f"- **{w}**" for w in warning.lines)]
        if section.bullets:
            blocks.append("\n".join(f"- {item}" for item in section.bullets))
        if section.table is not None:
            blocks.append(to_markdown(section.table))
        blocks += [f"![{image.stem}]({image.name})" for image in section.images]
    return "\n\n".join(blocks) + "\n"


def render_html(sections: list[Section]) -> str:
    """report.html: the same sections, the headline ones in one view, each section's
    definitions folded and its plots beside its table; one self-contained page (html.Page)."""
    page = Page(sections[0].heading)
    for is_headline, run in groupby(sections, key=lambda section: section.headline):
        if is_headline:
            add_headline(page, list(run))
        else:
            for section in run:
                page.heading(section.heading, section.level)
                if section.text:
                    page.help(section.text)
                page.beside(content_html(section), figures_html(section))
    return page.render()


def add_headline(page: Page, sections: list[Section]) -> None:
    """The page's first view: one heading, the headline figure (twice as wide) beside every
    headline table, so the answer shows before the first scroll; their definitions follow,
    folded together."""
    page.heading(sections[0].heading, sections[0].level)
    tables, above = [], ""
    for section in sections:
        # Each table is captioned with its heading, shown nowhere else here; a part's (level 3,
        # a Prague block) names the section it belongs to as well.
        if section.level <= 2:
            above = caption = section.heading
        else:
            caption = f"{above}, {section.heading}"
        tables.append(content_html(section, caption))
    figures = "".join(figures_html(section, anchored=True) for section in sections)
    page.beside("".join(tables), figures, figures_first=True)
    page.help(" ".join(section.text for section in sections if section.text))


def content_html(section: Section, caption: str = "") -> str:
    """Everything a section says but its heading, definitions and plots, folded if it asks."""
    parts = [Page.paragraph_html(text) for text in section.paragraphs]
    for warning in section.warnings:
        parts += [Page.paragraph_html(warning.head, "warning"), Page.bullets_html(warning.lines)]
    if section.bullets:
        parts.append(Page.bullets_html(section.bullets))
    if section.table is not None:
        parts.append(Page.table_html(section.table, caption))
    content = "".join(parts)
    return Page.folded_html(section.fold, content) if section.fold else content


def figures_html(section: Section, anchored: bool = False) -> str:
    """A section's plots, embedded; `anchored` gives each the id of its name (the headline's:
    report.html#headline)."""
    return "".join(Page.image_html(image, image.stem, image.stem if anchored else "")
                   for image in section.images)
