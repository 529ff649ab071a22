"""The policy-optimisation stage's program, shared by its two entry points: run_ppo.py (PPO, GRPO, ...; a teacher
optional) and run_distill.py (on-policy distillation / GKD: a teacher required, no reward needed). Which argument
class the PPO arguments parse with (their defaults) and whether a teacher is required are the only differences.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os

from alignment.config.asynchronous import AsyncArguments
from alignment.config.data import LoRAArguments
from alignment.config.distill import DistillArguments
from alignment.config.environment import EnvironmentArguments
from alignment.config.evaluation import EvaluationArguments
from alignment.config.monitors import MonitorArguments
from alignment.config.ppo import PPOArguments, PPODataArguments, PPOModelArguments
from alignment.config.training import TrainingArguments
from alignment.parallel.layout import Layout
from alignment.training import setup


def build_models(model_args, ppo_args, lora_args, train_args, layout: Layout = Layout()):
    """(actor, reference, critic or None, reward model or None, reward tokenizer or None) for `layout` (default:
    one process). With LoRA on the actor the reference is the actor itself (its base weights, adapters off). With
    pipeline stages, actor and critic are pipeline models (alignment/wrappers/pipeline.py); the frozen reference
    and reward models stay whole (or tensor-parallel)."""
    from alignment.models import Tokenizer
    from alignment.ppo.learner.pipeline_update import PolicyPipeLoss, ValuePipeLoss
    from alignment.rewards.process import is_process_reward_model

    path = model_args.actor_model_name_or_path
    actor = setup.load_trained_model("causal", path, layout, lora_args, PolicyPipeLoss(ppo_args),
                                     recompute=train_args.recompute)
    reference = setup.reference_model(actor, lora_args, path)
    reward_model = reward_tokenizer = critic = None
    if model_args.reward_model_name_or_path:  # a score model, or a process reward model (a causal LM)
        process = is_process_reward_model(model_args.reward_model_name_or_path)
        reward_model = setup.load_frozen_model("causal" if process else "score", model_args.reward_model_name_or_path)
        reward_tokenizer = Tokenizer.from_pretrained(model_args.reward_model_name_or_path)
    if ppo_args.uses_critic:
        critic_path = model_args.reward_critic_model_name_or_path or model_args.reward_model_name_or_path or path
        critic_lora = dataclasses.replace(lora_args, lora=ppo_args.critic_lora, lora_path=ppo_args.critic_lora_path)
        critic = setup.load_trained_model("score", critic_path, layout, critic_lora, ValuePipeLoss(ppo_args),
                                          trainable=("score.",), score_type="critic", do_normalize=False,
                                          recompute=ppo_args.critic_recompute)
    return actor, reference, critic, reward_model, reward_tokenizer


def build_teacher(distill_args, ppo_args, train_args, tokenizer):
    """teacher.py's strategy: NoTeacher; a served teacher (its server answers /models first); or a local model,
    which must have the student's tokenizer (its log-probs are of the student's tokens)."""
    from alignment.models import Tokenizer
    from alignment.ppo.teacher.teacher import make_teacher
    from alignment.rewards.openai_client import OpenAIEndpoint
    from alignment.rewards.scoring import same_tokenizer

    if not distill_args.distills:
        return make_teacher(None, ppo_args, train_args)
    path = distill_args.teacher_model_name_or_path
    if distill_args.served:
        endpoint = OpenAIEndpoint(distill_args.teacher_urls, "teacher server", (
            "teacher_model_name_or_path", "teacher_server_retries", "teacher_server_timeout"), "TEACHER_SERVER_TOKEN",
            distill_args.teacher_served_model, distill_args.teacher_server_token,
            distill_args.teacher_server_timeout, distill_args.teacher_server_retries)
        print(f"teacher server {', '.join(endpoint.urls)}: model {endpoint.served_model()}")
        return make_teacher(distill_args, ppo_args, train_args, endpoint=endpoint)
    if not same_tokenizer(Tokenizer.from_pretrained(path), tokenizer):
        raise ValueError(f"key 'teacher_model_name_or_path': {path} has another tokenizer than the student's; the "
                         "teacher scores the student's tokens, so the two must share one")
    return make_teacher(distill_args, ppo_args, train_args, model=setup.load_frozen_model("causal", path))


def build_draft(ppo_args, actor, tokenizer):
    """The draft model rollouts speculate with (ppo/rollout/drafts.py): speculative_draft_model's checkpoint, which
    must have the policy's vocabulary (loaded frozen), or the policy with layers dropped (speculative_draft_keep_every,
    following its weights); None when neither key is set."""
    key = ppo_args.draft_key
    if not key:
        return None
    from alignment.models import LlamaForCausalLM, Tokenizer
    from alignment.models.moe import moe_blocks
    from alignment.ppo.rollout.drafts import DroppedLayersDraft, FrozenDraft
    from alignment.rewards.scoring import same_vocabulary

    if not isinstance(actor, LlamaForCausalLM) or actor.config.tensor_parallel_degree > 1 or moe_blocks(actor):
        raise ValueError(f"key '{key}': a draft model needs a whole dense policy on each rank (not pipeline or "
                         "tensor-parallel layouts nor an MoE policy, whose decode steps do not verify drafts)")
    if key == "speculative_draft_keep_every":
        return DroppedLayersDraft(actor, ppo_args.speculative_draft_keep_every)
    path = ppo_args.speculative_draft_model
    if not os.path.isdir(path):
        raise ValueError(f"key 'speculative_draft_model': {path} is not a checkpoint directory")
    if not same_vocabulary(Tokenizer.from_pretrained(path), tokenizer):
        raise ValueError(f"key 'speculative_draft_model': {path} has another vocabulary than the policy's; its "
                         "draft tokens are the policy's ids, so the two must share one tokenizer")
    model = setup.load_frozen_model("causal", path)
    if model.config.vocab_size != actor.config.vocab_size:
        raise ValueError(f"key 'speculative_draft_model': {path} has a vocabulary of {model.config.vocab_size} "
                         f"tokens, the policy's has {actor.config.vocab_size}")
    return FrozenDraft(model)


def stream_steps(ppo_args, train_args, layout, prompt_count: int) -> int:
    """The run's steps: batches of per_device_prompt_batch_size prompts per training data rank."""
    from alignment.training.batches import planned_steps

    return planned_steps(train_args.max_steps, train_args.num_train_epochs, prompt_count,
                         ppo_args.per_device_prompt_batch_size * layout.data, train_args.dataloader_drop_last)


