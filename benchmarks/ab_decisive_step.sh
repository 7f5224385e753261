#!/usr/bin/env bash
# Paired A/B of the decisive regime's step (2 workers x 1 thread, as the study runs): the old and the new trainer run
# the same 8-step job side by side, one per core; ROUNDS rounds. Usage: ab_decisive.sh OLD_TREE NEW_TREE OUT ROUNDS [ARM]
# NEW_FLAGS="--mixed-precision bf16": more flags for the new side only (an opt-in that changes the numbers: its records
# then differ from the old side's, and only the timings compare).
set -u
read -r -a new_flags <<< "${NEW_FLAGS:-}"
old=$1 new=$2 out=$3 rounds=${4:-2} arm=${5:-grpo_nokl}
extra=(--preset grpo --loss beta=0)
[ "$arm" = grpo_nokl_tr ] && extra+=(--trust-region 0.1)
flags=(--seed 0 --threads 1 --progress false --save-model false --lr 1.5e-4 --difficulty 2,3,5
  --system-prompt "Show your calculation step by step, then write 'The answer is N.'" --max-new-tokens 48
  --max-steps 8 --eval-problems 20 --eval-k 0 --eval-every 0 --use-vllm on --vllm-dtype float32
  --log-mechanism true --kl-every 0 --overwrite "${extra[@]}")
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  for side in old new; do
    tree=${!side}
    ( cd "$tree" && OMP_NUM_THREADS=1 PYTHONPATH="$tree" "${VLLM_PY:-/tmp/sgrpo-ci-venvs/vllm/bin/python}" -m train \
        --output-dir "$out/$arm-$side-r$r" "${flags[@]}" $([ "$side" = new ] && echo "${new_flags[@]}") \
        > "$out/$arm-$side-r$r.log" 2>&1 ) &
  done
  wait
done
