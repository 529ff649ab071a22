#!/usr/bin/env bash
# The verifiable-reward demo on 2 CPU cores, offline: GRPO teaches SmolLM2-135M-Instruct three-term sums.
# 1. SFT (config/smollm2/sft_chain_sum_argument.json, 20 steps, under 2 minutes) on worked solutions of chain sums
#    (data/chain_sum/chain_sum_worked.jsonl: "6 - 2 = 4\n4 + 5 = 9\n<answer>9</answer>") teaches the format;
#    the instruct model alone answers with a guess.
# 2. GRPO (config/smollm2/grpo_chain_sum_argument.json: accuracy reward only, 4 prompts x 8 samples a step at
#    temperature 1.0, no KL, learning rate 2e-6, 80 steps) on chain sums of two or three one-digit terms
#    (data/chain_sum/).
# 3. alignment-eval measures the instruct model, the SFT model (GRPO's start) and the checkpoints on the held-out
#    chain_sum task (200 three-term sums at another seed, none of them in a training file): greedy pass@1 on every
#    item and pass@1 and pass@8 from 8 samples on the first 100 at every checkpoint, and the related
#    basic_arithmetic task (two terms of up to two digits: transfer) at the start and the end.
#    examples/reasoning_demo/report.py writes the curves and the gains with their paired 95% CIs to
#    benchmarks/results/grpo_reasoning_<time>.json and .png.
#   bash examples/reasoning_demo.sh [SEED ...]     (default: seeds 42 and 43)
set -euo pipefail
cd "$(dirname "$0")/.."
. examples/smollm2_checkpoint.sh
steps=80  # max_steps and save_steps 20 of the GRPO config
sft=outputs/smollm2-sft-chain-sum
evaluate() {  # evaluate <model> <evals dir> <transfer: 1 at the start and end>
    python tools/evaluate.py --model "$1" --task chain_sum --output-dir "$2/greedy"
    python tools/evaluate.py --model "$1" --task chain_sum --n 8 --limit 100 --output-dir "$2/n8"
    if [ "$3" = 1 ]; then
        python tools/evaluate.py --model "$1" --task basic_arithmetic --output-dir "$2/greedy"
    fi
}
python alignment/sft/run_sft.py config/smollm2/sft_chain_sum_argument.json --overwrite_output_dir true
rm -rf "$sft/evals"
evaluate checkpoints/smollm2-135m-instruct "$sft/evals/instruct" 1
evaluate "$sft/model" "$sft/evals/start" 1
runs=()
for seed in "${@:-42 43}"; do
    for s in $seed; do
        out=outputs/smollm2-grpo-chain-sum-s$s
        python alignment/ppo/run_ppo.py config/smollm2/grpo_chain_sum_argument.json --seed "$s" \
            --output_dir "$out" --overwrite_output_dir true
        mkdir -p "$out/evals" && cp -r "$sft/evals/start" "$out/evals/step-0"
        for step in $(seq 20 20 $((steps - 20))); do
            evaluate "$out/checkpoint-$step" "$out/evals/step-$step" 0
        done
        evaluate "$out/policy" "$out/evals/step-$steps" 1
        runs+=(--run "$out")
    done
done
python examples/reasoning_demo/report.py --before "$sft/evals/instruct" "${runs[@]}"
