#!/usr/bin/env bash
# SFT -> reward model -> PPO -> GRPO, plus DPO from the same SFT model, on the tiny LLaMA built from config
# (no downloads; about 1 minute on 2 CPU cores).
set -euo pipefail
# --overwrite_output_dir true: a rerun replaces the previous run's outputs (runs refuse that by default)
cd "$(dirname "$0")/.."
python tools/make_tiny.py
python alignment/sft/run_sft.py config/tiny/sft_argument.json --overwrite_output_dir true
python alignment/rm/run_reward.py config/tiny/rm_argument.json --overwrite_output_dir true
python alignment/ppo/run_ppo.py config/tiny/ppo_argument.json --overwrite_output_dir true
python alignment/ppo/run_ppo.py config/tiny/grpo_argument.json --overwrite_output_dir true
python alignment/dpo/run_dpo.py config/tiny/dpo_argument.json --overwrite_output_dir true
