#!/usr/bin/env bash
# Issue 54's sitting in one device call (~8 minutes): five parts, each with its own budget, its
# results written as it goes, so a call cut off keeps what the finished parts measured.
#  1. the harness against the plain DDP loop and against the code before the CPU trims
#     (benchmarks/gpu_overhead_sitting.sh's setting: ResNet-18 b128, 2 ranks sharing the GPU,
#     impl = ddp, settled, rotating order);
#  2. the new CUDA tests (micro-batches wait only when their time is needed; dropcompute and
#     batch-balance on CUDA equal their CPU runs): tests/distributed/test_gpu.py -k ...
#  3. an algorithm's own micro-batches against the one-batch path (gpu_micro_batches.py);
#  4. where Hop's step goes beside D-PSGD's (hop_split.py, the probe in benchmarks/p2p_probe).
# Prepare here: .venv/bin/python benchmarks/overhead_variants.py --out .exp before=8cfc78a
# Device call: run(command="bash benchmarks/gpu_sitting_54.sh", carry=[".exp"], timeout_s=560)
# CPU check: DEVICE=cpu QUICK=1 OUT=/tmp/s54 PYTHON=.venv/bin/python bash benchmarks/gpu_sitting_54.sh
set -u
OUT=${OUT:?OUT: where the results go}
PYTHON=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
WORK=/tmp/sitting54
rm -rf "$WORK"; mkdir -p "$WORK" "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
{ command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version --format=csv
  "$PYTHON" -c "import torch; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version())"
  nproc; date -u; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
if [ -n "${QUICK:-}" ]; then
    QUICK_OVERHEAD="--model mlp --batch 32 --iterations 100"; QUICK_FLAG="--quick --iterations 40"
    QUICK_HOP="--quick --iterations 12"
else
    QUICK_OVERHEAD="--model resnet18 --batch 128 --iterations 300"; QUICK_FLAG=""; QUICK_HOP=""
fi
bundle() {  # every part's small files in one archive (no model files), after each part
    tar -czf "$OUT/raw.tgz" -C "$WORK" --exclude='*.npy' --exclude='*.pt' \
        --exclude='profile.*' . 2>/dev/null
}
echo "== 1. harness overhead against the plain loop and before the trims"
timeout 260 "$PYTHON" benchmarks/harness_overhead.py --device "$DEVICE" $QUICK_OVERHEAD \
    --impl ddp --workers 2 --pairs 12 --settle-s 2 --also before=.exp/before \
    --budget-s "${OVERHEAD_BUDGET:-200}" --out "$WORK/overhead" --name overhead-trims \
    2>&1 | tail -30
cp "$WORK"/overhead/*.json "$OUT"/ 2>/dev/null; bundle
echo "== 2. CUDA tests"
if [ "$DEVICE" = cuda ]; then
    timeout 120 "$PYTHON" -m pytest -q -p no:cacheprovider tests/distributed/test_gpu.py \
        -k "micro_batches or dropcompute or batch" 2>&1 | tail -15 | tee "$OUT/tests.txt"
fi
echo "== 3. micro-batches against the one-batch path"
timeout 150 "$PYTHON" benchmarks/gpu_micro_batches.py --device "$DEVICE" --out "$WORK/micro" \
    --rounds 3 --budget-s "${MICRO_BUDGET:-90}" $QUICK_FLAG 2>&1 | tail -15
cp "$WORK/micro/micro_batches.json" "$OUT"/ 2>/dev/null; bundle
echo "== 4. Hop's step beside D-PSGD's"
timeout 130 "$PYTHON" benchmarks/hop_split.py --device "$DEVICE" --out "$WORK/hop" $QUICK_HOP \
    2>&1 | grep -v "^$" | tail -12
cp "$WORK/hop/hop_split.json" "$OUT"/ 2>/dev/null; bundle
echo "== 5. one profiled hetbench run of part 1's setting (iterations 100..129; not a timing)"
if [ -z "${QUICK:-}" ]; then
    cat > "$WORK/profiled.toml" <<TOML
name = "profiled"
algorithms = ["allreduce"]
workloads = ["resnet18"]
workers = [2]
slowdown = ["none"]
seeds = [1]
iterations = 140
device = "$DEVICE"
[algorithm.allreduce]
impl = "ddp"
[workload.resnet18]
batch_size = 128
synthetic = true
TOML
    HETBENCH_PROFILE=100:30 timeout 80 "$PYTHON" -m hetbench run "$WORK/profiled.toml" \
        --out "$WORK/profiled" 2>&1 | tail -3
    cp "$WORK"/profiled/*/profile.rank0.txt "$OUT"/ 2>/dev/null
fi
ls -la "$OUT"
