"""hetbench/reports/measured.toml, the figures the report's notes quote, recomputed from the
results pages' raw files: a figure in the digest that its page's data no longer gives fails
here (issue 59: measured figures live in docs, not in code)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from hetbench.reports.notes import SHAPED

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"


def _cells(name: str) -> list[dict]:
    return json.loads((RESULTS / name).read_text())["cells"]


def _range(ratios: list[float]) -> str:
    return f"{min(ratios):.2f}-{max(ratios):.2f}x"


def test_the_shaped_links_figures_are_what_the_pages_data_gives():
    digest = tomllib.loads((ROOT / "hetbench" / "reports" / "measured.toml").read_text())
    assert digest["shaped_links"] == SHAPED  # the notes read this file
    assert (ROOT / SHAPED["page"]).is_file()

    def key(cell):
        return cell["hosts"], cell["rate"], cell["algorithm"]

    steady = {key(c): c for c in _cells("fair-transport-bed-steady.json")}
    table = [steady.get(key(c), c) for c in _cells("fair-transport-bed.json")]
    large = _cells("fair-transport-bed-large.json") + _cells("fair-transport-bed-large-p2p.json")
    cells = table + large
    over = {model: [c["shaped"] / c[model] for c in cells] for model in ("fcfs", "fair")}

    assert SHAPED["cells"] == len(cells)
    assert SHAPED["fcfs"] == _range(over["fcfs"])
    assert SHAPED["fair"] == _range(over["fair"])
    assert SHAPED["fair_within_10_percent"] == sum(abs(r - 1) <= 0.1 for r in over["fair"])
    hop = [c["shaped"] / c["fair"] for c in large if c["algorithm"] == "hop"]
    assert SHAPED["hop_large_messages"] == f"{hop[0]:.2f}x" and len(hop) == 1


def test_the_emulated_figures_are_what_the_pages_data_gives():
    cells = _cells("fair-transport-bed-emulated.json")
    assert SHAPED["emulated_cells"] == len(cells)
    for transport in ("fcfs", "fair"):
        over = [c["shaped"] / c[f"emulated_{transport}"] for c in cells]
        assert SHAPED[f"emulated_{transport}"] == _range(over)
        assert SHAPED[f"emulated_{transport}_within_10_percent"] == sum(
            abs(r - 1) <= 0.1 for r in over)


def test_the_cluster_queue_figures_are_what_the_pages_data_gives():
    cells = _cells("fair-transport-bed-host-fair.json")
    assert {c["queue"] for c in cells} == {"host-fair"}
    assert SHAPED["host_fair_cells"] == len(cells)
    for model in ("fcfs", "fair"):
        over = [c["shaped"] / c[model] for c in cells]
        assert SHAPED[f"host_fair_{model}"] == _range(over)
        assert SHAPED[f"host_fair_{model}_within_10_percent"] == sum(
            abs(r - 1) <= 0.1 for r in over)
