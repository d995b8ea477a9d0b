#!/usr/bin/env bash
# PPO with a value head on length_target, adaptive KL (target 3 nats per answer), from an SFT
# warm start that writes long answers: a learning rate too high (LR_HIGH) against a stable one
# (LR_LOW), and the doctor on both (docs/recipes.md, docs/doctor.md). Settings: common.sh.
source "$(dirname "$0")/common.sh"
SFT_STEPS=${SFT_STEPS:-$(by_size 600 500)}
SFT_LR=${SFT_LR:-$(by_size 3e-3 1e-4)}
RL_STEPS=${RL_STEPS:-150}
LR_HIGH=${LR_HIGH:-$(by_size 1e-2 1e-3)}
LR_LOW=${LR_LOW:-$(by_size 1e-4 1e-6)}
NAME=length_${SIZE}_s$SEED
rlscope sft --task length_target --length_limit 96 "${MODEL[@]}" --num_steps "$SFT_STEPS" \
    --batch_size 64 --lr "$SFT_LR" --eval_every 0 "${COMMON[@]}" --name "sft_$NAME"
for lr in "$LR_HIGH" "$LR_LOW"; do
  rlscope train --task length_target --length_limit 96 --method ppo "${MODEL[@]}" \
      --init "$RUNS/sft_$NAME" --kl_target_value 3 --num_steps "$RL_STEPS" --batch_size 64 \
      --lr "$lr" --eval_every 50 --doctor_every 0 "${COMMON[@]}" --name "ppo_${NAME}_lr$lr"
  rlscope doctor "$RUNS/ppo_${NAME}_lr$lr" --output markdown \
      --out "$RUNS/ppo_${NAME}_lr$lr/doctor.md"
done
