"""Per-iteration compute of the papers' models on one device: forward + backward + optimizer
step, batch norm in training mode, at the batch sizes below. Its numbers on a GPU are the
`compute_preset` table of emulated runs (hetbench/workloads/compute_presets.py).

    python benchmarks/gpu_compute.py --device cuda --out compute.json
    python benchmarks/gpu_compute.py --device cpu --quick   # checks the script itself

Each case: `--warmup` untimed iterations (cuDNN's algorithm choice, the allocator's growth), then
`--iterations` timed ones, each between two CUDA events on the compute stream (on CPU, the host
clock); the median is the figure, p10 and p90 beside it. The inputs are random tensors of the
data's shape: compute does not depend on the values. Precision: fp32 parameters and inputs, with
PyTorch's defaults for TF32 (recorded in the output), as hetbench's worker runs them.

Models: the Prague paper trains ResNet-18/50/200 on ImageNet and VGG-16 on CIFAR-10, the
Transformer on News-Commentary (shared/seeds' slides); the papers' text here gives no per-GPU
batch size, so the ImageNet ResNets are measured at 32, 64 and 128 images and the others at the
sizes hetbench's workloads use (VGG-16: 128 CIFAR images; the Transformer: 16 and 32 sequences of
256 tokens). The CIFAR forms of the ResNets (hetbench's workloads, 32x32 inputs) are measured at
128 too.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout, hetbench not installed
    sys.path.insert(0, str(ROOT))


def image_model(name: str, classes: int) -> nn.Module:
    from torchvision import models

    from hetbench.workloads.resnet import resnet200
    from hetbench.workloads.vgg16 import vgg16

    if name == "resnet200":
        return resnet200(num_classes=classes)
    if name == "vgg16":
        return vgg16("torchvision", 1.0, classes)
    return getattr(models, name)(num_classes=classes)


def transformer_model() -> nn.Module:
    from hetbench.workloads.transformer import SIZES, TransformerLM

    return TransformerLM(*SIZES["paper"])


#: (workload, input, batch, model, data shape without the batch, classes or vocabulary).
def cases(quick: bool) -> list[dict]:
    from hetbench.workloads.transformer import SIZES

    context, vocab = SIZES["paper"][4], SIZES["paper"][5]
    if quick:  # the script's own check on a CPU: one small case of each kind
        return [
            {"workload": "resnet18", "input": "cifar10-32", "batch": 4, "shape": (3, 32, 32),
             "classes": 10},
            {"workload": "transformer", "input": "paper-256", "batch": 1, "shape": (context,),
             "classes": vocab},
        ]
    rows = []
    for name in ("resnet18", "resnet50", "resnet200"):
        rows += [{"workload": name, "input": "imagenet-224", "batch": b, "shape": (3, 224, 224),
                  "classes": 1000} for b in (32, 64, 128)]
    for name in ("resnet18", "resnet50", "resnet200", "vgg16"):
        rows.append({"workload": name, "input": "cifar10-32", "batch": 128,
                     "shape": (3, 32, 32), "classes": 10})
    rows += [{"workload": "transformer", "input": "paper-256", "batch": b, "shape": (context,),
              "classes": vocab} for b in (16, 32)]
    return rows


def measure(case: dict, device: torch.device, warmup: int, iterations: int) -> dict:
    torch.manual_seed(0)
    is_text = case["workload"] == "transformer"
    model = (transformer_model() if is_text
             else image_model(case["workload"], case["classes"])).to(device)
    model.train()  # batch norm in training mode, as in training
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    batch = case["batch"]
    if is_text:
        x = torch.randint(0, case["classes"], (batch, *case["shape"]), device=device)
        y = torch.randint(0, case["classes"], (batch, *case["shape"]), device=device)
    else:
        x = torch.randn(batch, *case["shape"], device=device)
        y = torch.randint(0, case["classes"], (batch,), device=device)

    def step():
        optimizer.zero_grad()
        out = model(x)
        loss = nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        loss.backward()
        optimizer.step()

    cuda = device.type == "cuda"
    for _ in range(warmup):
        step()
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    times_ms = []
    for _ in range(iterations):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            times_ms.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            step()
            times_ms.append((time.perf_counter() - t0) * 1e3)
    times_ms.sort()
    return {
        **{k: v for k, v in case.items() if k != "shape"},
        "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 2),
        "median_ms": round(statistics.median(times_ms), 2),
        "p10_ms": round(times_ms[len(times_ms) // 10], 2),
        "p90_ms": round(times_ms[min(len(times_ms) - 1, len(times_ms) * 9 // 10)], 2),
        "iterations": iterations,
        "peak_memory_gb": (round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
                           if cuda else None),
    }


def machine(device: torch.device) -> dict:
    info = {"python": platform.python_version(), "torch": torch.__version__,
            "device": str(device), "cudnn_tf32": torch.backends.cudnn.allow_tf32,
            "matmul_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn_benchmark": torch.backends.cudnn.benchmark}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, gpu_memory_gb=round(props.total_memory / 2**30, 1),
                    cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version())
        try:
            import subprocess

            info["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            info["driver"] = None
    return info


def table(rows: list[dict]) -> str:
    lines = ["| workload | input | batch | params (M) | median ms | p10 ms | p90 ms | peak GB |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['workload']} | {r['input']} | {r['batch']} | {r['params_m']} | "
              f"{r['median_ms']} | {r['p10_ms']} | {r['p90_ms']} | {r['peak_memory_gb']} |"
              for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="one small case of each kind")
    parser.add_argument("--out", type=Path, help="write the results here as JSON")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_compute: no CUDA device here", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    result = {"machine": machine(device), "rows": []}
    print(json.dumps(result["machine"]), flush=True)
    for case in cases(args.quick):
        try:
            row = measure(case, device, args.warmup, args.iterations)
        except Exception as exc:  # one case's failure (memory, say) must not lose the others
            row = {**{k: v for k, v in case.items() if k != "shape"},
                   "error": f"{type(exc).__name__}: {exc}"[:300]}
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
    good = [r for r in result["rows"] if "error" not in r]
    print(table(good))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0 if len(good) == len(result["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
