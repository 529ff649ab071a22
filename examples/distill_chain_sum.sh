#!/usr/bin/env bash
# On-policy distillation against GRPO and SFT on a teacher's answers, on 2 CPU cores, offline.
# Needs examples/reasoning_demo.sh's outputs: the student is its SFT model (20 steps on worked chain-sum solutions,
# GRPO's start) and the GRPO arm is its seed-42 run (its evaluations and step times). The teacher is the same SFT
# trained longer (config/smollm2/sft_chain_sum_teacher_argument.json, 100 steps; not counted in any arm).
#   distill: the student's own answers, the reverse KL to the teacher over the whole vocabulary at every answer
#            token (config/smollm2/distill_chain_sum_argument.json, 16 prompts a step, 100 steps, learning rate
#            1.5e-5), once per seed given (default 42), each evaluated every 10 steps
#   sft:     the teacher answers the 400 training prompts greedily (alignment-eval), the student is trained on
#            those answers (config/smollm2/sft_chain_sum_teacher_answers_argument.json); both count in its minutes
# Each is evaluated on the held-out chain_sum task (200 three-term sums, greedy) as the GRPO demo is;
# examples/distill_chain_sum/report.py writes held-out pass@1 against training minutes per arm, each gain with its
# paired 95% CI and the minutes each arm needs for 80% of the teacher's gain, to
# benchmarks/results/distill_chain_sum_<time>.json and .png.
#   bash examples/distill_chain_sum.sh [SEED ...]
set -euo pipefail
cd "$(dirname "$0")/.."
sft=outputs/smollm2-sft-chain-sum grpo=outputs/smollm2-grpo-chain-sum-s42 out=outputs/distill-chain-sum
teacher=outputs/smollm2-sft-chain-sum-teacher
for needed in "$sft/model" "$sft/evals/start" "$grpo/evals"; do
    [ -e "$needed" ] || { echo "error: $needed is missing: run examples/reasoning_demo.sh 42 first" >&2; exit 2; }
done
mkdir -p "$out"
greedy() { python tools/evaluate.py --model "$1" --task chain_sum --output-dir "$2/greedy"; }
python alignment/sft/run_sft.py config/smollm2/sft_chain_sum_teacher_argument.json --overwrite_output_dir true
rm -rf "$teacher/evals" && greedy "$teacher/model" "$teacher/evals"

distill_arms=()
for seed in "${@:-42}"; do
    distill=outputs/smollm2-distill-chain-sum-s$seed
    python alignment/ppo/run_distill.py config/smollm2/distill_chain_sum_argument.json --seed "$seed" \
        --output_dir "$distill" --overwrite_output_dir true
    mkdir -p "$distill/evals" && rm -rf "$distill/evals/step-0" && cp -r "$sft/evals/start" "$distill/evals/step-0"
    for step in 10 20 30 40 50 60 70 80 90; do greedy "$distill/checkpoint-$step" "$distill/evals/step-$step"; done
    greedy "$distill/policy" "$distill/evals/step-100"
    distill_arms+=(--distill "on-policy distillation (seed $seed)=$distill")
done

start=$SECONDS
rm -rf "$out/teacher"
python tools/evaluate.py --model "$teacher/model" --dataset prompt-only:1.0:data/chain_sum/chain_sum_train.jsonl \
    --reward-funcs accuracy --max-new-tokens 48 --output-dir "$out/teacher"
python examples/distill_chain_sum/teacher_answers.py --items "$out"/teacher/*/items.jsonl \
    --output "$out/teacher_answers.jsonl"
answered=$SECONDS
python alignment/sft/run_sft.py config/smollm2/sft_chain_sum_teacher_answers_argument.json --overwrite_output_dir true
printf 'teacher_answers\t%s\nsft\t%s\n' $((answered - start)) $((SECONDS - answered)) > "$out/sft_arm_seconds.tsv"
greedy outputs/smollm2-sft-teacher-chain-sum/model "$out/sft-eval"

python examples/distill_chain_sum/report.py "${distill_arms[@]}" --grpo "$grpo" --teacher-eval "$teacher/evals" \
    --sft-eval "$out/sft-eval" --sft-seconds "$out/sft_arm_seconds.tsv"
