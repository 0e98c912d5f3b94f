"""The flow-level network core (hetbench/network/flows.py): max-min fair sharing of NIC ports
among concurrent flows, and rendezvous matching of large messages to posted receives. Pure: no
processes, no clock."""

import math
import random
import time

import pytest

from hetbench.network.flows import ANY, FlowNetwork, Match, Pending, Rendezvous
from hetbench.network.model import Cluster, NetworkConfig, egress, ingress


def drain(net):
    """Complete every flow in order, as a simulator would; returns {flow id: finish time}."""
    finished = {}
    while (nxt := net.next_completion()) is not None:
        t, fid = nxt
        net.advance(t)
        assert net.remaining(fid) == 0.0
        net.finish(fid)
        finished[fid] = t
    return finished


# --- FlowNetwork ---------------------------------------------------------------------------


def test_a_single_flow_alone_finishes_at_bytes_over_its_rate_as_the_ledger_model_says():
    cluster = Cluster(NetworkConfig(nic_gbps=10.0, inter_gbps=8.0), workers=2, world_size=2)
    nbytes, t0 = 3e6, 1.25
    transfer = cluster.transfer(0, 1, nbytes)
    net = FlowNetwork([cluster.nic_rate(r) for r in range(2) for _ in ("egress", "ingress")])
    # The inter-node link is the flow's own cap, as Cluster.link takes min(nic, inter, nic).
    net.start("m", (egress(0), ingress(1)), nbytes, t0, cap=cluster.link(0, 1)[1])
    assert net.rate("m") == cluster.link(0, 1)[1]
    when, fid = net.next_completion()
    assert fid == "m"
    assert when == pytest.approx(t0 + transfer.busy_s, rel=1e-12)
    assert transfer.ports == (egress(0), ingress(1))


def test_two_flows_on_one_port_share_it_half_and_half_and_finish_at_twice_the_time():
    net = FlowNetwork([10.0])
    net.start("a", [0], 100.0, 0.0)
    net.start("b", [0], 100.0, 0.0)
    assert net.rate("a") == net.rate("b") == 5.0
    assert drain(net) == {"a": 20.0, "b": 20.0}  # one alone: 10.0


def test_when_one_of_two_flows_finishes_the_other_speeds_up_to_the_whole_port():
    net = FlowNetwork([10.0])
    net.start("short", [0], 50.0, 0.0)
    net.start("long", [0], 100.0, 0.0)
    assert net.next_completion() == (10.0, "short")  # 50 bytes at 5/s
    net.advance(10.0)
    assert net.remaining("long") == 50.0
    net.finish("short")
    assert net.rate("long") == 10.0
    assert net.next_completion() == (15.0, "long")  # the other 50 bytes at 10/s, exactly


def test_a_flow_that_joins_later_slows_the_first_from_then_on():
    net = FlowNetwork([10.0])
    net.start("a", [0], 100.0, 0.0)
    net.start("b", [0], 100.0, 4.0)  # a has moved 40 bytes alone
    assert net.remaining("a") == 60.0
    assert net.rate("a") == 5.0
    # a: 60 at 5/s -> 16; then b has 100 - 60 = 40 left, alone at 10/s -> 20.
    assert drain(net) == {"a": 16.0, "b": 20.0}


def test_max_min_with_different_bottlenecks_gives_the_textbook_allocation():
    # Ports 0 (capacity 10) and 1 (capacity 4). A crosses both, B only port 1, C only port 0.
    # Progressive filling: port 1 saturates first (4 / 2 = 2 for A and B), then port 0's
    # remaining 10 - 2 = 8 goes to C. No flow can gain without taking from a smaller one.
    net = FlowNetwork([10.0, 4.0])
    net.start("A", [0, 1], 1e3, 0.0)
    net.start("B", [1], 1e3, 0.0)
    net.start("C", [0], 1e3, 0.0)
    assert net.rate("A") == pytest.approx(2.0)
    assert net.rate("B") == pytest.approx(2.0)
    assert net.rate("C") == pytest.approx(8.0)
    # Equal shares everywhere (C = 10/2 = 5) would overrun port 1 (A 5 + B 5 > 4); FCFS would
    # give A port 0 whole and starve C.


