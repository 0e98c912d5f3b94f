"""bench sim on a run's [network] Cluster (sim/model.py ClusterNetwork): the simulator asks the
same model an emulated run uses, NIC queues included."""

from hetbench.core.config import RunConfig
from hetbench.network.model import GBIT
from hetbench.sim.model import ComputeModel, NetworkModel, SimModels, layout
from hetbench.sim.run import simulate

MODELS = SimModels(NetworkModel(), ComputeModel(constant_s=0.05))


def _sim(tmp_path, algorithm, network, workers=8, slowdown="none"):
    config = RunConfig(algorithm=algorithm, workload="mlp-digits", workers=workers,
                       slowdown=slowdown, iterations=40, network=network)
    return config, simulate(config, MODELS, tmp_path).summary


def test_a_parameter_servers_nic_bounds_its_workers(tmp_path):
    # 8 workers push to one server NIC of 0.01 Gbit/s: each push takes 15 ms there, so a round
    # of 8 takes at least 8 x 15 ms whatever the workers' own NICs do.
    network = {"nic_gbps": 0.01, "inter_gbps": 100, "inter_latency_us": 0}
    config, summary = _sim(tmp_path, "ps-sync", network)
    push_s = (layout(config).model_bytes + 4) / (0.01 * GBIT)
    per_iteration = summary["train_wall_s"] / 40
    assert per_iteration >= 8 * push_s
    assert summary["simulated"] and "NIC 0.01 Gbit/s" in summary["sim"]["network"]


def test_a_dpsgd_ring_on_link_bound_nics_sends_while_its_peers_are_not_yet_ready(tmp_path):
    """Each worker of a ring sends its model to its two neighbours when it is ready (as the
    emulator queues a send when it is posted): its NIC is busy for 2 messages an iteration,
    compute overlaps nothing, so an iteration is compute + 2 messages' time (+ latency), as
    the emulated runs measured (docs/results/2026-11-26-shaped-links.md). Booking each
    message only once the receiver's exchange began left NICs idle: 1.3x that."""
    network = {"workers_per_node": 1, "nic_gbps": 0.01, "inter_gbps": 100,
               "inter_latency_us": 0}
    config, summary = _sim(tmp_path, "dpsgd", network, workers=4)
    message_s = layout(config).model_bytes / (0.01 * GBIT)
    per_iteration = summary["train_wall_s"] / 40
    assert 0.05 + 2 * message_s <= per_iteration * 1.001
    assert per_iteration < 1.05 * (0.05 + 2 * message_s), (per_iteration, message_s)


def test_inter_node_rings_and_slow_nics_cost_what_the_cluster_says(tmp_path):
    one_node = {"workers_per_node": 8, "intra_gbps": 100, "nic_gbps": 0.01}
    two_nodes = {**one_node, "workers_per_node": 4}
    _, inside = _sim(tmp_path / "a", "allreduce", one_node)
    _, across = _sim(tmp_path / "b", "allreduce", two_nodes)
    _, slow_nic = _sim(tmp_path / "c", "allreduce", two_nodes, slowdown="net:4@3")
    assert across["throughput"] < 0.9 * inside["throughput"]
    assert slow_nic["throughput"] < 0.9 * across["throughput"]  # worker 3's NIC is on the ring
    _, off_ring = _sim(tmp_path / "d", "allreduce", two_nodes, slowdown="net:4@1")
    assert off_ring["throughput"] == across["throughput"]  # 1's links stay inside node 0


def test_a_simulated_run_with_a_network_is_reproducible(tmp_path):
    network = {"preset": "prague"}
    first = _sim(tmp_path / "1", "prague-smart", network, slowdown="prob:5")[1]
    second = _sim(tmp_path / "2", "prague-smart", network, slowdown="prob:5")[1]
    assert first["throughput"] == second["throughput"]
    assert first["iterations"] == second["iterations"]


def test_allreduce_backups_aggregator_nic_bounds_its_steps(tmp_path):
    # Every gradient, the dropped ones too, enters through the aggregator's NIC, one after
    # another: a step of 7 (8 workers, one backup) takes at least 7 pushes there. A worker
    # whose NIC is 10x slower holds the aggregator's NIC 10x longer for each of its messages
    # (a transfer holds both NICs at the slower one's rate), which no backup worker hides.
    network = {"nic_gbps": 0.01, "inter_gbps": 100, "inter_latency_us": 0}
    config, summary = _sim(tmp_path / "a", "allreduce-backup", network)
    push_s = (layout(config).model_bytes + 8) / (0.01 * GBIT)
    assert summary["status"] == "ok"
    assert summary["train_wall_s"] / summary["sim"]["updates"] >= 7 * push_s * 0.999
    _, slow = _sim(tmp_path / "b", "allreduce-backup", network, slowdown="net:10@3")
    assert slow["throughput"] < 0.8 * summary["throughput"]


