"""report.html: one self-contained page (no external files; images as data URIs; one small
inline script that sorts a table by the column header clicked).

Laid out to read at a glance: the headline (figure and its table) first, each section's
definitions folded under "How to read this", wide tables scrolling inside their own box rather
than the page, and every plot beside the table it illustrates."""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from hetbench.reports.tables import format_number

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.5em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; }
table { border-collapse: collapse; margin: .5em 0 1.2em; font-size: .85em; }
th, td { border: 1px solid #ccc; padding: .25em .6em; text-align: right; white-space: nowrap; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
img { max-width: 100%; border: 1px solid #eee; margin: .5em 0; }
.note { color: #555; } .warning { color: #a00; font-weight: bold; }
code { background: #f3f3f3; padding: 0 .2em; }
.scroll { overflow-x: auto; max-width: 100%; margin: .5em 0 1.2em; }
.scroll table { margin: 0; }
th.sortable { cursor: pointer; user-select: none; text-decoration: underline dotted #999; }
details.help { color: #555; margin: .2em 0 .6em; }
details.help summary { cursor: pointer; }
.pair { display: flex; flex-wrap: wrap; gap: 1em; align-items: flex-start; }
.pair > * { flex: 1 1 480px; min-width: 0; }
.pair > .wide { flex: 2 1 640px; }
"""

#: Click a header to sort its table by that column (numbers as numbers), again to reverse.
SCRIPT = """
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("thead th").forEach(function (th, column) {
    th.classList.add("sortable");
    th.title = "sort by this column";
    th.addEventListener("click", function () {
      var body = table.tBodies[0], rows = Array.from(body.rows);
      var up = th.dataset.order !== "up";
      th.dataset.order = up ? "up" : "down";
      var key = function (row) {
        var text = row.cells[column] ? row.cells[column].textContent.trim() : "";
        var number = parseFloat(text);
        return isNaN(number) ? text : number;
      };
      rows.sort(function (a, b) {
        var x = key(a), y = key(b);
        if (typeof x !== typeof y) { x = String(x); y = String(y); }
        return (x < y ? -1 : x > y ? 1 : 0) * (up ? 1 : -1);
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
});
"""


@dataclass
class Page:
    """The report page: its parts in order, rendered once (sections.render_html adds them)."""

    title: str
    parts: list[str] = field(default_factory=list)

    def heading(self, text: str, level: int = 2) -> None:
        self.parts.append(f"<h{level}>{html.escape(text)}</h{level}>")

    def help(self, text: str) -> None:
        """A section's definitions, folded: the numbers come first."""
        self.parts.append('<details class="help"><summary>How to read this</summary>'
                          f"<p>{html.escape(text)}</p></details>")

    def beside(self, content: str, figures: str, figures_first: bool = False) -> None:
        """A section's content and its plots side by side (stacked when the window is
        narrow), or whichever of the two there is; `figures_first` puts the plots on the left
        with twice the room (the headline figure)."""
        if content and figures:
            left, right = (figures, content) if figures_first else (content, figures)
            css = ' class="wide"' if figures_first else ""
            self.parts.append(f'<div class="pair"><div{css}>{left}</div><div>{right}</div></div>')
        elif content or figures:
            self.parts.append(content or figures)

    @staticmethod
    def paragraph_html(text: str, css: str = "") -> str:
        cls = f' class="{css}"' if css else ""
        return f"<p{cls}>{html.escape(text)}</p>"

    @staticmethod
    def bullets_html(items: tuple[str, ...]) -> str:
        return "<ul>" + "".join(f"<li>{html.escape(i)}</li>" for i in items) + "</ul>"

    @staticmethod
    def table_html(frame: pd.DataFrame, caption: str = "") -> str:
        """A DataFrame as a sortable HTML table in a box of its own width (pandas escapes
        the cells)."""
        table = frame.to_html(index=False, na_rep="", float_format=format_number,
                              border=0, escape=True, classes="sortable")
        if caption:
            table = table.replace(
                ">", f"><caption>{html.escape(caption)}</caption>", 1)
        return f'<div class="scroll">{table}</div>'

    @staticmethod
    def image_html(path: Path, alt: str, element_id: str = "") -> str:
        """A PNG embedded as a base64 data URI, so the page is one file."""
        data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
        ident = f' id="{element_id}"' if element_id else ""
        return f'<img{ident} src="data:image/png;base64,{data}" alt="{html.escape(alt)}">'

    @staticmethod
    def folded_html(summary: str, content: str) -> str:
        """Content few readers need, folded under one line."""
        return f"<details><summary>{html.escape(summary)}</summary>{content}</details>"

    def render(self) -> str:
        """The whole page; its visible title is the first part (the opening section's h1)."""
        return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                f"<title>{html.escape(self.title)}</title><style>{STYLE}</style></head>\n"
                "<body>\n" + "\n".join(self.parts)
                + f"\n<script>{SCRIPT}</script>\n</body></html>\n")
