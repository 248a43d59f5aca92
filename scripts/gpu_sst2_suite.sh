#!/usr/bin/env bash
# Reproduces the committed SST-2 report (docs/results/sst2.md) on one GPU:
#   bash scripts/gpu_sst2_suite.sh [OUTDIR] [extra overrides for every run...]
# 1. trains the five all-MiniLM-L6-v2 SST-2 recipes side by side on the GPU, with no timing during
#    training (--compress.evaluate=false), each exporting its model dir under runs/;
# 2. evaluates the dense baseline and the four compressed models in ONE sequential
#    `compress evaluate` run, so latencies are measured alone on the GPU: report.{md,json,png}.
set -u
out=${1:-runs/sst2-suite}
shift || true
mkdir -p "$out"
variants="dense w8a8-qat w4a16-qat sparse50 sparse50-w8a8"
for v in $variants; do
  python -m compress.cli run --config "recipes/minilm-sst2-$v.yaml" --compress.evaluate=false \
    --trainer.enable_progress_bar=false "$@" > "$out/train-$v.log" 2>&1 &
done
wait
for v in $variants; do echo "== $v"; grep -E "val_acc|Error|error" "$out/train-$v.log" | tail -3; done
models=(runs/minilm-sst2-dense/float)
names=(dense-fp16)
for v in w8a8-qat w4a16-qat sparse50 sparse50-w8a8; do
  models+=("runs/minilm-sst2-$v/compressed"); names+=("$v")
done
python -m compress.cli evaluate --config recipes/minilm-sst2-dense.yaml \
  --models "${models[@]}" --names "${names[@]}" --compress.output_dir="$out" "$@"
