#!/usr/bin/env bash
# Train SST-2 recipe variants side by side on one GPU, then evaluate them in ONE `compress evaluate`
# run (one report, dense baseline first: OUTDIR/report.{md,json,png}, replacing an earlier sweep's):
#   bash scripts/sst2_variants.sh OUTDIR MAX_TIME "NAME|RECIPE|OVERRIDES[|EDITS]" ...
# Each spec names a variant, its recipe file and extra command-line overrides for that run, e.g.
#   "sparse50-h1|recipes/minilm-sst2-sparse50.yaml|--model.init_args.distillation.hidden_weight=1.0"
# and optionally edits of the recipe copy that overrides cannot make (a callback's settings), as
# space-separated KEY=VALUE for scripts/edit_recipe.py (python -m scripts.edit_recipe), e.g.
#   "sparse50-global|recipes/minilm-sst2-sparse50.yaml||BlockPruning.allocation=global BlockPruning.spread=0.5"
# The variant named "dense" must be the dense recipe (its float model is the report's baseline).
# MAX_TIME is Lightning's trainer.max_time (e.g. 00:00:07:30): a run that is too slow stops there, its
# Export callback still writes the model, and the log says so. Every run writes its models under
# runs/minilm-sst2-NAME (the recipe is copied to OUTDIR/recipes/NAME.yaml with its export dirpath
# rewritten so) and its per-validation metrics to OUTDIR/NAME/metrics.csv; logs go to
# OUTDIR/train-NAME.log. $SWEEP_RUN_ARGS / $SWEEP_EVAL_ARGS: overrides for every run / the evaluation;
# $SWEEP_BASELINE: an already trained dense model dir, evaluated first as "dense" (no dense spec then).
# Run it from the repository root: recipes/, runs/ and `python -m scripts.edit_recipe` are relative to it.
set -u
[ -f scripts/edit_recipe.py ] || { echo "sst2_variants.sh: run it from the repository root" >&2; exit 2; }
out=${1:?usage: sst2_variants.sh OUTDIR MAX_TIME SPEC...}
max_time=${2:?usage: sst2_variants.sh OUTDIR MAX_TIME SPEC...}
shift 2
[ $# -gt 0 ] || { echo "no variants given" >&2; exit 2; }
mkdir -p "$out"
names=(); run_overrides=()
for spec in "$@"; do  # every spec checked and its recipe copy written before any run starts
  IFS='|' read -r name recipe overrides edits <<< "$spec"
  [ -f "$recipe" ] || { echo "variant $name: no recipe file $recipe" >&2; exit 2; }
  names+=("$name"); run_overrides+=("$overrides")
  # a copy of the recipe whose output paths (the Export callback's dirpath) point at this variant's
  # run dir; input paths (a model or teacher to start from) are left as they are
  mkdir -p "$out/recipes"
  sed -E "/dirpath:/ s|runs/minilm-sst2-[A-Za-z0-9_.-]+/|runs/minilm-sst2-$name/|g" "$recipe" > "$out/recipes/$name.yaml"
  if [ -n "${edits:-}" ]; then
    # shellcheck disable=SC2086  # edits are separate words on purpose
    python -m scripts.edit_recipe "$out/recipes/$name.yaml" "$out/recipes/$name.yaml" $edits \
      || { echo "variant $name: bad edits: $edits" >&2; exit 2; }
  fi
done
for i in "${!names[@]}"; do
  name=${names[$i]}
  # shellcheck disable=SC2086  # overrides are separate words on purpose
  python -m compress.cli run --config "$out/recipes/$name.yaml" --compress.evaluate=false --overwrite \
    --compress.output_dir="runs/minilm-sst2-$name" --trainer.enable_progress_bar=false \
    --trainer.max_time="$max_time" --data.init_args.num_workers=2 \
    --trainer.logger=lightning.pytorch.loggers.CSVLogger --trainer.logger.init_args.save_dir="$out/$name" \
    --trainer.logger.init_args.name="" --trainer.logger.init_args.version="" ${run_overrides[$i]} ${SWEEP_RUN_ARGS:-} \
    > "$out/train-$name.log" 2>&1 &
done
wait
models=(); labels=()
if [ -n "${SWEEP_BASELINE:-}" ]; then models+=("$SWEEP_BASELINE"); labels+=(dense); fi
for name in "${names[@]}"; do
  dir="runs/minilm-sst2-$name/compressed"; [ "$name" = dense ] && dir="runs/minilm-sst2-$name/float"
  echo "== $name: $(grep -hE "Error|stopped|snapshot" "$out/train-$name.log" | tail -3 | tr '\n' ' ')"
  [ -d "$dir" ] || continue
  if [ "$name" = dense ]; then  # the report's baseline is its first model
    models=("$dir" "${models[@]}"); labels=("$name" "${labels[@]}")
  else
    models+=("$dir"); labels+=("$name")
  fi
done
python -m compress.cli evaluate --config recipes/minilm-sst2-dense.yaml \
  --models "${models[@]}" --names "${labels[@]}" --compress.output_dir="$out" --overwrite ${SWEEP_EVAL_ARGS:-}
