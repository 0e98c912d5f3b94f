"""The worker loop's event lines (harness/step_lines.py): written in batches, whole and in
order, none lost; held back neither by a stuck loop nor past the device's progress."""

import json
import time

import torch

from hetbench.comm.comm import StepRecord
from hetbench.core.algorithm import StepInfo
from hetbench.core.config import RunConfig
from hetbench.core.store import EventLog
from hetbench.harness.compute_end import ComputeEnd
from hetbench.harness.step_lines import StepLines
from hetbench.slowdown import parse_slowdown

CONFIG = RunConfig(algorithm="allreduce", workload="mlp-digits", workers=2, iterations=10)


def _lines(path) -> list[dict]:
    text = path.read_text() if path.exists() else ""
    assert text == "" or text.endswith("\n")  # never part of a line
    return [json.loads(line) for line in text.splitlines()]


def _step(end: ComputeEnd, steps: StepLines, iteration: int, before_end=None) -> None:
    end.begin(iteration, 0.0)
    end()
    if before_end:
        before_end()
    steps.add(end.step_done(), iteration, torch.tensor(1.0 + iteration), StepInfo(peers=1),
              StepRecord({0, 1}), 0.001, 0.0)
    steps.write_ready()


def _steps(tmp_path, device="cpu", **timing) -> tuple[ComputeEnd, StepLines, object]:
    path = tmp_path / "events.rank0.jsonl"
    steps = StepLines(CONFIG, 0, EventLog(path), time.time_ns(), 32)
    for name, value in timing.items():
        setattr(steps, name, value)
    end = ComputeEnd(parse_slowdown("none", seed=1), rank=0, pace_s=0.0,
                     device=torch.device(device))
    return end, steps, path


def test_lines_wait_for_a_batch_then_go_whole_and_in_order(tmp_path):
    end, steps, path = _steps(tmp_path, FLUSH_S=60.0, STUCK_S=120.0, BATCH_LINES=4)
    for iteration in range(3):
        _step(end, steps, iteration)
    assert _lines(path) == []  # young, and fewer than a batch
    _step(end, steps, 3)
    assert [e["iteration"] for e in _lines(path)] == [0, 1, 2, 3]
    assert [e["loss"] for e in _lines(path)] == [1.0, 2.0, 3.0, 4.0]
    _step(end, steps, 4)
    steps.close()  # the end of training writes the rest
    assert [e["iteration"] for e in _lines(path)] == [0, 1, 2, 3, 4]
    assert not steps._writer.is_alive()


def test_the_oldest_lines_age_writes_the_batch(tmp_path):
    end, steps, path = _steps(tmp_path, FLUSH_S=0.3, STUCK_S=120.0)
    _step(end, steps, 0)
    _step(end, steps, 1)
    assert _lines(path) == []
    time.sleep(0.35)
    _step(end, steps, 2)
    assert [e["iteration"] for e in _lines(path)] == [0, 1, 2]
    steps.close()


def test_a_stuck_loop_does_not_hold_its_lines_back(tmp_path):
    """A loop blocked in a step (a hung peer) calls write_ready no more: the launcher that
    names the hung rank reads the ranks' last iterations, so a thread writes them."""
    end, steps, path = _steps(tmp_path, FLUSH_S=0.05, STUCK_S=0.1)
    _step(end, steps, 0)
    _step(end, steps, 1)
    deadline = time.monotonic() + 10
    while len(_lines(path)) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [e["iteration"] for e in _lines(path)] == [0, 1]
    steps.close()
    assert len(_lines(path)) == 2  # written once


def test_a_line_waits_for_the_device_to_pass_its_step(tmp_path, fake_cuda):
    end, steps, path = _steps(tmp_path, device="cuda", FLUSH_S=0.0, STUCK_S=120.0)
    _step(end, steps, 0)
    assert [e["iteration"] for e in _lines(path)] == [0]
    # The step's update still runs on the device: its line, and those after it, wait.
    _step(end, steps, 1, before_end=lambda: fake_cuda.launch(0.5))
    _step(end, steps, 2)
    assert [e["iteration"] for e in _lines(path)] == [0]
    steps.close()  # waits for the device where it must
    assert [e["iteration"] for e in _lines(path)] == [0, 1, 2]
