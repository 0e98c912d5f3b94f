"""The report's caveat on the network model's point-to-point messages (reports/notes.py): said
for emulated runs that moved point-to-point bytes and for simulations on a cluster's network,
not for collectives alone nor for runs without a network model."""

import pandas as pd

from hetbench.reports.notes import SHAPED, point_to_point_note

EMULATED = {"description": "4 nodes x 1 workers", "late_share": 0.01}


def test_emulated_point_to_point_runs_are_named_with_the_measured_gap():
    runs = pd.DataFrame([
        {"algorithm": "hop", "network": EMULATED, "p2p_mb_per_iteration": 1.26,
         "simulated": False},
        {"algorithm": "allreduce", "network": EMULATED, "p2p_mb_per_iteration": 0.0,
         "simulated": False},
    ])
    (note,) = point_to_point_note(runs)
    assert "(hop)" in note and "allreduce" not in note
    assert SHAPED["fcfs"] in note and "either way" in note


def test_collectives_alone_and_runs_without_a_network_get_no_caveat():
    collectives = pd.DataFrame([{"algorithm": "allreduce", "network": EMULATED,
                                 "p2p_mb_per_iteration": 0.0, "simulated": False}])
    no_network = pd.DataFrame([{"algorithm": "hop", "network": None,
                                "p2p_mb_per_iteration": 1.26, "simulated": False}])
    assert point_to_point_note(collectives) == []
    assert point_to_point_note(no_network) == []


def test_a_simulation_on_a_clusters_network_gets_it_and_one_on_alpha_beta_does_not():
    cluster = pd.DataFrame([{"algorithm": "dpsgd", "simulated": True,
                             "sim": {"network": "4 nodes x 1 workers, NIC 0.1 Gbit/s"}}])
    alpha_beta = pd.DataFrame([{"algorithm": "dpsgd", "simulated": True,
                                "sim": {"alpha_us": 20.0}}])
    assert len(point_to_point_note(cluster)) == 1
    assert point_to_point_note(alpha_beta) == []


def test_a_fair_simulation_gets_the_fair_transports_caveat_alone():
    fair = pd.DataFrame([{"algorithm": "hop", "simulated": True,
                          "sim": {"network": "4 nodes x 1 workers, fair transport"}}])
    (note,) = point_to_point_note(fair)
    assert SHAPED["fair"] in note and "first come" not in note
    assert SHAPED["host_fair_fair"] in note  # the cluster-like queue's figure, first


def test_an_emulated_fair_run_gets_the_fair_caveat_with_the_emulators_measured_gap():
    fair = {"description": "4 nodes x 1 workers, fair transport", "late_share": 0.01}
    runs = pd.DataFrame([
        {"algorithm": "hop", "network": fair, "p2p_mb_per_iteration": 1.26, "simulated": False},
        {"algorithm": "dpsgd", "network": EMULATED, "p2p_mb_per_iteration": 1.26,
         "simulated": False},
    ])
    first_come, played_fair = point_to_point_note(runs)
    assert "(dpsgd)" in first_come and "hop" not in first_come
    assert "(hop emulated)" in played_fair and SHAPED["emulated_fair"] in played_fair
