"""`train`: compose the run with Hydra, validate it, build the parts, train.

Errors in the user's input end in one line on stderr and exit code 2, never a traceback
(set HYDRA_FULL_ERROR=1 for the full one).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from pathlib import Path

import hydra
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from maze_cli.cli.errors import explain, exit_code
from maze_cli.cli.schema import ConfigError, validate
from maze_cli.cli.paths import config_dir

log = logging.getLogger("maze_cli")


def _env_options() -> list[str]:
    try:
        return sorted(GlobalHydra.instance().config_loader().get_group_options("env"))
    except Exception:  # outside a Hydra run there is nothing to list
        return []


def run_train(cfg: DictConfig) -> dict:
    """The task: everything after composition. Returns a summary of the run."""
    settings = validate(cfg, _env_options())
    if settings.runner.name == "subproc":
        # Before torch is imported here: the forkserver loads it on the other core meanwhile.
        from maze_cli.start_methods import warm_up_start_method

        warm_up_start_method(settings.runner.start_method)

    import torch

    from maze_cli.checkpoint import save_checkpoint
    from maze_cli.cli.build import build_run, check_device, check_env
    from maze_cli.envs.spaces import describe_space
    from maze_cli.seeding import derive_seed, seed_everything
    from maze_cli.stats.writers import ConsoleTable, JsonlWriter, TensorBoardWriter
    from maze_cli.training import Budget, Trainer

    check_device(settings.train.device)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    torch.set_num_threads(settings.train.torch_threads)
    env_factory, observation_space, action_space = check_env(settings)
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)

    seed_everything(derive_seed(settings.train.seed, "learner"))
    run = build_run(settings, env_factory, observation_space, action_space)
    t = settings.train
    budget = Budget(t.max_env_steps, t.max_time_s, t.target_return, t.target_window, t.epoch_length)
    writers = [ConsoleTable(), JsonlWriter(run_dir / "stats.jsonl"), TensorBoardWriter(run_dir / "tensorboard")]
    log.info(f"run dir: {run_dir}")
    log.info(
        f"env {env_factory.describe()}: observations {describe_space(observation_space)}, actions {describe_space(action_space)}; "
        f"{settings.algorithm.name} with {settings.runner.name} runner, {settings.runner.n_actors} actors x {settings.runner.envs_per_actor} envs"
    )
    trainer = Trainer(run.loop, budget, writers)

    def checkpoint(reason: str) -> None:
        save_checkpoint(
            run_dir / "checkpoints" / "last.pt",
            {
                "learner": run.learner.state_dict(),
                "policy_blueprint": dataclasses.asdict(run.blueprint),
                "env_steps": trainer.env_steps,
                "epoch": trainer.epoch,
                "stop_reason": reason,
                "config": OmegaConf.to_container(cfg, resolve=True),
            },
        )

    try:
        with run.runner:
            result = trainer.run()
    except KeyboardInterrupt:
        checkpoint("interrupted")
        log.info("interrupted: actors stopped, checkpoints/last.pt written")
        raise
    finally:
        for writer in writers:
            writer.close()
    checkpoint(result.stop_reason)
    return {"stop_reason": result.stop_reason, "env_steps": result.env_steps, "time_s": result.time_s}


_FULL_ERROR = os.environ.get("HYDRA_FULL_ERROR") == "1"


def _exit_on_user_error(err: Exception) -> None:
    """Print a known error as one line and exit; return (to re-raise) for anything else."""
    message = None if _FULL_ERROR else explain(err, sys.argv[1:])
    if message is not None:
        print(f"train: error: {message}", file=sys.stderr)
        sys.exit(exit_code(err))


def _discard_unused_run_dir() -> None:
    """Remove the run dir Hydra made for a run that never started, if it holds only Hydra's own files."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    hydra_files = {"config.yaml", "hydra.yaml", "overrides.yaml"}
    log_file = run_dir / "train.log"
    try:
        if set(os.listdir(run_dir)) - {".hydra", "train.log"} or set(os.listdir(run_dir / ".hydra")) - hydra_files:
            return
        if log_file.exists() and log_file.stat().st_size > 0:
            return
        for name in hydra_files:
            (run_dir / ".hydra" / name).unlink(missing_ok=True)
        (run_dir / ".hydra").rmdir()
        log_file.unlink(missing_ok=True)
        run_dir.rmdir()
    except OSError:
        pass


@hydra.main(version_base="1.3", config_path=str(config_dir()), config_name="train")
def _hydra_train(cfg: DictConfig) -> dict:
    # Errors are reported here, inside the job, so Hydra adds no lines of its own to the message.
    try:
        return run_train(cfg)
    except ConfigError as err:
        _discard_unused_run_dir()
        _exit_on_user_error(err)
        raise
    except Exception as err:
        _exit_on_user_error(err)
        raise


def main() -> None:
    """Console script `train`."""
    os.environ["HYDRA_FULL_ERROR"] = "1"  # composition errors reach us; we print them for humans
    try:
        _hydra_train()
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as err:
        _exit_on_user_error(err)
        raise


if __name__ == "__main__":
    main()