def async_schedule(ppo_args, data_args, async_args, train_args, layout, prompt_count: int):
    """The asynchronous run's schedule (asynchronous.VersionSchedule), the same for training and rollout ranks."""
    from alignment.ppo.asynchronous.asynchronous import VersionSchedule

    return VersionSchedule(async_args.max_staleness, stream_steps(ppo_args, train_args, layout, prompt_count),
                    async_args.partial_rollout_tokens, ppo_args.max_new_tokens or data_args.max_length,
                    async_args.batches_per_step(ppo_args))


def serve_rollouts(model_args, data_args, ppo_args, env_args, async_args, lora_args, train_args, run, tokenizer,
                   prompts, mailbox) -> dict:
    """A rollout rank of an asynchronous run (ppo/asynchronous/asynchronous.py): only the actor, sampling the prompt
    stream."""
    from alignment.data.tokenized import collate_prompts
    from alignment.launcher import rank
    from alignment.ppo.learner.pipeline_update import PolicyPipeLoss
    from alignment.ppo.asynchronous.rollout_worker import WorkerPlan, run_rollout_worker
    from alignment.ppo.rollout.agent_programs import make_sampler
    from alignment.ppo.learner.routing_replay import routing_for
    from alignment.ppo.rollout.samplers import rollout_generation_config

    actor = setup.load_trained_model("causal", model_args.actor_model_name_or_path, run.layout, lora_args,
                                     PolicyPipeLoss(ppo_args))
    layout = run.layout
    plan = WorkerPlan(prompts, ppo_args.per_device_prompt_batch_size * layout.data, ppo_args.num_return_sequences,
                      train_args.seed, train_args.dataloader_drop_last, layout.data, ppo_args.temperature,
                      train_args.output_dir, async_schedule(ppo_args, data_args, async_args, train_args, layout,
                                                             len(prompts)))
    sampler = make_sampler(ppo_args, data_args.max_length, lambda items: collate_prompts(items, tokenizer.pad_token_id),
                           env_args, routing_for(ppo_args.moe_routing_replay, actor).records,  # MoE: the experts
                           build_draft(ppo_args, actor, tokenizer))
    posted = run_rollout_worker(plan, actor, tokenizer, sampler, rollout_generation_config(ppo_args, actor, tokenizer),
                                mailbox, layout)
    print(f"rollout rank {rank()}: {posted} prompt batches sampled")
    setup.end_processes()
    return {}


