"""The state and operations behind the Tinker API routes (http.py maps routes to these): sessions, training
models (training.py), sampling sessions (sampling.py), checkpoints on disk, and the futures the SDK polls.

A request that the SDK answers with a future (create_model, forward_backward, optim_step, the saves and loads,
asample) is queued and answered at once with its request id; one worker thread runs the queue in arrival order
(the SDK sends a training model's requests in seq_id order, each after the previous one was accepted, so arrival
order is that order). `/api/v1/retrieve_future` waits up to POLL_SECONDS for the result and otherwise answers
"try_again", which the SDK polls again. A request that fails has {"error", "category": "user"} (the request's
fault) or "server" as its result, which the SDK raises as RequestFailedError.

Checkpoints: tinker://<model id>/weights/<name> (save_state) and tinker://<model id>/sampler_weights/<name>
(save_weights_for_sampler) are the directories <checkpoint root>/<model id, ':' -> '_'>/weights/<name> and
.../sampler_weights/<name>; a name is letters, digits, '.', '_' and '-'.
"""
from __future__ import annotations

import os
import queue
import re
import threading
import uuid
from collections import OrderedDict
from typing import Callable, Dict, Optional, Set, Tuple

from alignment.tinker_service import wire
from alignment.tinker_service.sampling import generation_config, sample, sampler_model
from alignment.tinker_service.training import BaseModel, TrainingModel, UserError, checkpoint_shape, lora_model, lora_targets

NAME = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,127}")
RUN_ID = re.compile(r"[A-Za-z0-9_:\-][A-Za-z0-9_.:\-]{0,199}")  # no leading dot: never "." or ".."
KINDS = ("weights", "sampler_weights")
KEPT_RESULTS = 1024  # finished results held for retrieval; the oldest are dropped past this
POLL_SECONDS = 20.0  # a retrieve_future waits this long for its result (the SDK polls with a 45 s timeout)


