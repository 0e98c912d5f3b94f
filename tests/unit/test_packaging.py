"""hetbench installs beside the torch a researcher already has (issue 45): pyproject asks for
ranges, this machine's pair is a constraints file, and `bench --version` answers."""

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


def _requirements() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {r.name: r for r in map(Requirement, project["dependencies"])}


def test_torch_is_a_tested_range_and_the_pinned_pair_a_constraint():
    requirements = _requirements()
    for name, oldest, pinned in (("torch", "2.11.0", "2.14.1"),
                                 ("torchvision", "0.26.0", "0.29.1")):
        spec = requirements[name].specifier
        assert spec.contains(oldest) and spec.contains(pinned), (name, spec)
        assert not any(s.operator == "==" for s in spec), f"{name} is pinned: {spec}"
        assert f"{name}=={pinned}" in (ROOT / "constraints.txt").read_text().split()


def _fake_installed(site: Path, name: str, version: str) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


@pytest.mark.slow
def test_pip_install_keeps_an_installed_torch_of_another_version(tmp_path):
    """A dry run of `pip install .` offline, in this environment with torch 2.12.0 and
    torchvision 0.27.0 standing first on the path: nothing to install but hetbench itself (a
    pin would ask for another torch, which offline cannot be found)."""
    site = tmp_path / "site"
    _fake_installed(site, "torch", "2.12.0")
    _fake_installed(site, "torchvision", "0.27.0")
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index",
         "--no-build-isolation", "--quiet", "--report", str(report), str(ROOT)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={"PYTHONPATH": str(site), "PATH": str(Path(sys.executable).parent),
             "HOME": str(tmp_path), "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    installed = [i["metadata"]["name"] for i in json.loads(report.read_text())["install"]]
    assert installed == ["hetbench"], installed


def test_bench_version():
    done = subprocess.run([sys.executable, "-m", "hetbench", "--version"], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.startswith("bench (hetbench) "), done


def test_an_installed_wheel_finds_the_papers_matrices_outside_any_checkout(tmp_path):
    """`bench reproduce` from a wheel (issue 59): the wheel built from this tree, installed into
    a directory of its own, resolves every reproduction's matrix inside that installation."""
    wheels, target = tmp_path / "wheels", tmp_path / "site"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                            "--no-build-isolation", "--quiet", "-w", str(wheels), str(ROOT)],
                           capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert built.returncode == 0, built.stderr[-2000:]
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps",
                                "--no-index", "--quiet", "--target", str(target),
                                *map(str, wheels.glob("hetbench-*.whl"))],
                               capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert installed.returncode == 0, installed.stderr[-2000:]
    probe = ("from hetbench.reports.reproduce import matrix_path\n"
             "for name in ('prague', 'hop'):\n"
             "    for quick in (False, True):\n"
             "        for kind in ({}, {'emulate': True}, {'convergence': True}):\n"
             "            print(matrix_path(name, quick, **kind))\n")
    # The installed copy first on the path, run from outside the checkout.
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(target)})
    assert done.returncode == 0, done.stderr[-2000:]
    paths = done.stdout.split()
    assert len(paths) == 12 and all(p.startswith(str(target)) for p in paths), paths
