"""A report of real runs on one host without a network model says it measured that host (and
how many ranks shared how many cores); a simulated or emulated-network report does not."""

import os

from tests.helpers import QUARTER_MINUTE_CASES, skip_unless_today


def test_real_runs_on_one_host_say_so_in_the_cli_and_the_report(tmp_path, bench):
    skip_unless_today("host-note", QUARTER_MINUTE_CASES, per_day=2)
    out = tmp_path / "real"
    ran = bench("run", "--algorithms", "allreduce", "--workloads", "mlp-digits", "--workers",
                "2", "--iterations", "12", "--out", out)
    assert ran.returncode == 0, ran.stderr
    last = ran.stderr.strip().splitlines()[-1]
    assert last.startswith("note: 1 run(s) measured this host") and "--network" in last
    assert bench("report", out).returncode == 0
    md = (out / "report.md").read_text()
    note = next(line for line in md.splitlines() if "Measured on one host" in line)
    assert f"up to 2 ranks on the {os.cpu_count()} cores" in note
    assert md.index("Measured on one host") < md.index("## ")  # before every table
    assert "Measured on one host" in (out / "report.html").read_text()

    sim = tmp_path / "sim"
    assert bench("sim", "--algorithms", "allreduce", "--workloads", "mlp-digits", "--workers",
                 "2", "--iterations", "12", "--pace-ms", "5", "--out", sim).returncode == 0
    assert bench("report", sim).returncode == 0
    assert "Measured on one host" not in (sim / "report.md").read_text()
