"""core/rundir.py: a run directory's file names in one place."""

from hetbench.core.rundir import RunDir


def test_event_logs_come_in_rank_order_and_other_files_are_not_taken_for_them(tmp_path):
    run = RunDir(tmp_path)
    for rank in (10, 2, 0):
        run.events(rank).write_text("")
    (tmp_path / "events.rankX.jsonl").write_text("")  # not a rank's
    run.done(2).write_text("{}")
    assert [rank for rank, _ in run.event_logs()] == [0, 2, 10]  # numeric, not 0, 10, 2
    assert run.event_logs()[1][1] == tmp_path / "events.rank2.jsonl"
    assert run.summary == tmp_path / "summary.json" and run.config.name == "config.json"
    assert run.error(3).name == "error.rank3.json" and run.worker_log(1).name == "worker.rank1.log"
