#!/usr/bin/env bash
# Reward over-optimisation in a few minutes on 2 CPU cores (Gao et al. 2022, on the tiny model). The proxy is a
# tiny reward model trained on pairs sampled from another model (SmolLM2, data/judged), the gold the `combined`
# judge. PPO (config/tiny/ppo_argument.json with 5x its learning rate, so that 30 steps travel far from the
# reference) runs with four KL coefficients and tools/plot_overoptimization.py draws proxy and gold against
# sqrt(KL) for each (README, "Reward over-optimisation").
#     bash examples/overoptimization_tiny.sh [output_dir]     (default outputs/overoptimization)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-outputs/overoptimization}
test -d outputs/tiny-sft/model || bash examples/tiny_pipeline.sh
python alignment/rm/run_reward.py config/tiny/rm_argument.json --overwrite_output_dir true --output_dir "$out/rm" \
    --train_datasets PKU-SafeRLHF/train:1.0:data/judged --eval_datasets PKU-SafeRLHF/test:1.0:data/judged \
    --disable_tqdm true
runs=()
for kl in 0.01 0.05 0.3 1.0; do
    python alignment/ppo/run_ppo.py config/tiny/ppo_argument.json --overwrite_output_dir true \
        --reward_model_name_or_path "$out/rm/model" --output_dir "$out/kl$kl" --kl_coeff "$kl" --learning_rate 5e-4 \
        --disable_tqdm true
    runs+=("$out/kl$kl")
done
python tools/plot_overoptimization.py "${runs[@]}" --smooth 5 --output "$out/overoptimization.png" --overwrite
