"""Issue 37's theory check: D-PSGD's consensus distance on a ring against its spectral gap.

    .venv/bin/python benchmarks/learn_spectral.py --out results/benchmarks/learn-spectral

`bench sim --learn` plays D-PSGD on a ring (uniform weights 1/3, no momentum) at 16, 256 and
1,024 workers, the same step size and minibatch size, on svm's synthetic data (65,536 samples),
and reads each run's final consensus distance (the workers' mean squared distance from their
average). The ring's mixing matrix W has eigenvalues 1/3 + 2/3 cos(2 pi j / n). The
deviation from the average, e_k = (I - J) x_k, evolves as e_{k+1} = W e_k - lr (I - J) g_k, so
after K steps each mode j of the gradients' disagreement is carried by W^s, s < K:

- gradient noise independent across steps and workers (the minibatch draws) leaves
  N(n, K) = (1/n) sum_j (1 - l_j^2K) / (1 - l_j^2) per unit of noise;
- a disagreement that persists (each worker's own shard of the data) leaves
  H(n, K) = (1/n) sum_j ((1 - l_j^K) / (1 - l_j))^2 per unit of it.

Both grow with n while the ring's spectral gap 1 - l_2 ~ 2 pi^2 / (3 n^2) shrinks; N saturates at
K terms once the gap is below 1/K, H at K^2. The minibatch noise is the same at every n (the
same batch size), but a shard's own disagreement is not: n workers split the 65,536 samples,
and a shard mean's variance grows as its size shrinks, with n. So the persistent term's unit
grows with n too (the third column: H(n, K) n / 16, relative to 16 workers). The measured
growth from 16 to 256 and 1,024 workers is compared with the three.
Writes OUT/spectral.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(sys.executable).parent / "bench"
SIZES = (16, 256, 1024)


def ring_eigenvalues(n: int) -> list[float]:
    """W's eigenvalues but the consensus one (j = 0): uniform weights 1/3 on a ring."""
    return [1 / 3 + 2 / 3 * math.cos(2 * math.pi * j / n) for j in range(1, n)]


def noise_term(n: int, k: int) -> float:
    return sum((1 - lam ** (2 * k)) / (1 - lam * lam) for lam in ring_eigenvalues(n)) / n


def persistent_term(n: int, k: int) -> float:
    return sum(((1 - lam ** k) / (1 - lam)) ** 2 for lam in ring_eigenvalues(n)) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results/benchmarks/learn-spectral")
    parser.add_argument("--iterations", type=int, default=300)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    matrix = args.out / "spectral.toml"
    matrix.write_text(
        'name = "learn-spectral"\nalgorithms = ["dpsgd"]\nworkloads = ["svm"]\n'
        f"workers = {list(SIZES)}\niterations = {args.iterations}\npace_ms = 10\nlearn = true\n"
        '[algorithm.dpsgd]\ntopology = "ring"\nweights = "uniform"\n'
        "[workload.svm]\nsamples = 65536\nmomentum = 0.0\n")
    subprocess.run([str(BENCH), "sim", str(matrix), "--out", str(args.out / "sim")], check=True)
    measured = {}
    for run in (args.out / "sim").iterdir():
        if run.is_dir() and (run / "summary.json").is_file():
            summary = json.loads((run / "summary.json").read_text())
            config = json.loads((run / "config.json").read_text())
            measured[config["workers"]] = summary["final_consensus_distance"]
    k = args.iterations
    rows = []
    for n in SIZES:
        rows.append({"workers": n, "consensus": measured[n],
                     "measured_growth": measured[n] / measured[SIZES[0]],
                     "noise_growth": noise_term(n, k) / noise_term(SIZES[0], k),
                     "persistent_growth": persistent_term(n, k) / persistent_term(SIZES[0], k),
                     "persistent_shard_growth": persistent_term(n, k) * n
                     / (persistent_term(SIZES[0], k) * SIZES[0]),
                     "spectral_gap": 1 - max(ring_eigenvalues(n))})
    (args.out / "spectral.json").write_text(json.dumps(rows, indent=1))
    print("| workers | spectral gap | final consensus | growth from 16 | noise-only theory | "
          "persistent-only theory | persistent, shards shrinking |\n"
          "|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['workers']} | {r['spectral_gap']:.2e} | {r['consensus']:.3e} | "
              f"{r['measured_growth']:.2f} | {r['noise_growth']:.2f} | "
              f"{r['persistent_growth']:.2f} | {r['persistent_shard_growth']:.1f} |")


if __name__ == "__main__":
    main()