def argument_classes(ppo_class=PPOArguments) -> tuple:
    """The stage's argument classes, in the order parse_arguments returns their instances."""
    return (PPOModelArguments, PPODataArguments, ppo_class, DistillArguments, EnvironmentArguments, AsyncArguments,
            LoRAArguments, EvaluationArguments, MonitorArguments, TrainingArguments)


def train(argv, ppo_class=PPOArguments) -> dict:
    """Parse the arguments (PPO's under `ppo_class`: PPOArguments, or the distillation entry point's
    DistillPPOArguments, which also require a teacher), then load, build, run: train, save, summarise."""
    parsed = setup.parse_arguments(argv, *argument_classes(ppo_class))
    if parsed[-1].layout.expert > 1 and parsed[5].asynchronous:  # the training ranks' forwards are collectives
        setup.fail("key 'expert_parallel_degree' with rollout_ranks > 0: rollout ranks are not part of the "
                   "expert-parallel groups (not built); set one of them to 0 / 1")
    if parsed[6].lora_adapters:  # LoRAArguments: several adapters on one base (ppo/multi_adapter.py)
        from alignment.ppo.multi_adapter import train_adapters

        return train_adapters(parsed, build_trainer, training_errors)
    trainer, mailbox = build_trainer(parsed)
    if trainer is None:  # a rollout rank: it served the run's rollouts
        return mailbox
    return run_training(trainer, mailbox, parsed)


@dataclasses.dataclass
class StageInputs:
    """What the stage loads before any model: the tokenizer, the prompt datasets, the evaluation tasks and an
    asynchronous run's mailbox (None: synchronous)."""
    tokenizer: object
    prompts: object  # PromptOnlyDataset
    eval_prompts: object  # PromptOnlyDataset or None
    ptx: object  # SupervisedDataset or None
    eval_tasks: object  # evaluation/inline.py's HeldOutTasks
    mailbox: object


def check_user_code(ppo_args, env_args, run) -> None:
    """Import what the arguments name of the user's code (reward functions, the gold judge, environments, an agent
    program), so a typo fails before any model is loaded."""
    from alignment.envs import load_environment_modules
    from alignment.ppo.rollout.episodes import build_environments
    from alignment.rewards.functions import load_reward_function

    for spec in ppo_args.reward_funcs + ([ppo_args.gold_judge] if ppo_args.gold_judge else []):
        load_reward_function(spec)
    if env_args.multi_turn:  # an environment that is not registered or refuses its arguments
        load_environment_modules(env_args.user_env_modules, base_dir=run.argument_dir)
        if env_args.agent is not None:  # or an agent program that does not import
            from alignment.ppo.rollout.agent_programs import load_agent

            load_agent(env_args.agent)
        else:
            build_environments(env_args, 1)


