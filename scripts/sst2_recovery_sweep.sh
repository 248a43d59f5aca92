#!/usr/bin/env bash
# Accuracy recovery of 50% block-sparse MiniLM on SST-2: trains, side by side on one GPU, the dense
# baseline, the two sparse recipes as shipped and three variants of them, then evaluates all of
# them in ONE `compress evaluate` run (one report, dense baseline first):
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
cp recipes/minilm-sst2-dense.yaml recipes/minilm-sst2-sparse50.yaml recipes/minilm-sst2-sparse50-w8a8.yaml "$out/recipes/"
late='s/start_step: 1000/start_step: 2105/g; s/end_step: 3500/end_step: 4200/; s/start_step: 3500/start_step: 4200/'
sed -e "$late" -e 's|minilm-sst2-sparse50/|minilm-sst2-sparse50-late/|' recipes/minilm-sst2-sparse50.yaml \
  > "$out/recipes/minilm-sst2-sparse50-late.yaml"
sed -e "$late" -e 's|minilm-sst2-sparse50-w8a8/|minilm-sst2-sparse50-w8a8-late/|' recipes/minilm-sst2-sparse50-w8a8.yaml \
  > "$out/recipes/minilm-sst2-sparse50-w8a8-late.yaml"
sed -e '/^    distillation:/,/^      start_step:/d' -e 's|minilm-sst2-sparse50/|minilm-sst2-sparse50-nokd/|' \
  recipes/minilm-sst2-sparse50.yaml > "$out/recipes/minilm-sst2-sparse50-nokd.yaml"
variants="dense sparse50 sparse50-w8a8 sparse50-late sparse50-w8a8-late sparse50-nokd"
for v in $variants; do
  python -m compress.cli run --config "$out/recipes/minilm-sst2-$v.yaml" --compress.evaluate=false \
    --compress.output_dir="runs/minilm-sst2-$v" --trainer.enable_progress_bar=false \
    --trainer.max_time="$max_time" --data.init_args.num_workers=2 \
    --trainer.logger=lightning.pytorch.loggers.CSVLogger --trainer.logger.init_args.save_dir="$out/$v" \
    --trainer.logger.init_args.name="" --trainer.logger.init_args.version="" ${SWEEP_RUN_ARGS:-} \
    > "$out/train-$v.log" 2>&1 &
done
wait
models=(); names=()
for v in $variants; do
  dir="runs/minilm-sst2-$v/compressed"; [ "$v" = dense ] && dir="runs/minilm-sst2-dense/float"
  echo "== $v: $(grep -hE "Error|stopped|snapshot" "$out/train-$v.log" | tail -3 | tr '\n' ' ')"
  [ -d "$dir" ] && { models+=("$dir"); names+=("$v"); }
done
python -m compress.cli evaluate --config recipes/minilm-sst2-dense.yaml \
  --models "${models[@]}" --names "${names[@]}" --compress.output_dir="$out" ${SWEEP_EVAL_ARGS:-}
