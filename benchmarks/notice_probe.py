"""An experiment on the fair transport (issue 58), not the model: what Hop's link-bound bed runs
would take if a receive's notice waited behind the receiver's own data to that peer.

    python benchmarks/notice_probe.py                        # the bed's 307 KB cells
    python benchmarks/notice_probe.py --hidden 32768 --iterations 20 --pause-every 10

gloo tells a sender that its receiver has posted a receive with a control message in the
pair's one TCP stream, and queues it behind the pair's writes still pending
(gloo/transport/tcp/pair.cc: sendNotifyRecvReady -> sendAsyncMode, "if an earlier operation
hasn't finished transmitting, add this operation to the transmit queue"). So a receive that a
worker posts while its own message to that peer is still going out reaches the peer only with
that message's last bytes. The fair transport posts it at once. Here a subclass of the
transport (NoticeBehindData) holds such a receive until the receiver's flows to that peer have
landed, and bench sim plays the bed's link-bound matrix (testbed.measure.link_bound_matrix on
one-rank hosts and the link as measured) with and without it, each also with one pause of
every worker's compute (`compose:gc(every=N;pause=P)`: each worker once every N iterations, at
its own phase, P x its compute), since workers that stay in step never post a receive while
their data to that peer moves. Runs in-process: nothing of hetbench is changed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bed_probe import workers_on_bed  # noqa: E402

import hetbench.sim.engine  # noqa: E402
from hetbench.cli.main import main as bench  # noqa: E402
from hetbench.network.transport import ANY, Transport  # noqa: E402
from hetbench.testbed.measure import link_bound_matrix, network_table  # noqa: E402

#: The bed's links as testbed.measure measured them (docs/results/
#: fair-transport-bed-host-fair-relinked.json): (hosts, Mbit/s of payload, round trip in us).
BEDS = [(5, 47.81, 69.2), (8, 47.81, 78.9), (5, 95.56, 51.7), (8, 95.56, 74.0)]


class NoticeBehindData(Transport):
    """The fair transport, with a receive that dst posts for src held until every flow from
    dst to src has landed (its notice is behind their bytes in the pair's stream)."""

    def __init__(self, engine, cluster, shortcuts: bool = True):
        super().__init__(engine, cluster, shortcuts)
        self.outgoing: dict[tuple[int, int], int] = {}
        self.held: dict[tuple[int, int], list] = {}

    def _receive(self, dst, src, key) -> None:
        if src != ANY and self.outgoing.get((dst, src)):
            self.held.setdefault((dst, src), []).append(key)
            return
        super()._receive(dst, src, key)

    def _start(self, src, dst, nbytes, delivered, sent) -> None:
        self.outgoing[(src, dst)] = self.outgoing.get((src, dst), 0) + 1
        super()._start(src, dst, nbytes, (self._landed, src, dst, delivered), sent)

    def _landed(self, src, dst, delivered) -> None:
        delivered[0](*delivered[1:])
        pair = (src, dst)
        self.outgoing[pair] -= 1
        if not self.outgoing[pair]:
            del self.outgoing[pair]
            for key in self.held.pop(pair, ()):  # src's receives from dst, now noticed
                super()._receive(src, dst, key)


def throughput(matrix_text: str, notice: bool) -> float:
    hetbench.sim.engine.Transport = NoticeBehindData if notice else Transport
    work = Path(tempfile.mkdtemp(prefix="notice-probe-"))
    (work / "m.toml").write_text(matrix_text)
    bench(["sim", str(work / "m.toml"), "--out", str(work / "out")])
    (summary,) = (work / "out").glob("*/summary.json")
    return json.loads(summary.read_text())["throughput"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algorithm", default="hop")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--iterations", type=int, default=120)
    parser.add_argument("--pause-every", type=int, default=100)
    parser.add_argument("--pause", type=float, default=2.0)
    args = parser.parse_args()
    paused = f"compose:gc(every={args.pause_every};pause={args.pause})"
    rows = []
    for hosts, mbit, rtt in BEDS:
        text = link_bound_matrix("notice-probe", [args.algorithm],
                                 workers_on_bed(args.algorithm, hosts), args.iterations,
                                 args.hidden)
        text += network_table({"payload_gbps": mbit / 1000, "rtt_us": rtt}, transport="fair")
        row = {"hosts": hosts, "link_mbit_s": mbit}
        for slowdown in ("none", paused):
            matrix = text.replace("seeds = [1]", f'seeds = [1]\nslowdown = ["{slowdown}"]')
            for notice in (False, True):
                row[f"{slowdown}, notice {'behind data' if notice else 'at once'}"] = round(
                    throughput(matrix, notice), 1)
        rows.append(row)
        print(json.dumps(row))


if __name__ == "__main__":
    main()
