"""The network model (hetbench/network/model.py): placement, link costs, rings, the NIC ledger,
and the [network] table's resolution. Pure: no processes."""

import pytest

from hetbench.core.config import RunConfig
from hetbench.errors import UserError
from hetbench.network.model import (
    GBIT,
    PRESETS,
    Cluster,
    Ledger,
    NetworkConfig,
    egress,
    ingress,
    resolve_network,
)
from hetbench.slowdown import parse_slowdown


def model(workers=4, world_size=None, factor=None, **options):
    return Cluster(NetworkConfig(**options), workers, world_size or workers, factor)


def test_workers_fill_nodes_in_rank_order_and_servers_get_nodes_of_their_own():
    m = model(workers=5, world_size=7, workers_per_node=2)
    assert m.node == [0, 0, 1, 1, 2, 3, 4]


def test_a_transfer_costs_latency_plus_bytes_over_its_slowest_link():
    m = model(workers_per_node=2, intra_latency_us=1, intra_gbps=100, inter_latency_us=30,
              inter_gbps=40, nic_gbps=10)
    inside = m.transfer(0, 1, 1e6)
    assert inside.latency_s == pytest.approx(1e-6)
    assert inside.busy_s == pytest.approx(1e6 / (100 * GBIT))
    assert inside.ports == ()  # nothing queues inside a node
    across = m.transfer(1, 2, 1e6)
    assert across.latency_s == pytest.approx(30e-6)
    assert across.busy_s == pytest.approx(1e6 / (10 * GBIT))  # the NIC, not the 40 Gbit/s link
    assert across.ports == (egress(1), ingress(2))


def test_a_slow_nic_divides_its_bandwidth_and_only_its_own():
    slow = parse_slowdown("net:4@2")
    m = model(nic_gbps=10, inter_gbps=100, factor=slow.nic_factor)
    assert m.transfer(0, 2, 1e6).busy_s == pytest.approx(4 * m.transfer(0, 1, 1e6).busy_s)
    assert slow.factor(2, 0, 0.0) == 1.0  # compute untouched


def test_ring_all_reduce_is_2_n_minus_1_steps_as_slow_as_the_slowest_link():
    nbytes = 8e6
    flat = model(workers_per_node=4, intra_latency_us=2, intra_gbps=100)
    ring = flat.ring(range(4), nbytes)
    assert ring.duration_s == pytest.approx(6 * (2e-6 + nbytes / 4 / (100 * GBIT)))
    assert ring.port_busy == ()
    split = model(workers_per_node=2, intra_gbps=100, inter_latency_us=20, nic_gbps=10)
    ring = split.ring(range(4), nbytes)
    assert ring.duration_s == pytest.approx(6 * (20e-6 + nbytes / 4 / (10 * GBIT)))
    # The ring 0-1-2-3-0 crosses nodes at 1->2 and 3->0: those NICs carry 6 chunks each.
    assert sorted(p for p, _ in ring.port_busy) == sorted(
        [egress(1), ingress(2), egress(3), ingress(0)])
    assert [b for _, b in ring.port_busy] == pytest.approx([6 * nbytes / 4 / (10 * GBIT)] * 4)
    assert split.ring([3], nbytes).duration_s == 0.0
    # A broadcast pipelines n-1 steps.
    assert split.ring(range(4), nbytes, broadcast=True).duration_s == pytest.approx(
        3 * (20e-6 + nbytes / 4 / (10 * GBIT)))


def test_transfers_sharing_a_nic_queue_first_come_first_served():
    ledger = Ledger(8)
    first = ledger.reserve([egress(0), ingress(2)], at=1.0, busy_s=0.5)
    second = ledger.reserve([egress(1), ingress(2)], at=1.1, busy_s=0.5)
    elsewhere = ledger.reserve([egress(3), ingress(1)], at=1.1, busy_s=0.5)
    assert (first, second, elsewhere) == (1.0, 1.5, 1.1)
    ledger.book([(ingress(2), 0.25)], start=1.2)  # a collective booked meanwhile goes after
    assert ledger.free_at([ingress(2)]) == pytest.approx(2.25)


def test_a_tree_collective_moves_the_ring_s_bytes_with_log_n_latency():
    """collective = "tree": 2 ceil(log2 n) latency hops where the ring takes 2(n-1), the same
    bytes at the slowest link's rate, and the same NICs held for them. At 1,024 ranks of the
    prague preset the ring's latency (2,046 hops of 25 us: 51 ms) is most of a 25 MB bucket's
    all-reduce; the tree's is 0.5 ms."""
    nbytes = 25e6
    for n, hops in ((2, 1), (4, 2), (5, 3), (1024, 10)):
        ring = model(workers=n, collective="ring", **PRESETS["prague"][0]).ring(range(n), nbytes)
        tree = model(workers=n, collective="tree", **PRESETS["prague"][0]).ring(range(n), nbytes)
        rate = (56 if n > 4 else 100) * GBIT  # a node holds 4: more are on other nodes
        latency = 25e-6 if n > 4 else 5e-6
        volume = 2 * (n - 1) / n * nbytes
        assert tree.duration_s == pytest.approx(2 * hops * latency + volume / rate)
        assert ring.duration_s == pytest.approx(2 * (n - 1) * latency + volume / rate)
        # The NICs of every rank on a link to another node, both ways (the ring holds one way
        # of each: the ring's ports are among them); none inside one node.
        tree_ports = {p for p, _ in tree.port_busy}
        assert {p for p, _ in ring.port_busy} <= tree_ports
        crossing = {r for r in range(n) if n > 4 and r % 4 in (0, 3)}
        assert tree_ports == {egress(r) for r in crossing} | {ingress(r) for r in crossing}
        assert all(b == pytest.approx(volume / rate) for _, b in tree.port_busy)
    at_scale = model(workers=1024, collective="tree", **PRESETS["prague"][0])
    assert at_scale.ring(range(1024), nbytes).duration_s < 0.01
    broadcast = model(workers=8, collective="tree", **PRESETS["prague"][0]).ring(
        range(8), nbytes, broadcast=True)
    assert broadcast.duration_s == pytest.approx(3 * 25e-6 + nbytes / (56 * GBIT))
    with pytest.raises(UserError, match="collective must be one of ring, tree"):
        resolve_network({"collective": "butterfly"})
    # The default is left out of the resolved table: runs from before the option keep their ids.
    assert "collective" not in resolve_network({"preset": "prague"})
    assert resolve_network({"collective": "tree"})["collective"] == "tree"


