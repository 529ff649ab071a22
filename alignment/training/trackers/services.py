"""The trackers with a run of their own: wandb, MLflow, SwanLab, trackio. Each keeps its run id in
output_dir/trackers.json, so that a resumed run (resume_from_checkpoint) continues the same tracker run; the rows of
steps the tracker already holds (logged by the stopped run after its checkpoint: the same values, exact resume
recomputes them) are not sent twice."""
from __future__ import annotations

import os
import secrets
import time
from typing import Dict, Optional, Tuple

from alignment.training.trackers.base import DEFAULT_PROJECT, Tracker, TrackedRun


class WandB(Tracker):
    """Weights & Biases, offline by default (files under logging_dir/wandb; `wandb sync DIR` uploads them),
    online with wandb_mode / WANDB_MODE. A resumed run calls wandb.init with the stored id and resume="allow":
    online, the same run continues after its last step; offline, a second offline-run directory of the same id is
    written, which `wandb sync` appends to that run."""
    NAME, EXTRA, MODULES = "wandb", "wandb", ("wandb",)

    @classmethod
    def dashboard(cls, args, logging_dir: str) -> Optional[str]:
        offline = (args.wandb_mode or os.environ.get("WANDB_MODE") or "offline") == "offline"
        return f"wandb sync {os.path.join(logging_dir, 'wandb', 'offline-run-*')}" if offline else None

    def __init__(self, run: TrackedRun):
        super().__init__(run)
        import wandb

        run_id = (run.resume_step is not None and run.state.get("id")) or secrets.token_hex(4)
        run.state["id"] = run_id
        mode = run.args.wandb_mode or os.environ.get("WANDB_MODE") or "offline"
        settings = wandb.Settings(console="off", quiet=True, x_disable_stats=True, save_code=False, disable_git=True)
        self.wandb = wandb.init(project=run.project("WANDB_PROJECT"), name=run.name, id=run_id, resume="allow",
                                mode=mode, dir=run.local_dir("."), settings=settings,  # wandb adds wandb/
                                reinit="create_new")
        self.wandb.config.update(run.config, allow_val_change=True)
        self.first_step = self.wandb.step  # online resume: the run's next step; rows before it are held already

    def log(self, step: int, scalars: Dict[str, float]) -> None:
        if step >= self.first_step:
            self.wandb.log(scalars, step=step)

    def close(self) -> None:
        self.wandb.finish()


