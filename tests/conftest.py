import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def bench_cmd():
    """The real `bench` console script of this environment."""
    exe = Path(sys.executable).with_name("bench")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "hetbench"]


@pytest.fixture
def cli_env(tmp_path):
    env = dict(os.environ)
    env.pop("CI", None)
    return env