class TinkerService:
    def __init__(self, bases: Dict[str, BaseModel], checkpoint_root: str, lora_alpha: float = 32.0,
                 max_tokens: int = 64, poll_seconds: float = POLL_SECONDS):
        self.bases, self.root, self.lora_alpha, self.max_tokens = bases, checkpoint_root, lora_alpha, max_tokens
        self.poll_seconds = poll_seconds
        self.try_agains = 0  # polls answered "try_again"
        self.lock = threading.Lock()  # the models and samplers: held by the worker's jobs and the direct routes
        self.sessions: Set[str] = set()
        self.models: Dict[str, TrainingModel] = {}
        self.samplers: Dict[str, Tuple[BaseModel, object, Optional[str], str]] = {}  # id -> (base, model,
        # tinker path, session id)
        self.results: "OrderedDict[str, Optional[tuple]]" = OrderedDict()  # request id -> result, None: pending
        self.finished = threading.Condition()
        self.jobs: "queue.Queue[Tuple[str, Callable[[], tuple]]]" = queue.Queue()
        threading.Thread(target=self._work, daemon=True, name="tinker-worker").start()

    # ------------------------------------------------------------------ futures

    def run_future(self, work: Callable[[], tuple], model_id: Optional[str] = None, **extra) -> dict:
        """Queue `work` for the worker and return the UntypedAPIFuture the SDK polls."""
        request_id = uuid.uuid4().hex
        with self.finished:
            self.results[request_id] = None
            self.jobs.put((request_id, work))
        return {"request_id": request_id, "model_id": model_id, **extra}

    def _work(self) -> None:
        """The jobs one at a time, in the order they came; a job's failure is its request's result."""
        while True:
            request_id, work = self.jobs.get()
            with self.lock:
                try:
                    result = work()
                except UserError as err:
                    result = ("json", {"error": str(err), "category": "user"})
                except Exception as err:  # noqa: BLE001 - reported to the client as a server-side failure
                    result = ("json", {"error": f"{type(err).__name__}: {err}", "category": "server"})
            with self.finished:
                self.results[request_id] = result
                done = [k for k, v in self.results.items() if v is not None]
                for key in done[:max(0, len(done) - KEPT_RESULTS)]:
                    del self.results[key]
                self.finished.notify_all()

    def retrieve(self, request_id: str, wait: Optional[float] = None) -> Optional[tuple]:
        """The request's result, waiting up to `wait` seconds (default poll_seconds) for it; a "try_again" answer
        if it is still running; None for an unknown id."""
        with self.finished:
            if request_id not in self.results:
                return None
            self.finished.wait_for(lambda: self.results.get(request_id) is not None,
                                   timeout=self.poll_seconds if wait is None else wait)
            result = self.results.get(request_id)
            if result is None:
                self.try_agains += 1
                return "json", {"type": "try_again", "request_id": request_id, "queue_state": "active"}
        return result

    # ------------------------------------------------------------------ sessions and models

    def create_session(self) -> str:
        session = uuid.uuid4().hex[:16]
        with self.lock:
            self.sessions.add(session)
        return session

    def finish_session(self, session: str) -> None:
        """ServiceClient.close(): drop the session's training models and sampling sessions (checkpoints stay)."""
        with self.lock:
            self.sessions.discard(session)
            for model_id in [m for m in self.models if m.startswith(f"{session}:")]:
                del self.models[model_id]
            for sampler_id in [k for k, v in self.samplers.items() if v[3] == session]:
                del self.samplers[sampler_id]

    def base(self, name: Optional[str]) -> BaseModel:
        if name not in self.bases:
            raise UserError(f"base_model {name!r} is not served here; served: {', '.join(sorted(self.bases))}")
        return self.bases[name]

    def new_model_id(self, request: dict) -> str:
        """The id of a session's next training model, as the SDK derives it: <session>:train:<model_seq_id>."""
        if request.get("session_id") not in self.sessions:
            raise UserError(f"no session {request.get('session_id')!r} on this server")
        return f"{request['session_id']}:train:{int(request['model_seq_id'])}"

    def model(self, model_id: str) -> TrainingModel:
        if model_id not in self.models:
            raise UserError(f"no training model {model_id!r} on this server")
        return self.models[model_id]

    def create_model(self, request: dict) -> dict:
        with self.lock:
            model_id = self.new_model_id(request)

        def work():
            base = self.base(request.get("base_model"))
            lora = request.get("lora_config") or {}
            rank = int(lora.get("rank", 32))
            if rank < 1:
                raise UserError("lora_config.rank must be >= 1")
            optimizer = (request.get("optimizer_config") or {}).get("type", "adamw")
            if optimizer != "adamw":
                raise UserError(f"optimizer {optimizer!r} is not supported; only adamw")
            targets = lora_targets(bool(lora.get("train_attn", True)), bool(lora.get("train_mlp", True)))
            model = lora_model(base, rank, self.lora_alpha, targets, lora.get("seed"))
            self.models[model_id] = TrainingModel(model_id, base, model, rank)
            return "json", {"model_id": model_id, "type": "create_model"}

        return self.run_future(work, model_id)

    def info(self, model_id: str) -> dict:
        with self.lock:
            model = self.model(model_id)
        return {"type": "get_info", "model_id": model_id, "is_lora": True, "lora_rank": model.rank,
                "model_name": model.base.name,
                "model_data": {"arch": "llama", "model_name": model.base.name, "tokenizer_id": model.base.path}}

    # ------------------------------------------------------------------ training

    def forward_backward(self, body: bytes) -> dict:
        request = wire.decode_forward_backward(body)

        def work():
            outputs, metrics = self.model(request.model_id).forward_backward(
                request.data, request.loss_fn, request.loss_fn_config, request.forward_only)
            return "proto", wire.encode_forward_backward_output(outputs, metrics)

        return self.run_future(work, request.model_id)

    def optim_step(self, request: dict) -> dict:
        def work():
            if request.get("adam_params") is None:
                raise UserError("only Adam steps (adam_params) are supported")
            return "json", {"metrics": self.model(request["model_id"]).optim_step(request["adam_params"])}

        return self.run_future(work, request["model_id"])

    # ------------------------------------------------------------------ checkpoints

    def checkpoint_dir(self, run_id: str, kind: str, name: str) -> str:
        return os.path.join(self.root, run_id.replace(":", "_"), kind, name)

    def resolve(self, path: str) -> str:
        """tinker://<run>/<weights|sampler_weights>/<name> -> an existing checkpoint directory."""
        parts = path[len("tinker://"):].split("/") if path.startswith("tinker://") else []
        if len(parts) != 3 or not RUN_ID.fullmatch(parts[0]) or parts[1] not in KINDS or not NAME.fullmatch(
                parts[2]):
            raise UserError(f"{path!r} is not a checkpoint path (tinker://<model id>/weights/<name>)")
        folder = self.checkpoint_dir(*parts)
        if not os.path.isdir(folder):
            raise UserError(f"no checkpoint {path!r} on this server")
        return folder

    def save(self, request: dict, kind: str, name: Optional[str], with_optimizer: bool) -> str:
        model = self.model(request["model_id"])
        if not NAME.fullmatch(name or ""):
            raise UserError(f"checkpoint name {name!r}: use letters, digits, '.', '_' and '-' only")
        folder = self.checkpoint_dir(model.model_id, kind, name)
        if os.path.exists(folder) and not request.get("overwrite", False):
            raise UserError(f"checkpoint {name!r} exists; pass overwrite=True or another name")
        model.save(folder, with_optimizer)
        return f"tinker://{model.model_id}/{kind}/{name}"

    def save_weights(self, request: dict) -> dict:
        return self.run_future(lambda: ("json", {"type": "save_weights", "path": self.save(
            request, "weights", request.get("path"), True)}), request["model_id"])

    def load_weights(self, request: dict) -> dict:
        model_id = request.get("model_id")
        if model_id is None:  # a new training model from a checkpoint (create_training_client_from_state)
            with self.lock:
                model_id = self.new_model_id(request)

        def work():
            folder = self.resolve(request["path"])
            if model_id not in self.models:
                shape = checkpoint_shape(folder)
                base = self.base(request.get("base_model") or shape["base_model"])
                self.models[model_id] = TrainingModel(
                    model_id, base, lora_model(base, shape["rank"], shape["alpha"], shape["targets"], None),
                    shape["rank"])
            self.models[model_id].load(folder, bool(request.get("optimizer")))
            return "json", {"type": "load_weights", "path": request["path"], "model_id": model_id}

        return self.run_future(work, model_id)

    def save_for_sampler(self, request: dict) -> dict:
        def work():
            name = request.get("path")
            if name is None:  # save_weights_and_get_sampling_client: an unnamed snapshot and its session
                name = f"sampler-{uuid.uuid4().hex[:12]}"
            path = self.save(request, "sampler_weights", name, False)
            out = {"type": "save_weights_for_sampler", "path": path}
            if request.get("path") is None:
                out["sampling_session_id"] = self.open_sampler(path, None, request["model_id"].split(":")[0])
            return "json", out

        return self.run_future(work, request["model_id"])

    # ------------------------------------------------------------------ sampling

    def open_sampler(self, model_path: Optional[str], base_model: Optional[str], session: str) -> str:
        """A sampling session on a checkpoint (model_path) or on a base model -> its id (call under the lock)."""
        if model_path is not None:
            folder = self.resolve(model_path)
            base = self.base(checkpoint_shape(folder)["base_model"])
            model = sampler_model(base, folder)
        else:
            base = self.base(base_model)
            model = sampler_model(base)
        sampler_id = f"sampler-{uuid.uuid4().hex[:16]}"
        self.samplers[sampler_id] = (base, model, model_path, session)
        return sampler_id

    def create_sampling_session(self, request: dict) -> str:
        with self.lock:
            return self.open_sampler(request.get("model_path"), request.get("base_model"), request["session_id"])

    def sampler_info(self, sampler_id: str) -> dict:
        with self.lock:
            if sampler_id not in self.samplers:
                raise UserError(f"no sampling session {sampler_id!r}")
            base, _, path, _ = self.samplers[sampler_id]
        return {"sampler_id": sampler_id, "base_model": base.name, "model_path": path}

    def sample(self, request: dict) -> dict:
        count = int(request.get("num_samples", 1))
        ids = [uuid.uuid4().hex for _ in range(max(count, 0))]

        def work():
            if request.get("sampling_session_id") not in self.samplers:
                raise UserError(f"no sampling session {request.get('sampling_session_id')!r}; create a sampling "
                                "client first")
            base, model = self.samplers[request["sampling_session_id"]][:2]
            if request.get("prompt_logprobs") or request.get("topk_prompt_logprobs") or request.get(
                    "topk_sample_logprobs") or request.get("prompt_alt_tokens_k"):
                raise UserError("prompt log-probs and top-k log-probs are not supported by this server")
            tokens = []
            for chunk in (request.get("prompt") or {}).get("chunks", []):
                if chunk.get("type", "encoded_text") != "encoded_text":
                    raise UserError("only encoded-text prompt chunks are supported")
                tokens.extend(int(t) for t in chunk.get("tokens", []))
            params = request.get("sampling_params") or {}
            config = generation_config(params, model.config.eos_token_ids, self.max_tokens)
            seed = params.get("seed")
            sequences = sample(model, tokens, count, config, None if seed is None else int(seed), base.max_length)
            return "proto", wire.encode_sample_response(sequences)

        return self.run_future(work, None, sample_sequence_ids=ids)
