"""The offline preference stage's program, shared by its two entry points: run_dpo.py (the DPO family; kto as a
loss_type) and run_kto.py (KTO, as PaddleNLP's llm/alignment/kto/run_kto.py runs it). Which argument class
(DPOArguments or KTOArguments) they parse is the only difference: the algorithm is the entry point's, never guessed."""
from __future__ import annotations

import os

from alignment.config.data import DataArguments, LoRAArguments, ModelArguments
from alignment.config.training import TrainingArguments
from alignment.dpo import losses  # noqa: F401  registers the loss types the arguments name, before they are parsed
from alignment.training import setup


def build_datasets(dpo_args, data_args, tokenizer, train_raw, eval_raw, seed: int):
    """(train, eval or None, collate) for the loss type: preference pairs, or unpaired rows (kto)."""
    from alignment.data.tokenized import preference_datasets
    from alignment.dpo.data import UnpairedDataset, collate_pairs, collate_unpaired

    pad = tokenizer.pad_token_id
    if not dpo_args.loss.paired:
        make = lambda raw: UnpairedDataset(raw, tokenizer, data_args.max_length, seed)  # noqa: E731
        return make(train_raw), make(eval_raw) if eval_raw is not None else None, lambda i: collate_unpaired(i, pad)
    hint = (f" (loss_type {dpo_args.loss_type!r}; unpaired rows, such as PaddleNLP's KTO rows with one response, "
            "train with alignment/dpo/run_kto.py or loss_type 'kto')")
    train, evaluation = preference_datasets(train_raw, eval_raw, tokenizer, data_args.max_length, hint=hint)
    return train, evaluation, lambda items: collate_pairs(items, pad)


def train(argv, arguments_class) -> dict:
    """Parse the arguments (with `arguments_class`: DPOArguments or KTOArguments), train, save, summarise."""
    model_args, data_args, dpo_args, lora_args, train_args, run = setup.parse_arguments(
        argv, ModelArguments, DataArguments, arguments_class, LoRAArguments, TrainingArguments)

    from alignment.dpo.dpo_trainer import DPOTrainer, summarize

    with setup.started(train_args, run):
        tokenizer, *raw = setup.load_inputs(model_args.tokenizer_path, data_args, train_args.seed, run)
        train_set, eval_set, collate = build_datasets(dpo_args, data_args, tokenizer, *raw, train_args.seed)
        print(setup.datasets_line("rows", train_set, eval_set))
        policy = setup.load_trained_model("causal", model_args.model_name_or_path, run.layout, lora_args,
                                          recompute=train_args.recompute)
        reference = setup.reference_model(policy, lora_args, model_args.model_name_or_path,
                                          dpo_args.ref_model_name_or_path) if dpo_args.needs_reference else None
        trainer = DPOTrainer(dpo_args, train_args, policy, reference, tokenizer, train_set, eval_set, collate,
                             run.effective)
    if dpo_args.precompute_ref_log_probs:
        for dataset in (train_set, eval_set):
            if dataset is not None:
                trainer.precompute_reference(dataset, train_args.per_device_eval_batch_size)
        trainer.reference = None  # every item now carries its reference log-probs
        del reference
    with setup.training_stops(trainer):
        results = trainer.train()
    if setup.benchmark_ended(train_args, dpo_args.loss_type):
        return results
    before, results = results.get("start", {}), results.get("end", {})
    final = os.path.join(train_args.output_dir, "model")
    print(f"\n{dpo_args.loss_type} done")
    summary = summarize(before, results)
    if summary:
        print(summary)
    print(f"  policy: {final} (HF layout); judge it with: python tools/judge_policy.py --model {final}")
    setup.end_processes(train_args)  # prints the wall time; a multi-process run exits here
    return {**results, **{f"start_{k}": v for k, v in before.items()}}
