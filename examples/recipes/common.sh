# Shared settings of the recipes in this folder (sourced, not run). Every value can be set from
# the environment:
#
#   SIZE=tiny          the built-in tiny transformer (CPU, minutes)
#   SIZE=qwen2-100m    a 104M-parameter Qwen2-style model built from a config (random init,
#                      byte vocabulary), bf16 autocast over float32 weights: use a GPU
#   DEVICE=cpu|cuda    RUNS=runs/recipes    SEED=0    THREADS=1 (CPU threads for torch)
#   SFT_STEPS, RL_STEPS, EVAL_BATCHES, EVAL_BATCH_SIZE: shorten a run (the tests do)
set -euo pipefail
SIZE=${SIZE:-tiny}
DEVICE=${DEVICE:-cpu}
RUNS=${RUNS:-runs/recipes}
SEED=${SEED:-0}
THREADS=${THREADS:-1}
EVAL_BATCHES=${EVAL_BATCHES:-5}
EVAL_BATCH_SIZE=${EVAL_BATCH_SIZE:-100}
case "$SIZE" in
  tiny) MODEL=() ;;
  # eager attention: sdpa's fused backward gave NaN gradients on left-padded rows in bf16
  # (docs/recipes.md, RLHF on a GPU)
  qwen2-100m) MODEL=(--arch qwen2 --d_model 768 --n_layers 12 --n_heads 12 --n_kv_heads 4
                     --intermediate_size 3072 --attn_implementation eager --autocast bf16) ;;
  *) echo "unknown SIZE=$SIZE: use tiny or qwen2-100m" >&2; exit 2 ;;
esac
COMMON=(--device "$DEVICE" --threads "$THREADS" --seed "$SEED" --runs_dir "$RUNS"
        --eval_batches "$EVAL_BATCHES" --eval_batch_size "$EVAL_BATCH_SIZE" --no-progress)
# per-size default: pick "$1" for tiny, "$2" for qwen2-100m
by_size() { if [ "$SIZE" = tiny ]; then echo "$1"; else echo "$2"; fi; }