def test_a_three_level_max_min_allocation():
    # Port 0 (cap 3) carries f1, f2, f3; port 1 (cap 10) carries f3, f4; port 2 (cap 4) f4, f5.
    # Level 1: port 0 -> 1 each for f1, f2, f3. Port 2: 4 / 2 = 2 for f4, f5 (port 1 would
    # give f4 10 - 1 = 9). So f4 = f5 = 2, and port 1 is left with 10 - 1 - 2 = 7 unused.
    net = FlowNetwork([3.0, 10.0, 4.0])
    for fid, ports in (("f1", [0]), ("f2", [0]), ("f3", [0, 1]), ("f4", [1, 2]), ("f5", [2])):
        net.start(fid, ports, 100.0, 0.0)
    rates = {f: net.rate(f) for f in ("f1", "f2", "f3", "f4", "f5")}
    assert rates == pytest.approx({"f1": 1.0, "f2": 1.0, "f3": 1.0, "f4": 2.0, "f5": 2.0})


def test_a_flows_cap_limits_it_and_the_rest_of_the_port_goes_to_the_others():
    net = FlowNetwork([10.0])
    net.start("capped", [0], 100.0, 0.0, cap=2.0)
    net.start("a", [0], 100.0, 0.0)
    net.start("b", [0], 100.0, 0.0)
    assert net.rate("capped") == 2.0
    assert net.rate("a") == net.rate("b") == 4.0
    assert net.next_completion() == (25.0, "a")  # start order breaks the tie with b


def test_a_flow_without_ports_is_limited_by_its_cap_alone_and_shares_nothing():
    net = FlowNetwork([10.0])
    net.start("intra", [], 100.0, 0.0, cap=50.0)  # inside a node: no NIC port
    net.start("inter", [0], 100.0, 0.0)
    assert net.rate("intra") == 50.0
    assert net.rate("inter") == 10.0
    assert drain(net) == {"intra": 2.0, "inter": 10.0}


def test_a_servers_concurrent_replies_share_its_egress_and_finish_together():
    n, nbytes, nic = 8, 1e6, 1.25e9
    net = FlowNetwork([nic] * 2 * (n + 1))
    server, t0 = n, 3.0
    for w in range(n):
        net.start(("reply", w), (egress(server), ingress(w)), nbytes, t0)
    finished = drain(net)
    ends = set(finished.values())
    assert len(ends) == 1  # all at the same instant, exactly
    assert ends.pop() == pytest.approx(t0 + n * nbytes / nic, rel=1e-12)
    # FCFS (the Ledger) would have sent the first reply whole, done at t0 + nbytes / nic.
    assert min(finished.values()) > t0 + nbytes / nic


def test_flows_started_together_cost_one_recompute_and_finish_together_in_one_call():
    # Without pools (which would keep these replies as one, see the pool tests below).
    n, nbytes, nic = 64, 1e6, 1.25e9
    one_by_one = FlowNetwork([nic] * 2 * (n + 1), pools=False)
    batched = FlowNetwork([nic] * 2 * (n + 1), pools=False)
    replies = [(("reply", w), (egress(n), ingress(w)), nbytes) for w in range(n)]
    for fid, ports, size in replies:
        one_by_one.start(fid, ports, size, 1.0)
    batched.start_many(1.0, replies)
    assert batched.last_recompute == n
    assert all(batched.rate(f) == one_by_one.rate(f) == nic / n for f, _, _ in replies)
    when, first = batched.next_completion()
    assert first == ("reply", 0)
    batched.advance(when)
    assert batched.due() == [f for f, _, _ in replies]  # all of them, in start order
    batched.finish_many(batched.due())
    assert len(batched) == 0 and batched.next_completion() is None
    assert drain(one_by_one) == dict.fromkeys((f for f, _, _ in replies), when)


def test_a_batch_with_one_bad_flow_starts_none():
    net = FlowNetwork([10.0])
    with pytest.raises(ValueError, match="already"):
        net.start_many(0.0, [("a", [0], 1.0), ("b", [0], 1.0, 2.0), ("a", [0], 1.0)])
    with pytest.raises(ValueError, match="nbytes"):
        net.start_many(0.0, [("a", [0], 1.0), ("b", [0], -1.0)])
    assert len(net) == 0
    net.start_many(0.0, [("a", [0], 10.0), ("b", [0], 10.0, 2.0)])
    with pytest.raises(KeyError):
        net.finish_many(["a", "nope"])
    assert net.rate("a") == 8.0 and net.rate("b") == 2.0


