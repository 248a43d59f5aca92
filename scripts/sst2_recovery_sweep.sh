#!/usr/bin/env bash
# Accuracy recovery of 50% block-sparse MiniLM on SST-2: trains, side by side on one GPU, the dense
# baseline, the two sparse recipes as shipped and three variants of them, then evaluates all of
# them in ONE `compress evaluate` run (one report, dense baseline first; scripts/sst2_variants.sh):
#   bash scripts/sst2_recovery_sweep.sh [OUTDIR] [MAX_TIME]
# Variants (written as edited copies of the recipes under OUTDIR/recipes):
#   sparse50-late / sparse50-w8a8-late: dense phase of one epoch (teacher snapshot and pruning start
#     at step 2,105, pruning ends at 4,200; QAT starts at 4,200);
#   sparse50-nokd: the sparse50 schedule without distillation (the control for the distillation).
# MAX_TIME (Lightning's trainer.max_time, default 00:00:07:00) stops a run that is too slow; the
# Export callback still writes its model, and the training log says at which step it stopped.
# $SWEEP_RUN_ARGS / $SWEEP_EVAL_ARGS: extra overrides for every training run / for the evaluation
# (e.g. a CPU smoke test with --trainer.max_steps=3).
# Logs: OUTDIR/train-<variant>.log, per-validation metrics in OUTDIR/<variant>/metrics.csv.
set -u
out=${1:-runs/sst2-recovery}
max_time=${2:-00:00:07:00}
mkdir -p "$out/recipes"
late='s/start_step: 1000/start_step: 2105/g; s/end_step: 3500/end_step: 4200/; s/start_step: 3500/start_step: 4200/'
sed -e "$late" recipes/minilm-sst2-sparse50.yaml > "$out/recipes/minilm-sst2-sparse50-late.yaml"
sed -e "$late" recipes/minilm-sst2-sparse50-w8a8.yaml > "$out/recipes/minilm-sst2-sparse50-w8a8-late.yaml"
# no distillation: drop the "distillation:" mapping (its line and the more deeply indented ones after it)
awk '/^    distillation:/ {skip = 1; next} skip && /^      / {next} {skip = 0; print}' \
  recipes/minilm-sst2-sparse50.yaml > "$out/recipes/minilm-sst2-sparse50-nokd.yaml"
bash scripts/sst2_variants.sh "$out" "$max_time" \
  "dense|recipes/minilm-sst2-dense.yaml|" \
  "sparse50|recipes/minilm-sst2-sparse50.yaml|" \
  "sparse50-w8a8|recipes/minilm-sst2-sparse50-w8a8.yaml|" \
  "sparse50-late|$out/recipes/minilm-sst2-sparse50-late.yaml|" \
  "sparse50-w8a8-late|$out/recipes/minilm-sst2-sparse50-w8a8-late.yaml|" \
  "sparse50-nokd|$out/recipes/minilm-sst2-sparse50-nokd.yaml|"
