#!/usr/bin/env bash
# SFT -> reward model -> PPO -> GRPO on the tiny LLaMA built from config (no downloads; ~1 minute on 2 CPU cores).
set -euo pipefail
cd "$(dirname "$0")/.."
python tools/make_tiny.py
python alignment/sft/run_sft.py config/tiny/sft_argument.json
python alignment/rm/run_reward.py config/tiny/rm_argument.json
python alignment/ppo/run_ppo.py config/tiny/ppo_argument.json
python alignment/ppo/run_ppo.py config/tiny/grpo_argument.json
