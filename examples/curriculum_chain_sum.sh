#!/usr/bin/env bash
# The curriculum's measurement (issue 62 item 4) on 2 CPU cores, offline: item 2's GRPO demo
# (config/smollm2/grpo_chain_sum_argument.json) with and without `curriculum: true`, on a pool small enough to
# be drawn several times: 64 of the 400 training prompts (proportion 0.16, the same 64 in both arms at one seed),
# 60 steps of 4 prompts = about four epochs. In one epoch no prompt comes back, so a prompt set aside changes nothing:
# the curriculum acts only where prompts repeat. Each arm's checkpoints (every 15 steps) are evaluated on the
# held-out chain_sum task as the demo is (pass@1 and pass@8 from 8 samples on its first 100 items);
# examples/curriculum_chain_sum/report.py writes pass@1 against training minutes per arm, each gain with its paired
# 95% CI, the minutes each arm needs to reach the plain arm's final gain, and the fraction of zero-variance groups, to
# benchmarks/results/curriculum_chain_sum_<time>.json and .png. Needs examples/reasoning_demo.sh's SFT model.
#   bash examples/curriculum_chain_sum.sh [SEED]      (default 42)
set -euo pipefail
cd "$(dirname "$0")/.."
seed=${1:-42} steps=60 sft=outputs/smollm2-sft-chain-sum
for needed in "$sft/model" "$sft/evals/start/n8"; do
    [ -e "$needed" ] || { echo "error: $needed is missing: run examples/reasoning_demo.sh first" >&2; exit 2; }
done
runs=()
for arm in plain curriculum; do
    out=outputs/smollm2-grpo-chain-sum-pool-$arm-s$seed
    python alignment/ppo/run_ppo.py config/smollm2/grpo_chain_sum_argument.json --seed "$seed" \
        --train_datasets prompt-only:0.16:data/chain_sum/chain_sum_train.jsonl --max_steps $steps --save_steps 15 \
        --curriculum "$([ $arm = curriculum ] && echo true || echo false)" --output_dir "$out" --overwrite_output_dir true
    mkdir -p "$out/evals" && rm -rf "$out/evals/step-0" && cp -r "$sft/evals/start" "$out/evals/step-0"
    for step in $(seq 15 15 $steps); do
        where="$out/checkpoint-$step"; [ "$step" = $steps ] && where="$out/policy"
        rm -rf "$out/evals/step-$step"
        python tools/evaluate.py --model "$where" --task chain_sum --n 8 --limit 100 --output-dir "$out/evals/step-$step/n8"
    done
    runs+=("--$arm" "$out")
done
python examples/curriculum_chain_sum/report.py "${runs[@]}" --record --plot docs/images/curriculum_chain_sum.png
