"""An experiment on the fair transport (issue 58), not the model: what Hop's link-bound bed runs
would take if a receive's notice waited behind the receiver's own data to that peer.

    python benchmarks/notice_probe.py                        # the bed's 307 KB cells
    python benchmarks/notice_probe.py \
        --table docs/results/fair-transport-bed-large-host-fair-relinked.json \
        --hidden 32768 --iterations 20 --pause-every 10     # its 9.7 MB cell

gloo tells a sender that its receiver has posted a receive with a control message in the
pair's one TCP stream, and queues it behind the pair's writes still pending
(gloo/transport/tcp/pair.cc: sendNotifyRecvReady -> sendAsyncMode, "if an earlier operation
hasn't finished transmitting, add this operation to the transmit queue"). So a receive that a
worker posts while its own message to that peer is still going out reaches the peer only with
that message's last bytes. The fair transport posts it at once. Here a subclass of the
transport (NoticeBehindData) holds such a receive until the receiver's flows to that peer have
landed, and bench sim plays each bed of a stored fair_bed_relink.py table (its link-bound
matrix, workers, link and round trip) with and without it, each also with one pause of
every worker's compute (`compose:gc(every=N;pause=P)`: each worker once every N iterations, at
its own phase, P x its compute), since workers that stay in step never post a receive while
their data to that peer moves. Printed beside them: the table's shaped run, and its fair
prediction, which the plain transport without a pause reproduces. Runs in-process: nothing of
hetbench is changed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import hetbench.sim.engine  # noqa: E402
from hetbench.cli.main import main as bench  # noqa: E402
from hetbench.network.transport import ANY, Transport  # noqa: E402
from hetbench.testbed.measure import link_bound_matrix, network_table  # noqa: E402

#: The host-fair beds on the link timed where its bytes arrive (fair_bed_relink.py's output).
TABLE = ROOT / "docs" / "results" / "fair-transport-bed-host-fair-relinked.json"


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
    parser.add_argument("--table", type=Path, default=TABLE)
    parser.add_argument("--algorithm", default="hop")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--iterations", type=int, default=120)
    parser.add_argument("--pause-every", type=int, default=100)
    parser.add_argument("--pause", type=float, default=2.0)
    args = parser.parse_args()
    paused = f"compose:gc(every={args.pause_every};pause={args.pause})"
    cells = [cell for cell in json.loads(args.table.read_text())["cells"]
             if cell["algorithm"] == args.algorithm]
    for cell in cells:
        text = link_bound_matrix("notice-probe", [args.algorithm], cell["workers"],
                                 args.iterations, args.hidden)
        link = {"payload_gbps": cell["link_mbit_s"] / 1000, "rtt_us": cell["rtt_us"]}
        text += network_table(link, transport="fair")
        row = {key: cell[key] for key in ("hosts", "rate", "link_mbit_s", "shaped", "fair")}
        for slowdown in ("none", paused):
            matrix = text.replace("seeds = [1]", f'seeds = [1]\nslowdown = ["{slowdown}"]')
            for notice in (False, True):
                row[f"{slowdown}, notice {'behind data' if notice else 'at once'}"] = round(
                    throughput(matrix, notice), 1)
        print(json.dumps(row))


if __name__ == "__main__":
    main()
