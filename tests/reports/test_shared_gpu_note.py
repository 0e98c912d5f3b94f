"""A report whose ranks shared a GPU says so first (issue 44): how many ranks shared which GPU,
that point to point went through host memory and how fast, that NCCL with a GPU per rank would
rank point-to-point algorithms differently, and which flag gives a cluster's view."""

import json
import subprocess
import sys

import pytest

from hetbench.reports.notes import shared_gpu_note

SHARED = {"devices": ["cuda:0"] * 4, "backend": "gloo, point to point via host",
          "staged_p2p_mb_per_s": 2345.6, "hostname": "gpubox", "gpu": "NVIDIA H100 80GB HBM3"}


def test_ranks_sharing_a_gpu_get_the_note_with_count_path_speed_and_the_way_out():
    note = shared_gpu_note([SHARED, {**SHARED, "devices": ["cuda:0"] * 2,
                                     "staged_p2p_mb_per_s": 1000.0}])
    assert "up to 4 ranks on cuda:0 (NVIDIA H100 80GB HBM3) of gpubox" in note
    assert "through host memory in 2 run(s)" in note
    assert "about 2,346 MB/s" in note  # the median of the runs' measured speeds
    assert "NCCL and a GPU per rank" in note and "rank differently" in note
    assert "--network PRESET" in note


def test_no_note_without_sharing():
    own = {**SHARED, "devices": ["cuda:0", "cuda:1"], "backend": "nccl"}
    assert shared_gpu_note([own]) is None
    assert shared_gpu_note([{"devices": ["cpu", "cpu"], "backend": "gloo"}]) is None
    assert shared_gpu_note([{"devices": float("nan")}]) is None  # a run of an older hetbench


@pytest.mark.slow
def test_bench_report_puts_the_note_in_report_md(results):
    """A finished run's summary edited to say its two ranks shared cuda:0 over gloo."""
    run = results / "allreduce-mlp-digits-w2-none-s1-762ae15f3d"
    summary = json.loads((run / "summary.json").read_text())
    summary.update(devices=["cuda:0", "cuda:0"], backend="gloo, point to point via host",
                   staged_p2p_mb_per_s=1500.0)
    (run / "summary.json").write_text(json.dumps(summary))
    done = subprocess.run([sys.executable, "-m", "hetbench", "report", str(results)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    text = (results / "report.md").read_text()
    assert "Ranks shared a GPU (up to 2 ranks on cuda:0" in text
    assert "about 1,500 MB/s" in text
    html = (results / "report.html").read_text()
    assert "Ranks shared a GPU" in html