def test_osgp_pays_a_slow_nic_on_its_own_links_only(tmp_path):
    # 15 ms a message on 0.01 Gbit/s NICs, beside 50 ms of compute: OSGP hides it. Worker 0's
    # NIC 10x slower (150 ms a message) is more than max_delay = 1 iteration can hide.
    network = {"nic_gbps": 0.01, "inter_gbps": 100, "inter_latency_us": 0}
    _, fast = _sim(tmp_path / "a", "osgp", network)
    _, slow = _sim(tmp_path / "b", "osgp", network, slowdown="net:10@0")
    assert fast["throughput"] == 8 * 32 / 0.05  # compute bound: every message hidden
    assert slow["throughput"] < 0.8 * fast["throughput"]


def test_nic_fail_slow_episodes_have_the_documented_length_and_share():
    """netfailslow: per NIC, exponential episodes of mean `on` s and healthy stretches of mean
    `gap` s, so a NIC is slow a share on / (on + gap) of the time; seeded, so it replays."""
    import numpy as np

    from hetbench.slowdown import parse_slowdown

    spec = "netfailslow:k=4;on=5;gap=20"
    nics = parse_slowdown(spec, seed=3)
    nics.validate(64)
    moments = np.arange(0.0, 20000.0, 5.0)
    slow = np.array([[nics.in_episode(r, t) for t in moments] for r in range(64)])
    assert abs(slow.mean() - 5 / 25) < 0.01
    episodes = [b - a for r in range(64) for a, b, s in zip(nics._starts[r], nics._starts[r][1:],
                                                          nics._slow[r], strict=False)
                if s and a > 0]
    assert abs(np.mean(episodes) - 5.0) < 0.2  # thousands of episodes: the mean within 4%
    again = parse_slowdown(spec, seed=3)
    again.validate(64)
    assert [again.nic_factor(7, t) for t in moments] == [nics.nic_factor(7, t) for t in moments]
    assert {nics.nic_factor(r, t) for r in range(64) for t in moments[:50]} == {1.0, 4.0}
    assert nics.nic_factor(64, 3.0) == 1.0  # a server rank's NIC is never slowed


def test_nic_fail_slow_episodes_slow_a_nic_bound_run_by_their_share(tmp_path):
    """All-Reduce over NICs that bound it: episodes 1/4 of the time on every NIC (so almost
    always one of 8 on the ring) cost throughput; `bench sim` plays them from the same seed."""
    network = {"workers_per_node": 1, "nic_gbps": 0.05, "inter_gbps": 100,
               "inter_latency_us": 0}
    _, healthy = _sim(tmp_path / "a", "allreduce", network)
    _, episodes = _sim(tmp_path / "b", "allreduce", network,
                       slowdown="netfailslow:k=4;on=0.2;gap=0.6")
    _, again = _sim(tmp_path / "c", "allreduce", network,
                    slowdown="netfailslow:k=4;on=0.2;gap=0.6")
    assert episodes["throughput"] < 0.8 * healthy["throughput"]
    assert episodes["throughput"] == again["throughput"]


def test_a_tree_collective_shortens_all_reduce_and_leaves_point_to_point_alone(tmp_path):
    """collective = "tree" on a latency-bound cluster (64 ranks, 1 ms a hop): All-Reduce's
    iteration is compute + a tree all-reduce (2 x 6 hops) instead of a ring's (2 x 63), and
    D-PSGD, which sends point to point, runs exactly as before."""
    network = {"workers_per_node": 1, "inter_latency_us": 1000, "inter_gbps": 100,
               "nic_gbps": 100}
    per_iteration = {}
    for collective in ("ring", "tree"):
        for algorithm in ("allreduce", "dpsgd"):
            _, summary = _sim(tmp_path / collective, algorithm,
                              {**network, "collective": collective}, workers=64)
            per_iteration[algorithm, collective] = summary["train_wall_s"] / 40
    assert per_iteration["allreduce", "ring"] >= 0.05 + 2 * 63 * 1e-3
    assert 0.05 + 2 * 6 * 1e-3 <= per_iteration["allreduce", "tree"] < 0.05 + 2 * 7 * 1e-3
    assert per_iteration["dpsgd", "tree"] == per_iteration["dpsgd", "ring"]
