"""Copies of hetbench with one part of the worker loop taken out, for harness_overhead.py's
`--also NAME=DIR` sides: what each part costs, measured side by side in one sitting (issue 44:
on a GPU the harness ran at 0.93 of a plain DDP loop, and the gap was not where it was looked
for first).

    .venv/bin/python benchmarks/overhead_variants.py --out .exp nohook noanchor nosnapshots
    .venv/bin/python benchmarks/overhead_variants.py --out .exp before=9faa57a
    python3 benchmarks/harness_overhead.py --device cuda --model resnet18 --impl ddp \
        --workers 2 --batch 128 --iterations 150 --settle-s 2 \
        --also nohook=.exp/nohook --also before=.exp/before

Each NAME makes OUT/NAME/hetbench: this checkout's package with that part replaced (PARTS
below: the exact lines, so a variant fails loudly once the code it edits has changed), or
NAME=COMMIT, the package as it was at a commit (`git archive`). A variant measures; it is not
a version to run anything else with (`nohook` counts no DDP traffic and ends compute after
backward, so a slowdown there would multiply the last all-reduce's wait).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: name -> (file under hetbench/, the exact text, what replaces it, what is taken out).
PARTS = {
    "nohook": (
        "algorithms/allreduce.py",
        "            self._ddp.register_comm_hook(state, _ending_compute_first(ctx, hook))",
        "            if self.config.compression == \"powersgd\":  # overhead_variants: nohook\n"
        "                self._ddp.register_comm_hook(state, _ending_compute_first(ctx, hook))",
        "the Python DDP communication hook (DDP's C++ all-reduce instead)"),
    "noanchor": (
        "harness/compute_end.py",
        "ANCHOR_S = 1.0",
        "ANCHOR_S = 1e9  # overhead_variants: noanchor",
        "the compute clock's stream wait once a second (one anchor at the start)"),
    "nosnapshots": (
        "harness/worker.py",
        "snapshots.maybe_take(elapsed_s, iteration, model) if snapshots else 0.0) / dilation",
        "0.0) / dilation  # overhead_variants: nosnapshots",
        "the evaluation snapshots taken during training (a device copy of the model a tick)"),
    "noloss": (
        "harness/worker.py",
        "                    loss = loss_for_line(loss)  # read when the line is written: no wait",
        "                    loss = None  # overhead_variants: noloss",
        "reading each step's loss for its event line"),
}


def make(name: str, out: Path) -> Path:
    """OUT/NAME/hetbench for one NAME or NAME=COMMIT; returns OUT/NAME."""
    name, _, commit = name.partition("=")
    target = out / name
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    if commit:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "hetbench"],
                                 capture_output=True, check=False)
        if archive.returncode != 0:
            sys.exit(f"{name}={commit}: git archive failed: {archive.stderr.decode()[-300:]}")
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
        return target
    if name not in PARTS:
        sys.exit(f"unknown variant {name!r}: one of {', '.join(PARTS)}, or NAME=COMMIT")
    shutil.copytree(ROOT / "hetbench", target / "hetbench",
                    ignore=shutil.ignore_patterns("__pycache__"))
    path, old, new, _ = PARTS[name]
    source = target / "hetbench" / path
    text = source.read_text()
    if text.count(old) != 1:
        sys.exit(f"{name}: hetbench/{path} no longer holds the line it replaces "
                 f"({old.strip()!r}); update PARTS")
    source.write_text(text.replace(old, new))
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="+", metavar="NAME[=COMMIT]",
                        help="variants: " + "; ".join(f"{k}: without {v[3]}"
                                                      for k, v in PARTS.items()))
    parser.add_argument("--out", type=Path, default=ROOT / ".exp")
    args = parser.parse_args()
    for name in args.names:
        print(f"--also {name.partition('=')[0]}={make(name, args.out)}")


if __name__ == "__main__":
    main()
