import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A shell that starts the suite in the background (`make test &`, nohup) ignores SIGINT, and an
# ignored signal is inherited through exec: every bench the tests start would then ignore the
# Ctrl-C that the signal and chaos tests send it, and leak its ranks. A handler is not inherited
# (exec resets it to the default), so installing Python's own restores Ctrl-C for the children.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session", autouse=True)
def layout_cache(tmp_path_factory):
    """bench sim's layout cache (sim/model.py: LayoutCache) in a directory of this session,
    not the user's ~/.cache; every bench the tests start inherits it."""
    path = tmp_path_factory.mktemp("layout-cache")
    os.environ["HETBENCH_CACHE_DIR"] = str(path)
    return path


@pytest.fixture(scope="session")
def bench_cmd():
    """The real `bench` console script of this environment."""
    exe = Path(sys.executable).with_name("bench")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "hetbench"]


@pytest.fixture(scope="session")
def cli_env(layout_cache):
    """The environment the CLI runs in (without CI); tests copy it to change it."""
    env = dict(os.environ)
    env.pop("CI", None)
    return env


@pytest.fixture
def bench(bench_cmd, cli_env):
    """Run the real `bench` CLI in a subprocess: bench("run", ..., env=None, timeout=240)."""

    def run(*args, env=None, timeout=240):
        return subprocess.run([*bench_cmd, *map(str, args)], capture_output=True, text=True,
                              env=cli_env if env is None else env, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    return run


def pytest_collection_modifyitems(config, items):
    """Tests marked gpu need a CUDA device; those marked multi_gpu too need one GPU per rank
    (NCCL refuses two ranks on one device), so at least two."""
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for item in gpu_items:
        needed = 2 if "multi_gpu" in item.keywords else 1
        if gpus < needed:
            item.add_marker(pytest.mark.skip(
                reason=f"needs {needed} or more CUDA devices, this machine has {gpus}"
                       + (" (NCCL: one GPU per rank)" if needed > 1 else "")))
