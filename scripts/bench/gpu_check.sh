#!/usr/bin/env bash
# Everything the GPU path needs checked and measured, in one run on one H100 or H200 (minutes):
#
#   OUT=runs/gpu TOKENIZER=path/to/32k.model bash scripts/bench/gpu_check.sh [step ...]
#
# Together the steps outlast one 10-minute call of a lent machine: run `exact ring` and
# `tiles train` as two calls. TOKENIZER (optional) is a sentencepiece model of 32,000 pieces made
# beforehand on a CPU, so that the GPU's minutes are not spent training one.
#
# Steps (default: all, in this order), each under its own time limit, its log in $OUT/STEP.log:
#   exact  tests/parallel/test_pallas_gpu.py: pallas_gpu compiled by Triton against float64
#   ring   scripts/bench/simulated_ring.py: share of ideal per layout (N = 8, S = 65,536) and the
#          kernel against cuDNN on one causal block pair
#   tiles  scripts/bench/gpu_tiles.py: the leading tiles and Triton launch parameters per
#          head_dim, each with the fully visible tiles in their own unmasked loop and without
#   train  train.py, configs/gpu/llama_1b.py on the one GPU at 32,768 tokens: tokens/s and MFU from
#          the progress lines (the run is aborted at its limit: no checkpoint is written)
# A missing ml_collections is installed from wheels in $WHEELS (train.py's config flags need it;
# the GPU image has everything else): pip download --no-deps --only-binary=:all: \
#   --python-version 3.12 -d $WHEELS ml_collections
set -u
OUT=${OUT:-runs/gpu}
WHEELS=${WHEELS:-.gpu/whl}
TOKENIZER=${TOKENIZER:-}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# The repository's packages, as `pip install -e .` gives them where the project is installed.
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PY:-python3}

if ! $PY -c "import ml_collections" 2>/dev/null && ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --target /tmp/site "$WHEELS"/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

run() {  # run NAME LIMIT_S COMMAND...: the step's log, its exit code and time, its last lines
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  echo "== $name: $*"
  # SIGABRT at the limit: Python's faulthandler prints where every thread was, then it dies.
  timeout -s ABRT -k 10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc after $((SECONDS - start)) s (limit $limit s)"
  grep -v -E "^(W|I)[0-9]{4}|cuda_|TfrtGpu|Logging before" "$OUT/$name.log" | tail -n "${TAIL:-25}"
}

exact() {
  JAX_PLATFORMS=cuda,cpu run exact 360 $PY -m pytest -q -p no:cacheprovider --maxfail=4 \
    tests/parallel/test_pallas_gpu.py
}
ring() {
  run ring 120 $PY scripts/bench/simulated_ring.py --reps 3 --json "$OUT/ring.json"
}
tiles() {
  run tiles 90 $PY scripts/bench/gpu_tiles.py --reps 3 --tiles 64x64 128x64 128x128 \
    --launches 4x2 8x2 --split on off --json "$OUT/tiles.json"
}
train() {
  local tok=()
  [ -n "$TOKENIZER" ] && tok=(--config.data.tokenizer_path="$TOKENIZER")
  rm -rf /tmp/gpu_train
  TAIL=30 run train 240 $PY -X faulthandler train.py --config configs/gpu/llama_1b.py \
    --workdir /tmp/gpu_train \
    --config.seq_len=32768 --config.global_batch_size=1 --config.mesh.seq=1 \
    --config.model.tile_q=64 --config.model.tile_k=64 --config.tracker=jsonl \
    --config.num_train_steps=1000 --config.log_every_steps=5 --config.eval_every_steps=100000 \
    --config.checkpoint_every_steps=100000 --config.data.max_bytes=4000000 "${tok[@]}"
  cp /tmp/gpu_train/metrics.jsonl "$OUT/train_metrics.jsonl" 2>/dev/null
}

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
$PY -c "import jax; print('jax', jax.__version__, jax.devices())"
for step in "${@:-exact ring tiles train}"; do
  for s in $step; do $s; done
done