def load_stage_inputs(parsed) -> StageInputs:
    """Check the user's code and the evaluation tasks, then load the tokenizer and the datasets and open an
    asynchronous run's mailbox."""
    model_args, data_args, ppo_args, _, env_args, async_args, _, eval_args, _, train_args, run = parsed

    from alignment.data import MixedRawDataset
    from alignment.data.tokenized import PromptOnlyDataset, SupervisedDataset
    from alignment.evaluation.inline import HeldOutTasks
    from alignment.ppo.asynchronous.asynchronous import open_mailbox

    check_user_code(ppo_args, env_args, run)
    eval_tasks = HeldOutTasks.from_args(eval_args, train_args.seed, run.argument_dir)  # a typo fails here too
    if eval_tasks and train_args.pipeline_parallel_degree > 1:
        raise ValueError("key 'eval_tasks' needs the whole policy on each rank to decode; with "
                         "pipeline_parallel_degree > 1 evaluate the saved checkpoints with alignment-eval")
    tokenizer, train_raw, eval_raw = setup.load_inputs(model_args.actor_model_name_or_path, data_args,
                                                       train_args.seed, run)
    prompts = PromptOnlyDataset(train_raw, tokenizer, data_args.max_length, too_long="error")
    eval_prompts = PromptOnlyDataset(eval_raw, tokenizer, data_args.max_length, too_long="error") \
        if eval_raw is not None else None
    ptx = None
    if data_args.ptx_datasets:
        ptx = SupervisedDataset(MixedRawDataset(data_args.ptx_datasets, seed=train_args.seed), tokenizer,
                                data_args.max_length)
    print(f"prompts: {len(prompts)} train {prompts.stats}" +
          (f", {len(eval_prompts)} eval" if eval_prompts is not None else "") +
          (f"; ptx: {len(ptx)} samples" if ptx is not None else ""))
    mailbox = open_mailbox(run.layout, async_args.max_staleness, async_args.batches_per_step(ppo_args)) \
        if async_args.asynchronous else None
    return StageInputs(tokenizer, prompts, eval_prompts, ptx, eval_tasks, mailbox)


def build_policy_models(parsed, tokenizer):
    """(inputs.PolicyModels, the reward server or None): the reward (with use_rm_server the server scores,
    checked to answer first, and no reward model is loaded here), the teacher (a server is asked first), the
    actor, reference and critic."""
    model_args, data_args, ppo_args, distill_args, _, _, lora_args, _, _, train_args, run = parsed

    from alignment.ppo.inputs import PolicyModels
    from alignment.rewards.remote import RewardServerClient
    from alignment.rewards.scoring import RewardComputer

    server = RewardServerClient.from_args(ppo_args, tokenizer) if ppo_args.use_rm_server else None
    teacher = build_teacher(distill_args, ppo_args, train_args, tokenizer)
    actor, reference, critic, reward_model, reward_tokenizer = build_models(
        model_args.for_reward_server() if server else model_args, ppo_args, lora_args, train_args, run.layout)
    setup.template_as_asked(reward_tokenizer, data_args)  # chat_template none: the reward model reads raw text too
    reward = RewardComputer(reward_model, reward_tokenizer, tokenizer, ppo_args.reward_funcs,
                            ppo_args.reward_weights, ppo_args.clip_range_score, server)
    return PolicyModels(actor, reference, critic, reward, teacher, build_draft(ppo_args, actor, tokenizer)), server