def test_zero_byte_flows_finish_at_their_start_and_take_no_share():
    net = FlowNetwork([10.0])
    net.start("big", [0], 100.0, 0.0)
    net.start("empty", [0], 0.0, 2.0)
    assert net.rate("big") == 10.0
    assert net.next_completion() == (2.0, "empty")
    net.finish("empty", 2.0)
    assert net.next_completion() == (10.0, "big")


def test_next_completion_orders_by_time_then_by_start_order_deterministically():
    def run():
        net = FlowNetwork([10.0, 10.0])
        net.start("z", [0], 30.0, 0.0)
        net.start("y", [1], 10.0, 0.0)
        net.start("x", [0], 30.0, 0.0)
        net.start("w", [1], 10.0, 0.0)
        order = []
        while (nxt := net.next_completion()) is not None:
            net.finish(nxt[1], nxt[0])
            order.append(nxt)
        return order

    first = run()
    # y and w: 10 bytes at 5/s -> 2; z and x: 30 at 5/s -> 6. Ties go to the earlier start.
    assert first == [(2.0, "y"), (2.0, "w"), (6.0, "z"), (6.0, "x")]
    assert run() == first
    assert FlowNetwork([1.0]).next_completion() is None


def test_time_only_moves_forward():
    net = FlowNetwork([10.0])
    net.start("a", [0], 100.0, 5.0)
    with pytest.raises(ValueError, match="before"):
        net.start("b", [0], 100.0, 4.0)
    with pytest.raises(ValueError, match="before"):
        net.advance(4.9)
    assert "b" not in net  # the rejected start left nothing behind
    assert net.rate("a") == 10.0


def test_bad_arguments_are_refused():
    net = FlowNetwork([10.0])
    net.start("a", [0], 1.0, 0.0)
    with pytest.raises(ValueError, match="already"):
        net.start("a", [0], 1.0, 0.0)
    with pytest.raises(ValueError, match="no port"):
        net.start("b", [1], 1.0, 0.0)
    with pytest.raises(ValueError, match="cap"):
        net.start("c", [0], 1.0, 0.0, cap=0.0)
    with pytest.raises(ValueError, match="capacity"):
        FlowNetwork([10.0, 0.0])


def test_a_flow_cancelled_midway_gives_its_share_back():
    net = FlowNetwork([10.0])
    net.start("a", [0], 100.0, 0.0)
    net.start("b", [0], 100.0, 0.0)
    net.finish("b", 4.0)  # 80 of a's bytes left, alone from 4 on
    assert net.remaining("a") == 80.0
    assert net.next_completion() == (12.0, "a")


def test_a_change_recomputes_only_the_flows_linked_to_it_through_shared_ports():
    net = FlowNetwork([10.0] * 6)
    net.start("a", [0, 1], 100.0, 0.0)
    net.start("b", [1, 2], 100.0, 0.0)  # linked to a through port 1
    assert net.last_recompute == 2
    assert net.rate("a") == net.rate("b") == 5.0
    net.start("c", [3, 4], 100.0, 1.0)  # unrelated ports
    assert net.last_recompute == 1
    assert net.rate("a") == net.rate("b") == 5.0
    assert net.remaining("a") == 95.0
    net.start("d", [2, 5], 100.0, 2.0)  # joins a and b's component through port 2
    assert net.last_recompute == 3
    net.finish("b", 2.0)  # a and d are no longer linked: each recomputed on its own
    assert net.last_recompute == 2
    assert net.rate("a") == net.rate("d") == 10.0
    assert net.rate("c") == 10.0


def test_rates_are_max_min_fair_on_a_random_network():
    # Check the defining property on a random network: every flow is either at its cap or
    # crosses a saturated port where no other flow gets more than it (its bottleneck).
    rng = random.Random(58)
    ports = 24
    caps = [rng.choice([1.0, 2.5, 10.0]) for _ in range(ports)]
    net = FlowNetwork(caps)
    flows = {}
    for i in range(60):
        fp = rng.sample(range(ports), rng.randint(1, 3))
        cap = rng.choice([math.inf, math.inf, 0.7, 3.0])
        net.start(i, fp, 1e9, 0.0, cap=cap)
        flows[i] = (fp, cap)
    load = [0.0] * ports
    for i, (fp, _) in enumerate(flows.values()):
        for p in fp:
            load[p] += net.rate(i)
    assert all(load[p] <= caps[p] * (1 + 1e-9) for p in range(ports))
    for i, (fp, cap) in flows.items():
        r = net.rate(i)
        if r == pytest.approx(cap, rel=1e-9):
            continue
        assert any(load[p] == pytest.approx(caps[p], rel=1e-9)
                   and all(net.rate(j) <= r * (1 + 1e-9) for j, (q, _) in flows.items()
                           if p in q)
                   for p in fp), f"flow {i} has no bottleneck"


