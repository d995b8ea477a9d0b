#!/usr/bin/env bash
# A multi-turn environment from an SFT warm start on its demonstration episodes, then GRPO
# (Dr. GRPO for twenty_questions), with the settings measured in docs/recipes.md ("Multi-turn
# environments"): the tiny model on the CPU, or SIZE=qwen2-100m DEVICE=cuda on one GPU.
#
#   ENV=guess_number|twenty_questions|calculator_tool|code_repair   (default guess_number)
#
# Other settings: common.sh. EVAL_BATCHES x EVAL_BATCH_SIZE default to the environment's
# held-out set of the recipe (they fix the prompt width, so SFT and RL must share them).
ENV=${ENV:-guess_number}
case "$ENV" in
  guess_number) EB=2; ES=32 ;;
  twenty_questions) EB=1; ES=49 ;;
  calculator_tool) EB=2; ES=32 ;;
  code_repair) EB=2; ES=20 ;;
  *) echo "unknown ENV=$ENV: use guess_number, twenty_questions, calculator_tool or code_repair" >&2
     exit 2 ;;
esac
EVAL_BATCHES=${EVAL_BATCHES:-$EB}
EVAL_BATCH_SIZE=${EVAL_BATCH_SIZE:-$ES}
source "$(dirname "$0")/common.sh"
METHOD=grpo
case "$ENV" in
  guess_number)
    TASK=(--task guess_number --guess_high "$(by_size 20 100)" --max_turns "$(by_size 6 7)"
          --max_turn_tokens 4 --max_episode_tokens "$(by_size 48 96)")
    SFT=$(by_size 200 60); RL=$(by_size 100 60); BATCH=128; RL_LR_=$(by_size 3e-4 1e-6)
    EVAL_EVERY=$(by_size 25 15) ;;
  twenty_questions)
    TASK=(--task twenty_questions --twenty_questions_turn_penalty 0.1 --max_turns 10
          --max_turn_tokens 32 --max_episode_tokens 232)
    METHOD=dr_grpo; SFT=$(by_size 1000 100); RL=40; BATCH=64; RL_LR_=$(by_size 1e-4 1e-6)
    EVAL_EVERY=$(by_size 20 10) ;;
  calculator_tool)
    # the tiny model learns one-digit operands only; the 104M model learns 2..99
    TASK=(--task calculator_tool --calculator_difficulty 1
          --calculator_max_operand "$(by_size 9 99)" --max_turns 3 --max_turn_tokens 16
          --max_episode_tokens 48)
    SFT=$(by_size 1000 200); RL=$(by_size 100 60); BATCH=128; RL_LR_=$(by_size 3e-4 1e-6)
    EVAL_EVERY=$(by_size 25 15) ;;
  code_repair)
    TASK=(--task code_repair --code_repair_max_reference_chars 50
          --code_repair_feedback_chars 80 --max_turns 2 --max_turn_tokens 64
          --max_episode_tokens 320)
    command -v bwrap >/dev/null || TASK+=(--code_repair_unsafe_sandbox)
    SFT=$(by_size 200 60); RL=$(by_size 120 40); BATCH=64; RL_LR_=$(by_size 3e-4 3e-6)
    EVAL_EVERY=$(by_size 40 10) ;;
esac
SFT_STEPS=${SFT_STEPS:-$SFT}
SFT_LR=${SFT_LR:-$(by_size 3e-3 1e-4)}
RL_STEPS=${RL_STEPS:-$RL}
RL_LR=${RL_LR:-$RL_LR_}
# micro-batches of 32 rows bound the 104M learner's memory; they never change the update
MICRO=()
[ "$SIZE" = tiny ] || MICRO=(--micro_batch_size 32)
NAME=${ENV}_${SIZE}_s$SEED
rlscope sft "${TASK[@]}" "${MODEL[@]}" --num_steps "$SFT_STEPS" --batch_size 32 \
    --lr "$SFT_LR" "${COMMON[@]}" --name "sft_$NAME"
rlscope train "${TASK[@]}" "${MODEL[@]}" --method "$METHOD" --init "$RUNS/sft_$NAME" \
    --num_steps "$RL_STEPS" --batch_size "$BATCH" "${MICRO[@]}" --lr "$RL_LR" \
    --eval_every "$EVAL_EVERY" "${COMMON[@]}" --name "${METHOD}_$NAME"