def test_a_network_table_resolves_its_preset_under_its_own_values():
    resolved = resolve_network({"preset": "prague", "dilation": 8})
    assert resolved["workers_per_node"] == PRESETS["prague"][0]["workers_per_node"]
    assert resolved["dilation"] == 8.0 and resolved["preset"] == "prague"
    assert resolve_network(resolved) == resolved  # resolving twice changes nothing
    assert resolve_network({}) == {}
    with pytest.raises(UserError, match=r"unknown preset 'nope'.*prague"):
        resolve_network({"preset": "nope"})
    with pytest.raises(UserError, match=r"unknown option.*nic_mbps"):
        resolve_network({"nic_mbps": 10})
    with pytest.raises(UserError, match="dilation must be > 0"):
        resolve_network({"dilation": 0})


def _config(**fields):
    return RunConfig(**{"algorithm": "allreduce", "workload": "mlp-digits", "workers": 4,
                        "iterations": 20, **fields})


def test_runs_without_a_network_keep_their_ids_and_runs_with_one_differ():
    plain = _config()
    emulated = _config(network={"preset": "hop"})
    assert emulated.run_id != plain.run_id
    assert emulated.dilation == 1.0 and plain.dilation == 1.0
    assert plain.cluster() is None
    assert emulated.cluster().node == [0, 1, 2, 3]


def test_network_slowdowns_need_a_network_and_comm_bypassing_impls_are_refused():
    with pytest.raises(UserError, match="slows NICs: it needs a network model"):
        _config(slowdown="net:4@1")
    assert _config(slowdown="net:4@1", network={"preset": "hop"}).slowdown == "net:4@1"
    with pytest.raises(UserError, match="impl = ddp communicates through ddp"):
        _config(network={"preset": "hop"}, algorithm_options={"impl": "ddp"})


def test_an_algorithms_own_seconds_are_recorded_in_cluster_time():
    # prague's gg_s (the Group Generator's round trip) was written in host seconds while every
    # other time of the event was in cluster seconds: 16x too large at dilation 16.
    from hetbench.harness.step_lines import cluster_fields

    fields = {"gg_s": 0.8, "group": [1, 2], "peer": 3, "skipped": 2}
    assert cluster_fields(fields, 4.0) == {"gg_s": 0.2, "group": [1, 2], "peer": 3,
                                           "skipped": 2}
    assert cluster_fields(fields, 1.0) is fields


def test_the_communication_timeout_is_in_cluster_seconds_under_dilation():
    # A straggler's legitimate wait stretches with the dilation: 39 s of host time for a P-Reduce
    # group at dilation 32 failed runs on the 30 s bound before.
    from hetbench.core.config import RunConfig

    plain = RunConfig(algorithm="allreduce", workload="mlp-digits", workers=2, iterations=20,
                      comm_timeout_s=10)
    dilated = RunConfig(algorithm="allreduce", workload="mlp-digits", workers=2, iterations=20,
                        comm_timeout_s=10, network={"dilation": 32})
    assert plain.host_timeout_s == 10 and dilated.host_timeout_s == 320


def test_lateness_is_kept_by_kind_of_operation_and_summed_over_ranks():
    from hetbench.core.record import late_by_kind
    from hetbench.network.emulator import Fidelity

    ranks = [Fidelity(), Fidelity()]
    ranks[0].add(0.010, 0.002, "receive")
    ranks[0].add(0.010, -0.001, "receive")  # early: counted, not late
    ranks[0].add(0.100, 0.0, "compute")
    ranks[1].add(0.020, 0.006, "receive")
    ranks[1].add(0.050, 0.001, "collective")
    records = [r.to_dict() for r in ranks]
    assert records[0]["late_s"] == 0.002 and records[0]["operations"] == 3
    kinds = late_by_kind(records)
    assert list(kinds) == ["collective", "compute", "receive"]
    assert kinds["receive"]["operations"] == 3
    assert abs(kinds["receive"]["late_share"] - 0.008 / 0.040) < 1e-12
    assert abs(kinds["receive"]["max_late_ms"] - 6.0) < 1e-9
    assert kinds["compute"]["late_s"] == 0.0
    # Records written before kinds were kept give no breakdown.
    assert late_by_kind([{"late_s": 0.1}]) == {}


def test_runs_on_a_preset_with_tree_collectives_are_named_apart():
    """A preset's runs with trees are `prague/tree/x1` beside the ring's `prague/x1` (so a
    report never averages the two), however else the table differs."""
    from hetbench.core.variants import network_label

    ring = resolve_network({"preset": "prague"})
    tree = resolve_network({"preset": "prague", "collective": "tree"})
    assert network_label(ring) == "prague/x1"
    assert network_label(tree) == "prague/tree/x1"
    own = network_label(resolve_network({"preset": "prague", "nic_gbps": 10,
                                         "collective": "tree"}))
    assert own.startswith("prague-") and own.endswith("/tree/x1")
    assert _config(network=tree).run_id != _config(network=ring).run_id
