#!/usr/bin/env bash
# Reproduce the fine-tuning / head-disabling results of docs/results (Kovaleva et al. Table 1,
# Fig. 5, 6, 8, 9) for the default model. Every step is idempotent: a finished fine-tuning is
# skipped, an interrupted one resumes at its last epoch, an ablation sweep skips stored
# configurations. Run it again to continue after an interruption.
#   usage: scripts/kovaleva_finetuning.sh [TASK ...]   (default: RTE STS-B SST-2 MRPC)
set -euo pipefail
A=${ATTNSTORE_BIN:-attnstore}
BASE=all-MiniLM-L6-v2
SST2_LIMIT=${SST2_LIMIT:-8000}   # SST-2 train has 67,349 sentences: a seeded sample keeps CPU time near the other tasks'
SEEDS=${SEEDS:-"0 1 2"}          # seeds for the fine-tuned-from-pre-trained cell and the layer sweep
RANDOM_INIT=${RANDOM_INIT:-1}    # 0: skip Table 1's fine-tuned-from-random-init column

# dev runs for Fig. 5/6: the pre-trained and the seed-0 fine-tuned model over the same examples
dev_args() { case "$1" in STS-B) echo "--sample 1000 --seed 0";; *) true;; esac; }
dev_name() { case "$1" in STS-B) echo "$1-dev-s1000";; *) echo "$1-dev";; esac; }

limit() { [ "$1" = SST-2 ] && echo "--train-limit $SST2_LIMIT" || true; }
suffix() { [ "$1" = SST-2 ] && echo "-n$SST2_LIMIT" || true; }

for task in "${@:-RTE STS-B SST-2 MRPC}"; do
  for t in $task; do
    $A evaluate --model $BASE --task $t --no-progress                      # Table 1: no fine-tuning
    for seed in $SEEDS; do
      m=$BASE-$t-pretrained-seed$seed$(suffix $t)
      $A finetune --task $t --seed $seed $(limit $t) --no-progress
      $A evaluate --model $m --task $t --no-progress
      $A ablate --model $m --task $t --heads layers --no-progress          # Fig. 9
      if [ "$seed" = 0 ]; then
        $A ablate --model $m --task $t --heads each --no-progress          # Fig. 8
      fi
    done
    if [ "$RANDOM_INIT" = 1 ]; then
      $A finetune --task $t --init random $(limit $t) --no-progress        # Table 1: random init
      $A evaluate --model $BASE-$t-random-seed0$(suffix $t) --task $t --no-progress
    fi
    $A ingest --dataset glue/$t:dev $(dev_args $t) --name $(dev_name $t) --no-progress
    $A ingest --dataset glue/$t:dev $(dev_args $t) --model $BASE-$t-pretrained-seed0$(suffix $t) \
        --name $(dev_name $t)-finetuned --no-progress
  done
done