def reference_rates(capacities, flows):
    """Max-min rates by textbook progressive filling over the whole network, naively: raise
    every unfrozen flow together to the next saturation, freeze what saturated, repeat."""
    residual = list(capacities)
    rates, unfrozen = {}, dict(flows)
    while unfrozen:
        users = {}
        for ports, _ in unfrozen.values():
            for p in ports:
                users[p] = users.get(p, 0) + 1
        level = min([residual[p] / n for p, n in users.items()]
                    + [cap for _, cap in unfrozen.values()])
        saturated = {p for p, n in users.items() if residual[p] / n <= level * (1 + 1e-12)}
        for fid, (ports, cap) in list(unfrozen.items()):
            if cap <= level * (1 + 1e-12) or saturated.intersection(ports):
                rates[fid] = level
                del unfrozen[fid]
                for p in ports:
                    residual[p] -= level
    return rates


def test_component_local_rates_equal_a_global_recompute_through_starts_and_finishes():
    rng = random.Random(7)
    caps = [rng.choice([1.0, 3.0, 8.0]) for _ in range(40)]
    net, live = FlowNetwork(caps), {}
    t = 0.0
    for i in range(300):
        t += rng.choice([0.0, 0.01])
        if live and rng.random() < 0.4:
            fid = rng.choice(sorted(live))
            net.finish(fid, t)
            del live[fid]
        else:
            ports = rng.sample(range(len(caps)), rng.randint(1, 2))
            cap = rng.choice([math.inf, math.inf, 0.5])
            net.start(i, ports, 1e9, t, cap=cap)
            live[i] = (ports, cap)
        expected = reference_rates(caps, live)
        assert {f: net.rate(f) for f in live} == pytest.approx(expected, rel=1e-9)


def test_performance_2000_flows_on_1024_ports_started_and_finished_in_order():
    # 512 ranks (1,024 ports); flows begin every 10 us between random pairs, and completions
    # are handled in order in between, the simulator's loop.
    rng = random.Random(1)
    ranks, nic = 512, 1.25e9
    net = FlowNetwork([nic] * 2 * ranks)
    begin = time.perf_counter()
    finished = {}

    def complete_until(limit):
        while (nxt := net.next_completion()) is not None and nxt[0] <= limit:
            net.finish(nxt[1], nxt[0])
            finished[nxt[1]] = nxt[0]

    starts = {}
    for i in range(2000):
        t = i * 1e-5
        complete_until(t)
        src, dst = rng.sample(range(ranks), 2)
        net.start(i, (egress(src), ingress(dst)), rng.uniform(1e3, 1e6), t)
        starts[i] = t
    complete_until(math.inf)
    elapsed = time.perf_counter() - begin
    print(f"2,000 flows on 1,024 ports: {elapsed:.3f} s")
    assert len(finished) == 2000 and len(net) == 0
    assert all(finished[i] >= starts[i] for i in starts)
    assert elapsed < 5.0  # about 0.1 s unloaded; generous, the machine is shared



def run_schedule(net, schedule, transports_calls=False):
    """Start each (t, fid, ports, nbytes, cap) at t, completing flows in order in between (the
    simulator's loop); a negative nbytes extends flow fid by -nbytes instead. Returns
    {flow id: finish time} and the sum of last_recompute over every call. With
    `transports_calls`, through the calls network/transport.py makes (start_later, settled
    at the start's instant as the transport's _settled does; next_time, take_due,
    finish_checked) instead of the checked public ones."""
    finished, work = {}, 0

    def complete_until(limit):
        nonlocal work
        while True:
            if transports_calls:
                at = net.next_time()
                if at is None or at > limit:
                    return
                net.advance(at)
                due = net.take_due()
                net.finish_checked(due)
            else:
                nxt = net.next_completion()
                if nxt is None or nxt[0] > limit:
                    return
                at = nxt[0]
                net.advance(at)
                due = net.due()
                assert nxt[1] in due
                net.finish_many(due)
            work += net.last_recompute
            finished.update(dict.fromkeys(due, at))

    for t, fid, ports, nbytes, cap in schedule:
        complete_until(t)
        net.advance(t)
        if nbytes < 0:
            if fid in net:
                net.extend(fid, -nbytes)
            continue
        if transports_calls:
            net.start_later(t, fid, tuple(ports), nbytes, cap)
            net.settle()
        else:
            net.start(fid, ports, nbytes, t, cap=cap)
        work += net.last_recompute
    complete_until(math.inf)
    return finished, work


