source .devbundle/setup.sh && set +u
export PYTHONUNBUFFERED=1
W=/tmp/w; mkdir -p $W
(timeout 150 python -m pytest -q -m gpu tests/kernels/test_bsr.py 2>&1 | tail -3)
timeout 60 python scripts/export_oneshot.py --out runs/oneshot > $W/export.log 2>&1; echo "export rc=$?"
for i in 1 2; do
timeout 90 python -m compress.cli evaluate --config recipes/minilm-sst2-dense.yaml --models runs/oneshot/{dense,w8a8,w4a16,sparse50,sparse50-w8a8} --names dense w8a8 w4a16 sparse50 sparse50-w8a8 --compress.max_eval_batches=1 --compress.fuse_siblings=true --compress.output_dir=$W/mini$i > $W/mini$i.log 2>&1
echo "== minilm rc=$?"; grep -E "^\| (dense|w8a8|w4a16|sparse)" $W/mini$i/report.md | cut -d'|' -f2,8,10,12
done
cp $W/mini1/report.md $OUT/mini-report.md; cp $W/mini1/report.json $OUT/mini-report.json
timeout 150 python scripts/bench_kernels.py --kernels 'cublas_fp16,ours_dds_*,torch_bsr_*' --shapes 1024x1024 --no-progress --out $OUT/kernels-dds-1024.json --markdown $W/k.md > $W/k.log 2>&1; echo "bench rc=$?"; grep -E "^\|" $W/k.md | head -40
