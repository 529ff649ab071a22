#!/usr/bin/env bash
# The main demo's PPO-vs-DPO verdict over training seeds (longer than the quickstart: one PPO and one DPO run per
# seed). SFT and the reward model are trained once (as examples/quickstart.sh does, unless outputs/ has them), then
# per seed PPO (config/smollm2/ppo_argument.json) and DPO (config/smollm2/dpo_argument.json) start from the same SFT
# model; alignment-eval scores the SFT model and every policy on the dialogue_gold task (the 40 held-out prompts,
# greedy, the gold judge); examples/main_demo_seeds/report.py writes each arm over its seeds with 95% CIs and
# DPO - PPO to benchmarks/results/main_demo_seeds_<time>.json (pass --record; see its --help).
#   bash examples/main_demo_seeds.sh [SEED ...]     (default: 42 1 2)
set -euo pipefail
cd "$(dirname "$0")/.."
. examples/smollm2_checkpoint.sh
[ -f outputs/smollm2-sft/model/config.json ] \
    || python alignment/sft/run_sft.py config/smollm2/sft_argument.json --overwrite_output_dir true
[ -f outputs/smollm2-rm/model/config.json ] \
    || python alignment/rm/run_reward.py config/smollm2/rm_argument.json --overwrite_output_dir true
evals=outputs/main-demo-seeds
python tools/evaluate.py --model outputs/smollm2-sft/model --task dialogue_gold --output-dir "$evals/sft"
ppo=() dpo=()
for s in ${@:-42 1 2}; do
    python alignment/ppo/run_ppo.py config/smollm2/ppo_argument.json --seed "$s" \
        --output_dir "outputs/smollm2-ppo-s$s" --overwrite_output_dir true
    python tools/evaluate.py --model "outputs/smollm2-ppo-s$s/policy" --task dialogue_gold --output-dir "$evals/ppo-s$s"
    python alignment/dpo/run_dpo.py config/smollm2/dpo_argument.json --seed "$s" \
        --output_dir "outputs/smollm2-dpo-s$s" --overwrite_output_dir true
    python tools/evaluate.py --model "outputs/smollm2-dpo-s$s/model" --task dialogue_gold --output-dir "$evals/dpo-s$s"
    ppo+=("$evals/ppo-s$s/dialogue_gold") dpo+=("$evals/dpo-s$s/dialogue_gold")
done
python examples/main_demo_seeds/report.py --start "$evals/sft/dialogue_gold" --arm PPO "${ppo[@]}" --arm DPO "${dpo[@]}"