@pytest.mark.parametrize("seed", range(6))
def test_pooled_flows_finish_when_progressive_filling_says_on_random_incasts(seed):
    # Pushes into a few servers and their replies (pools form at the servers' ports), mixed
    # with what dissolves a pool: flows between workers that share a member's own port, caps
    # that bound a member below the even share once others leave, extensions. Every flow's
    # finish time is progressive filling's.
    rng = random.Random(seed)
    workers, servers, nic = 200, 3, 1e3
    caps = [nic] * 2 * (workers + servers)
    schedule, t = [], 0.0
    for i in range(400):
        t += rng.expovariate(50.0)
        w, srv = rng.randrange(workers), workers + rng.randrange(servers)
        kind = rng.random()
        if kind < 0.485:
            ports = (egress(w), ingress(srv))
        elif kind < 0.97:
            ports = (egress(srv), ingress(w))
        else:
            ports = (egress(w), ingress(rng.randrange(workers)))
        cap = nic / 4 if rng.random() < 0.04 else math.inf
        schedule.append((t, i, ports, rng.uniform(1.0, 200.0), cap))
        if rng.random() < 0.1:
            schedule.append((t, rng.randrange(i + 1), (), -rng.uniform(1.0, 50.0), None))
    pooled, pooled_work = run_schedule(FlowNetwork(caps), schedule)
    filled, filled_work = run_schedule(FlowNetwork(caps, pools=False), schedule)
    assert pooled.keys() == filled.keys() and len(pooled) == 400
    assert pooled == pytest.approx(filled, rel=1e-9, abs=1e-9)
    # Pools took part (under this much overlap a server's flows are often one component with
    # the rest, so the saving is modest; the pure incast below is where they pay).
    assert pooled_work < filled_work
    # The transport's lighter calls play the same network: every finish time and every
    # recompute the same, to the bit.
    assert run_schedule(FlowNetwork(caps), schedule, transports_calls=True) == (pooled,
                                                                                 pooled_work)


def test_an_incast_joining_one_push_at_a_time_sets_one_rate_a_start_and_none_a_finish():
    workers, nic, nbytes = 1024, 1.25e9, 1e6
    net = FlowNetwork([nic] * 2 * (workers + 1))
    server = workers
    begin = time.perf_counter()
    for w in range(workers):
        net.start(w, (egress(w), ingress(server)), nbytes, w * 1e-6)
        assert net.last_recompute == (2 if w == 1 else 1)  # the second forms the pool
        assert net.rate(0) == net.rate(w) == nic / (w + 1)
    ends = []
    while (nxt := net.next_completion()) is not None:
        net.finish(nxt[1], nxt[0])
        assert net.last_recompute == 0
        ends.append(nxt)
    elapsed = time.perf_counter() - begin
    print(f"incast of 1,024 pushes one at a time: {elapsed:.3f} s")
    assert [fid for _, fid in ends] == list(range(workers))  # first in, first done
    # All bytes through the server's NIC at its full rate from the first push on.
    assert ends[-1][0] == pytest.approx(workers * nbytes / nic, rel=1e-9)
    assert elapsed < 2.0  # about 0.05 s unloaded (quadratic: about 10 s); the machine is shared


