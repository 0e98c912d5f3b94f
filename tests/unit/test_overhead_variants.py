"""benchmarks/overhead_variants.py: each part it takes out of hetbench is still where it looks
for it (a variant that silently changed nothing would measure nothing), and a variant's
package imports with its part gone."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "overhead_variants.py"


def _variants(tmp_path, *names):
    return subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), *names],
                          capture_output=True, text=True, cwd=ROOT)


@pytest.mark.slow
def test_every_part_is_taken_out_of_a_copy_that_still_imports(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from overhead_variants import PARTS
    finally:
        sys.path.pop(0)
    done = _variants(tmp_path, *PARTS)
    assert done.returncode == 0, done.stderr
    for name, (path, old, new, _) in PARTS.items():
        text = (tmp_path / name / "hetbench" / path).read_text()
        assert old not in text.replace(new, ""), name  # replaced, not left beside
        assert f"overhead_variants: {name}" in text, name
        original = (ROOT / "hetbench" / path).read_text()
        assert text != original
        imported = subprocess.run(
            [sys.executable, "-c", "import hetbench.harness.worker, hetbench.algorithms.allreduce,"
             " hetbench; print(hetbench.__file__)"],
            capture_output=True, text=True, cwd=tmp_path, env={"PYTHONPATH": str(tmp_path / name)})
        assert imported.returncode == 0, imported.stderr
        assert str(tmp_path / name) in imported.stdout


def test_an_unknown_variant_and_a_commit_variant(tmp_path):
    bad = _variants(tmp_path, "nosuchpart")
    assert bad.returncode != 0 and "unknown variant 'nosuchpart'" in bad.stderr
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                          text=True)
    if head.returncode != 0:  # not a git checkout (an sdist): nothing to archive
        return
    done = _variants(tmp_path, f"then={head.stdout.strip()}")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "then" / "hetbench" / "harness" / "worker.py").exists()
