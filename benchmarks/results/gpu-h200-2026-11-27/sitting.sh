# issue 44, third GPU sitting: where the harness's ~6-8% goes (prepared and tried on the CPU).
set -u
mkdir -p "$OUT"
python3 -m pip install -q --no-index --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD:/tmp/site
{ nvidia-smi --query-gpu=name,driver_version --format=csv
  python3 -c "import torch, torchvision; print(torch.__version__, torch.version.cuda, torchvision.__version__, torch.backends.cudnn.version())"
  nproc; } > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
PART=${PART:-1}
if [ "$PART" = 1 ]; then
  python3 benchmarks/harness_overhead.py --device cuda --model resnet18 --impl ddp --workers 2 \
    --batch 128 --iterations 150 --pairs 8 --settle-s 2 --plain-hook --also cpp=.exp/cpp \
    --budget-s "${BUDGET:-430}" --out "$OUT" --name overhead-hook
else
  python3 benchmarks/harness_overhead.py --device cuda --model resnet18 --impl ddp --workers 2 \
    --batch 128 --iterations 150 --pairs 8 --settle-s 2 ${SIDES:---also noanchor=.exp/noanchor --also lean=.exp/lean} \
    --budget-s "${BUDGET:-250}" --out "$OUT" --name overhead-part2
fi