def test_a_pool_dissolves_when_a_members_own_port_is_shared_and_its_rates_stay_max_min():
    net = FlowNetwork([10.0] * 8)
    net.start_many(0.0, [("a", [0, 1], 100.0), ("b", [2, 1], 100.0)])  # a pool at port 1
    assert net.last_recompute == 2 and net.rate("a") == net.rate("b") == 5.0
    net.start("c", [0, 3], 100.0, 2.0)  # a's own port 0 is now shared
    assert net.last_recompute == 3  # progressive filling over a, b and c
    assert net.rate("a") == net.rate("b") == net.rate("c") == 5.0
    assert net.remaining("a") == net.remaining("b") == 90.0
    net.finish("c", 4.0)
    assert net.rate("a") == net.rate("b") == 5.0
    assert net.remaining("a") == 80.0
    assert drain(net) == {"a": 20.0, "b": 20.0}


# --- Rendezvous ----------------------------------------------------------------------------


def test_a_large_message_starts_only_when_its_receiver_posts_late():
    rv = Rendezvous(eager_bytes=64e3)
    assert rv.send(0, 1, "grad", 1e6, 2.0, payload="p") == []
    assert rv.pending() == Pending(sends=1, eager=0, receives=0)
    (m,) = rv.post_receive(1, 0, "grad", 5.0)
    assert m == Match(0, 1, "grad", 1e6, "p", sent_at=2.0, received_at=5.0, start=5.0)
    assert rv.pending() == Pending(0, 0, 0)


def test_a_large_message_to_a_receive_already_posted_starts_at_its_send():
    rv = Rendezvous(eager_bytes=64e3)
    assert rv.post_receive(1, 0, "grad", 1.0) == []
    assert rv.pending() == Pending(sends=0, eager=0, receives=1)
    (m,) = rv.send(0, 1, "grad", 1e6, 3.0)
    assert (m.received_at, m.start, m.eager) == (1.0, 3.0, False)
    assert rv.pending() == Pending(0, 0, 0)


def test_a_small_message_starts_at_its_send_and_a_late_receive_binds_to_it_without_delay():
    rv = Rendezvous(eager_bytes=64e3)
    (m,) = rv.send(0, 1, "ctl", 100, 2.0, payload="hello")
    assert (m.sent_at, m.received_at, m.start, m.eager) == (2.0, None, 2.0, True)
    assert rv.pending() == Pending(sends=0, eager=1, receives=0)
    # The receive returns the same message, bound (received_at), its start unchanged: the
    # caller started its flow at the send and starts no second one.
    (bound,) = rv.post_receive(1, 0, "ctl", 9.0)
    assert (bound.payload, bound.received_at, bound.start, bound.eager) == ("hello", 9.0, 2.0,
                                                                            True)
    assert rv.pending() == Pending(0, 0, 0)
    # The threshold itself is eager.
    assert rv.send(0, 1, "ctl", 64e3, 10.0)[0].start == 10.0


def test_a_receive_from_any_source_takes_the_earliest_message_sent():
    rv = Rendezvous(eager_bytes=0)
    rv.send(3, 9, "k", 1e6, 1.0, payload="from 3")
    rv.send(1, 9, "k", 1e6, 2.0, payload="from 1")
    rv.send(2, 9, "other key", 1e6, 0.5, payload="other key")
    rv.send(4, 8, "k", 1e6, 0.5, payload="to 8")
    assert [m.payload for m in rv.post_receive(9, ANY, "k", 3.0)] == ["from 3"]
    assert [m.payload for m in rv.post_receive(9, ANY, "k", 3.0)] == ["from 1"]
    assert rv.post_receive(9, ANY, "k", 4.0) == []  # waits
    (m,) = rv.send(5, 9, "k", 1e6, 6.0, payload="from 5")
    assert (m.src, m.received_at, m.start) == (5, 4.0, 6.0)
    with pytest.raises(ValueError):
        rv.send(ANY, 9, "k", 1.0, 7.0)


def test_a_streams_messages_match_its_receives_in_order():
    rv = Rendezvous(eager_bytes=10)
    rv.send(0, 1, "k", 1e6, 1.0, payload="first")
    rv.send(0, 1, "k", 5, 2.0, payload="second (eager)")
    rv.send(0, 1, "k", 1e6, 3.0, payload="third")
    rv.send(2, 1, "k", 1e6, 0.0, payload="another stream")
    got = [rv.post_receive(1, 0, "k", 4.0 + i)[0] for i in range(3)]
    assert [m.payload for m in got] == ["first", "second (eager)", "third"]
    assert [m.start for m in got] == [4.0, 2.0, 6.0]
    assert rv.pending() == Pending(sends=1, eager=0, receives=0)


