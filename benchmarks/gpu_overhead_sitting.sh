#!/usr/bin/env bash
# Issue 44's next GPU sitting in one device call (~7 minutes): the harness against the plain
# DDP loop on the GPU, beside hetbench as it was before the CPU-side trims of 2026-11-27 (event
# lines written in batches; the bucket path's gradients as views of the averaged bucket), in
# settled runs of rotating order. The setting: ResNet-18 (CIFAR form, synthetic
# images) at batch 128, 2 ranks sharing the GPU over gloo, impl = ddp, no slowdown, no pacing;
# 300 iterations a run (150 left ~5 s of measured training in a ~22 s run).
#
# Prepare on the CPU machine (the device's copy of the tree has no .git):
#     .venv/bin/python benchmarks/overhead_variants.py --out .exp before=8cfc78a
# then one device call:
#     run(command="bash benchmarks/gpu_overhead_sitting.sh", carry=[".exp", ".whl"],
#         timeout_s=480)
# Its check here, on the CPU with the small model (a minute):
#     DEVICE=cpu MODEL=mlp ITERATIONS=200 BUDGET=60 OUT=/tmp/sitting \
#         PYTHON=.venv/bin/python bash benchmarks/gpu_overhead_sitting.sh
set -u
OUT=${OUT:?OUT: where the results go}
PYTHON=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
MODEL=${MODEL:-resnet18}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then  # grpcio/protobuf for Prague's generator; optional here
    "$PYTHON" -m pip install -q --no-index --target /tmp/site .whl/*.whl 2>&1 | tail -2
fi
export PYTHONPATH=$PWD:/tmp/site
{ command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version --format=csv
  "$PYTHON" -c "import torch; print(torch.__version__, torch.version.cuda)"
  nproc; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
if [ ! -d .exp/before/hetbench ]; then
    echo "no .exp/before: run benchmarks/overhead_variants.py --out .exp before=8cfc78a first" >&2
    exit 2
fi
case "$MODEL" in
    resnet18) SHAPE="--batch 128 --workers 2" ;;
    *) SHAPE="--batch 32 --workers 2" ;;
esac
"$PYTHON" benchmarks/harness_overhead.py --device "$DEVICE" --model "$MODEL" --impl ddp $SHAPE \
    --iterations "${ITERATIONS:-300}" --pairs 12 --settle-s 2 --also before=.exp/before \
    --budget-s "${BUDGET:-400}" --out "$OUT" --name overhead-trims
