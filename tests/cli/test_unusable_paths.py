"""Every path a user types gets one line and exit code 2 when it is unusable (issue 34)."""

from pathlib import Path

import pytest

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "results"
TINY = ["--algorithms", "allreduce", "--workloads", "mlp-digits", "--workers", "2",
        "--iterations", "10"]

CASES = {
    "run --out under /proc": ["run", *TINY, "--out", "/proc/nope"],
    "run --out a file": ["run", *TINY, "--out", "/etc/hostname"],
    "run a missing matrix": ["run", "/nope/matrix.toml"],
    "sim --out under /proc": ["sim", *TINY, "--pace-ms", "5", "--out", "/proc/nope"],
    "sim --fit-from missing": ["sim", *TINY, "--fit-from", "/nope"],
    "sim --against missing": ["sim", "--against", "/nope"],
    "tune a missing matrix": ["tune", "/nope/matrix.toml"],
    "reproduce --out under /proc": ["reproduce", "prague", "--quick", "--out", "/proc/nope"],
    "report a missing directory": ["report", "/nope"],
    "report --matrix missing": ["report", str(FIXTURE), "--matrix", "/nope/matrix.toml"],
    "compare a missing directory": ["compare", "/nope"],
    "export trace --out under /proc": ["export", "trace", str(FIXTURE), "--out", "/proc/nope"],
    "export tensorboard --out under /proc": ["export", "tensorboard", str(FIXTURE), "--out",
                                             "/proc/nope"],
    "summarize a missing run": ["summarize", "/nope"],
}


@pytest.mark.slow
@pytest.mark.parametrize("args", CASES.values(), ids=CASES.keys())
def test_an_unusable_path_is_one_line_and_exit_2(args, bench):
    result = bench(*args, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr
