"""report.html: one self-contained page (no scripts, no external files; images as data URIs)."""

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
"""


@dataclass
class Page:
    """The report page, built section by section and rendered once."""

    title: str
    parts: list[str] = field(default_factory=list)

    def heading(self, text: str, level: int = 2) -> None:
        self.parts.append(f"<h{level}>{html.escape(text)}</h{level}>")

    def paragraph(self, text: str, css: str = "") -> None:
        cls = f' class="{css}"' if css else ""
        self.parts.append(f"<p{cls}>{html.escape(text)}</p>")

    def bullets(self, items: list[str]) -> None:
        if items:
            self.parts.append("<ul>" + "".join(f"<li>{html.escape(i)}</li>" for i in items)
                              + "</ul>")

    def table(self, frame: pd.DataFrame, caption: str = "") -> None:
        """A DataFrame as an HTML table (pandas escapes the cells)."""
        table = frame.to_html(index=False, na_rep="", float_format=format_number,
                              border=0, escape=True)
        if caption:
            table = table.replace(
                ">", f"><caption>{html.escape(caption)}</caption>", 1)
        self.parts.append(table)

    def image(self, path: Path, alt: str) -> None:
        """Embed a PNG as a base64 data URI, so the page is one file."""
        data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
        self.parts.append(f'<img src="data:image/png;base64,{data}" alt="{html.escape(alt)}">')

    def render(self) -> str:
        return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                f"<title>{html.escape(self.title)}</title><style>{STYLE}</style></head>\n"
                f"<body>\n<h1>{html.escape(self.title)}</h1>\n" + "\n".join(self.parts)
                + "\n</body></html>\n")
