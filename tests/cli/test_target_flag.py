"""`--target` on bench run, sim and tune does what a matrix file's `target` does."""

import csv

from tests.helpers import QUARTER_MINUTE_CASES, skip_unless_today


def test_target_flag_equals_the_matrix_key(tmp_path, bench):
    skip_unless_today("target-flag", QUARTER_MINUTE_CASES, per_day=2)
    base = ('algorithms = ["allreduce", "dpsgd"]\nworkloads = ["mlp-digits"]\nworkers = [2]\n'
            "iterations = 60\npace_ms = 5\n")
    (tmp_path / "keyed.toml").write_text(base + 'target = "accuracy:0.8"\n')
    (tmp_path / "plain.toml").write_text(base)
    for command in ("run", "sim"):
        keyed = bench(command, tmp_path / "keyed.toml", "--dry-run", "--out", tmp_path / "a")
        flagged = bench(command, tmp_path / "plain.toml", "--target", "accuracy:0.8",
                        "--dry-run", "--out", tmp_path / "b")
        plain = bench(command, tmp_path / "plain.toml", "--dry-run", "--out", tmp_path / "c")
        assert keyed.returncode == flagged.returncode == 0, keyed.stderr + flagged.stderr
        # The same runs (a run's id hashes its config, target included), not the untargeted.
        ids = [line.split()[0] for line in keyed.stdout.splitlines() if line.strip()]
        assert ids and ids == [line.split()[0] for line in flagged.stdout.splitlines()
                               if line.strip()]
        assert ids != [line.split()[0] for line in plain.stdout.splitlines() if line.strip()]
    out = tmp_path / "real"
    ran = bench("run", tmp_path / "plain.toml", "--target", "accuracy:0.8", "--algorithms",
                "allreduce", "--out", out)
    assert ran.returncode == 0, ran.stderr
    report = bench("report", out)
    assert report.returncode == 0, report.stderr
    rows = list(csv.DictReader((out / "time_to_target.csv").open()))
    assert rows and {row["target"] for row in rows} == {"test accuracy >= 0.8"}
    bad = bench("run", tmp_path / "plain.toml", "--target", "speed:9", "--dry-run")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "error:" in bad.stderr
