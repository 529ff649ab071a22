#!/usr/bin/env bash
# The verifiable-reward demo on 2 CPU cores, offline: GRPO teaches SmolLM2-135M-Instruct three-term sums.
# GRPO (config/smollm2/grpo_chain_sum_argument.json: accuracy reward, 4 prompts x 8 samples a step, no KL) trains
# on reasoning-gym chain sums of two or three one-digit terms; alignment-eval measures the starting model and the
# checkpoints on the held-out chain_sum task (200 three-term sums at another seed): greedy pass@1 on every item,
# pass@1 and pass@8 from 8 samples on the first 100, and the related basic_arithmetic task (two-digit terms,
# transfer) at the start and the end. examples/reasoning_demo/report.py writes the curves and the gains with
# their paired 95% CIs to benchmarks/results/grpo_reasoning_<time>.json and .png.
#   bash examples/reasoning_demo.sh [SEED ...]     (default: seeds 42 and 43)
set -euo pipefail
cd "$(dirname "$0")/.."
. examples/smollm2_checkpoint.sh
steps=80  # max_steps and save_steps 20 of the config
evaluate() {  # evaluate <model> <evals dir> <full: 1 at the start and end>
    python tools/evaluate.py --model "$1" --task chain_sum --output-dir "$2/greedy"
    if [ "$3" = 1 ]; then
        python tools/evaluate.py --model "$1" --task basic_arithmetic --output-dir "$2/greedy"
        python tools/evaluate.py --model "$1" --task chain_sum --n 8 --limit 100 --output-dir "$2/n8"
    fi
}
runs=()
for seed in "${@:-42 43}"; do
    for s in $seed; do
        out=outputs/smollm2-grpo-chain-sum-s$s
        python alignment/ppo/run_ppo.py config/smollm2/grpo_chain_sum_argument.json --seed "$s" \
            --output_dir "$out" --overwrite_output_dir true
        evaluate checkpoints/smollm2-135m-instruct "$out/evals/step-0" 1
        for step in $(seq 20 20 $((steps - 20))); do
            evaluate "$out/checkpoint-$step" "$out/evals/step-$step" 0
        done
        evaluate "$out/policy" "$out/evals/step-$steps" 1
        runs+=(--run "$out")
    done
done
python examples/reasoning_demo/report.py "${runs[@]}"