def test_receives_from_any_source_and_from_one_take_a_streams_messages_in_order():
    # A stream's one message is kept as itself and two or more as a queue: either way its
    # receives, from ANY or from its source, take them first to first.
    rv = Rendezvous(eager_bytes=0)
    for src, t, payload in [(0, 1.0, "0a"), (2, 2.0, "2a"), (0, 3.0, "0b"), (0, 4.0, "0c")]:
        rv.send(src, 1, "k", 1e6, t, payload=payload)
    taken = [rv.post_receive(1, ANY, "k", 5.0)[0].payload,
             rv.post_receive(1, 0, "k", 5.0)[0].payload,
             rv.post_receive(1, ANY, "k", 5.0)[0].payload,
             rv.post_receive(1, ANY, "k", 5.0)[0].payload]
    assert taken == ["0a", "0b", "2a", "0c"]
    assert rv.pending() == Pending(0, 0, 0)
    rv.send(0, 1, "k", 1e6, 6.0, payload="0d")  # the stream, emptied, carries a new message
    assert rv.post_receive(1, 0, "k", 7.0)[0].payload == "0d"


def test_a_message_goes_to_the_earliest_posted_receive_that_can_take_it():
    rv = Rendezvous(eager_bytes=0)
    rv.post_receive(1, ANY, "k", 1.0)
    rv.post_receive(1, 0, "k", 2.0)
    assert rv.send(0, 1, "k", 1e6, 3.0)[0].received_at == 1.0  # the ANY receive, posted first
    assert rv.send(0, 1, "k", 1e6, 4.0)[0].received_at == 2.0
    assert rv.pending() == Pending(0, 0, 0)


def test_performance_an_incast_of_1024_flows_started_and_finished_in_one_call_each():
    # 1,024 workers push to one server at once: one component of 1,024 flows. One at a time
    # would cost 1,024 recomputes of a growing component; the batch costs two.
    workers, nic = 1024, 1.25e9
    net = FlowNetwork([nic] * 2 * (workers + 1))
    begin = time.perf_counter()
    net.start_many(0.0, [(w, (egress(w), ingress(workers)), 1e6) for w in range(workers)])
    when, _ = net.next_completion()
    net.advance(when)
    due = net.due()
    net.finish_many(due)
    elapsed = time.perf_counter() - begin
    print(f"incast of 1,024 flows, batched: {elapsed:.3f} s")
    assert when == pytest.approx(workers * 1e6 / nic, rel=1e-12)
    assert len(due) == workers and len(net) == 0
    assert elapsed < 2.0  # about 0.01 s unloaded; generous, the machine is shared


def test_a_flow_handed_over_must_be_alone_unless_its_pairs_rate_comes_with_it():
    # Without a rate a flow comes in at its bound, so its ports must be idle; two flows a
    # caller kept sharing port 0 come in together, each with its rate among them (5 of 10);
    # an id already in is refused.
    net = FlowNetwork([10.0, 10.0, 10.0])
    net.adopt("a", 0, (0, 1), 20.0, 20.0, 0.0, math.inf, rate=5.0)
    with pytest.raises(ValueError, match="not alone"):
        net.adopt("b", 1, (0, 2), 20.0, 20.0, 0.0, math.inf)
    net.adopt("b", 1, (0, 2), 20.0, 20.0, 0.0, math.inf, rate=5.0)
    assert net.rate("a") == net.rate("b") == 5.0
    assert net.next_completion() == (4.0, "a")  # 20 bytes at 5, the earlier start first
    with pytest.raises(ValueError, match="already started"):
        net.adopt("a", 2, (1,), 1.0, 1.0, 0.0, math.inf, rate=1.0)


def test_extending_a_flow_keeps_every_rate_and_moves_only_its_end():
    net = FlowNetwork([10.0, 10.0])
    net.start_many(0.0, [("a", [0], 20.0), ("b", [0, 1], 40.0)])
    net.advance(2.0)  # a and b at 5 each: a has 10 left, b 30
    recomputed = net.last_recompute
    net.extend("a", 15.0)
    assert net.rate("a") == 5.0 and net.rate("b") == 5.0
    assert net.remaining("a") == pytest.approx(25.0)
    assert net.last_recompute == recomputed  # nothing recomputed
    assert net.next_completion() == (pytest.approx(7.0), "a")
    with pytest.raises(ValueError):
        net.extend("a", -1.0)