class MLflow(Tracker):
    """MLflow: MLFLOW_TRACKING_URI when set, else a SQLite store logging_dir/mlflow.db with artifacts in
    logging_dir/mlartifacts (`mlflow ui --backend-store-uri sqlite:///DIR/mlflow.db`). The arguments are the run's
    parameters; a resumed run continues the stored run id."""
    NAME, EXTRA = "mlflow", "mlflow"
    PARAMS_PER_CALL, PARAM_LENGTH = 100, 6000  # MLflow's limits on one log_batch and one parameter value

    @classmethod
    def dashboard(cls, args, logging_dir: str) -> Optional[str]:
        if os.environ.get("MLFLOW_TRACKING_URI"):
            return None
        return f"mlflow ui --backend-store-uri sqlite:///{os.path.abspath(os.path.join(logging_dir, 'mlflow.db'))}"

    @classmethod
    def modules(cls, args) -> Tuple[str, ...]:
        return ("mlflow",) if os.environ.get("MLFLOW_TRACKING_URI") else ("mlflow", "sqlalchemy", "alembic")

    def __init__(self, run: TrackedRun):
        super().__init__(run)
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        local = os.path.abspath(run.local_dir("."))
        self.client = MlflowClient(tracking_uri=uri or f"sqlite:///{os.path.join(local, 'mlflow.db')}")
        self.run_id, self.last_held = run.state.get("run_id") if run.resume_step is not None else None, -1
        if self.run_id:
            self.client.update_run(self.run_id, status="RUNNING")
            held = self.client.get_run(self.run_id).data.metrics
            self.last_held = max((m.step for key in held for m in self.client.get_metric_history(self.run_id, key)),
                                 default=-1)
        else:
            name = run.project("MLFLOW_EXPERIMENT_NAME")
            experiment = self.client.get_experiment_by_name(name)
            artifacts = None if uri else "file://" + os.path.join(local, "mlartifacts")
            experiment_id = experiment.experiment_id if experiment else \
                self.client.create_experiment(name, artifact_location=artifacts)
            self.run_id = self.client.create_run(experiment_id, run_name=run.name).info.run_id
            self.log_params(run.config)
        run.state["run_id"] = self.run_id

    def log_params(self, config: dict) -> None:
        from mlflow.entities import Param

        params = [Param(key, str(value)[:self.PARAM_LENGTH]) for key, value in sorted(config.items())]
        for start in range(0, len(params), self.PARAMS_PER_CALL):
            self.client.log_batch(self.run_id, params=params[start:start + self.PARAMS_PER_CALL])

    def log(self, step: int, scalars: Dict[str, float]) -> None:
        from mlflow.entities import Metric

        if step > self.last_held:
            now = int(time.time() * 1000)
            self.client.log_batch(self.run_id, metrics=[Metric(key, value, now, step) for key, value in
                                                        scalars.items()])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class SwanLab(Tracker):
    """SwanLab in local mode (logging_dir/swanlog; `swanlab watch DIR/swanlog`; its dashboard package swanboard,
    swanlab[dashboard], must be there), or SWANLAB_MODE (cloud, offline, disabled). SwanLab resumes a run by id in
    cloud mode: there the stored id continues it; a local-mode resume is a second local experiment (named
    '<run_name>-2' by SwanLab)."""
    NAME, EXTRA = "swanlab", "swanlab"

    @classmethod
    def modules(cls, args) -> Tuple[str, ...]:
        local = (os.environ.get("SWANLAB_MODE") or "local") == "local"
        return ("swanlab", "swanboard") if local else ("swanlab",)  # local mode keeps its dashboard's files

    @classmethod
    def dashboard(cls, args, logging_dir: str) -> str:
        return f"swanlab watch {os.path.join(logging_dir, 'swanlog')}"

    def __init__(self, run: TrackedRun):
        super().__init__(run)
        import swanlab

        mode = os.environ.get("SWANLAB_MODE") or "local"
        resume = {"id": run.state["id"], "resume": "allow"} if mode == "cloud" and run.resume_step is not None \
            and run.state.get("id") else {}
        self.swanlab = swanlab.init(project=run.project(), experiment_name=run.name,
                                    config=run.config, logdir=run.local_dir("swanlog"), mode=mode, **resume)
        run.state["id"] = getattr(self.swanlab, "id", None) or resume.get("id")

    def log(self, step: int, scalars: Dict[str, float]) -> None:
        self.swanlab.log(scalars, step=step)

    def close(self) -> None:
        self.swanlab.finish()


class Trackio(Tracker):
    """trackio, local: its own store (TRACKIO_DIR, default the Hugging Face cache's trackio/; `trackio show`).
    A resumed run continues the run of the same name (resume="allow") after the last step it holds."""
    NAME, EXTRA, MODULES = "trackio", "trackio", ("trackio",)

    @classmethod
    def dashboard(cls, args, logging_dir: str) -> str:
        return f"trackio show --project {args.project or DEFAULT_PROJECT}"

    def __init__(self, run: TrackedRun):
        super().__init__(run)
        import trackio
        from trackio.sqlite_storage import SQLiteStorage

        self.project = run.project()
        resume = "allow" if run.resume_step is not None else "never"
        held = SQLiteStorage.get_max_step_for_run(self.project, run.name) if resume == "allow" else None
        self.last_held = -1 if held is None else held
        self.trackio = trackio.init(project=self.project, name=run.name, config=run.config, resume=resume,
                                    embed=False, auto_log_cpu=False, auto_log_gpu=False)
        run.state["name"] = run.name

    def log(self, step: int, scalars: Dict[str, float]) -> None:
        if step > self.last_held:
            self.trackio.log(scalars, step=step)

    def close(self) -> None:
        self.trackio.finish()
