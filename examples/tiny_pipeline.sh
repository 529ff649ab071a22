#!/usr/bin/env bash
# SFT -> reward model -> PPO -> GRPO, plus DPO from the same SFT model, on the tiny LLaMA built from config
# (no downloads; about 1 minute on 2 CPU cores).
set -euo pipefail
cd "$(dirname "$0")/.."
python tools/make_tiny.py
python alignment/sft/run_sft.py config/tiny/sft_argument.json
python alignment/rm/run_reward.py config/tiny/rm_argument.json
python alignment/ppo/run_ppo.py config/tiny/ppo_argument.json
python alignment/ppo/run_ppo.py config/tiny/grpo_argument.json
python alignment/dpo/run_dpo.py config/tiny/dpo_argument.json