def describe_run(parsed, models, server) -> None:
    """Print what scores the run: the teacher, the estimator and whether it built a critic, the reward's terms."""
    ppo_args, distill_args, env_args = parsed[2], parsed[3], parsed[4]
    scorer = ["reward model"] if models.reward.model else [f"reward server {', '.join(server.urls)}"] if server \
        else []
    environment = [f"agent {env_args.agent!r}" if env_args.agent else f"environment {env_args.environment!r}"] \
        if env_args.multi_turn else []
    if distill_args.distills:
        print(f"teacher {distill_args.teacher_model_name_or_path}: {distill_args.distill_loss} x "
              f"{distill_args.distill_coeff:g}, lmbda {distill_args.lmbda:g}")
    critic = "built" if models.critic is not None else "not built (critic-free)"
    print(f"{ppo_args.advantage_estimator}: critic {critic}; reward = "
          f"{' + '.join(scorer + list(ppo_args.reward_funcs) + environment)}"
          + (" (re-tokenized for the reward model)" if models.reward.retokenize else ""))


def build_trainer(parsed):
    """Start the processes, load the inputs and models and build the PPOTrainer (resumed when
    resume_from_checkpoint asks) from parse_arguments' result. -> (trainer, the asynchronous run's mailbox or
    None); on a rollout rank (None, what serving the rollouts returned)."""
    model_args, data_args, ppo_args, _, env_args, async_args, lora_args, _, monitor_args, train_args, run = parsed

    from alignment.data.tokenized import collate_prompts, collate_supervised
    from alignment.parallel.distributed import is_rollout_rank
    from alignment.ppo.asynchronous.asynchronous import RolloutSource
    from alignment.ppo.ppo_trainer import PPOTrainer, PromptData

    with setup.started(train_args, run):
        inputs = load_stage_inputs(parsed)
        if is_rollout_rank():
            return None, serve_rollouts(model_args, data_args, ppo_args, env_args, async_args, lora_args,
                                        train_args, run, inputs.tokenizer, inputs.prompts, inputs.mailbox)
        models, server = build_policy_models(parsed, inputs.tokenizer)
    describe_run(parsed, models, server)
    tokenizer, prompts, mailbox = inputs.tokenizer, inputs.prompts, inputs.mailbox
    with setup.user_errors():
        data = PromptData(prompts, inputs.eval_prompts, lambda items: collate_prompts(items, tokenizer.pad_token_id),
                          inputs.ptx, lambda items: collate_supervised(items, tokenizer.pad_token_id),
                          inputs.eval_tasks)
        source = RolloutSource(mailbox, run.layout, async_schedule(ppo_args, data_args, async_args, train_args,
                                                                   run.layout, len(prompts))) \
            if mailbox is not None else None
        trainer = PPOTrainer(ppo_args, train_args, data_args, models, data, tokenizer, run.effective, env_args,
                             async_args, source, monitor_args)
    return trainer, mailbox


@contextlib.contextmanager
def training_errors(trainer):
    """What stops a training run: setup.training_stops's, and the reward's and environments' failures."""
    from alignment.envs import EnvironmentFailure
    from alignment.rewards.functions import RewardFunctionError
    from alignment.rewards.remote import RewardServerError

    try:
        with setup.training_stops(trainer):
            yield
    except RewardServerError as err:  # unreachable past the retry budget: a run that failed mid-way
        setup.fail(err, code=1)
    except (RewardFunctionError, EnvironmentFailure) as err:  # user code that raised or broke its API
        setup.fail(err)


def run_training(trainer, mailbox, parsed) -> dict:
    """Train the built trainer to its last step, save and summarise."""
    ppo_args, train_args = parsed[2], parsed[9]
    with training_errors(trainer):
        results = trainer.train()
    if mailbox is not None and trainer.global_step == trainer.total_steps:
        mailbox.announce("async/done")  # the rollout ranks wait for it before the launch's last barrier
    if setup.benchmark_ended(train_args, ppo_args.advantage_estimator):
        return results
    print(f"\n{ppo_args.advantage_estimator} done: {trainer.global_step} steps; policy saved to "
          f"{os.path.join(train_args.output_dir, 'policy')}")
    if "start" in results and "end" in results:
        for key in results["end"]:
            print(f"  {key}: {results['start'][key]:.4f} before -> {results['end'][key]:.4f} after")
    setup.end_processes(train_args)  # prints the wall time; a multi-process run exits here
    return results
