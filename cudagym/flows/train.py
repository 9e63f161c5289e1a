"""Training as a Prefect flow: rft -> value -> ppo on the rollouts of an agent run, each stage resumable.

The flow only sequences library calls (cudagym.train): `sft.rft_stage` (select the good rollouts,
fine-tune the actor on them, loss on model tokens only), `value.value_stage` (a critic on the RFT
checkpoint, fitted to the GAE returns of every judged rollout), `ppo_engine.run_ppo` (PPO steps with
rollouts of the agent environment served by the trainer's own policy). Each stage writes under
OUT/<stage> and a rerun skips what is finished (RFT's summary, the value curve, PPO's checkpoints),
so a killed run resumes. Every stage leaves a markdown artifact with its curve as a table and the
path of a PNG plot of it. A run without a trajectory store or a model fails with one line.

    cudagym serve --deployments train --param train.rollouts=out/rollouts --param train.model=CHECKPOINT
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from prefect import flow
from prefect import task as ptask
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.states import Failed

from cudagym.flows.devices import resolve_device

NO_ROLLOUTS = "no trajectory store"  # the start of the one line a run without rollouts fails with
ARTIFACT_KEYS = {"rft": "train-rft-curve", "value": "train-value-curve", "ppo": "train-ppo-curve"}


def plot_curve(rows: list[dict], keys: tuple[str, ...], path: Path) -> str | None:
    """A PNG of `keys` against `step` (one panel each); None where matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3), squeeze=False)
    for ax, key in zip(axes[0], keys):
        ax.plot([r["step"] for r in rows], [r.get(key, math.nan) for r in rows], marker="o")
        ax.set_xlabel("step")
        ax.set_title(key)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return str(path)


def curve_markdown(stage: str, rows: list[dict], keys: tuple[str, ...], png: str | None, summary: str) -> str:
    def cell(value) -> str:
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    header = "| step | " + " | ".join(keys) + " |\n| --- |" + " --- |" * len(keys) + "\n"
    body = "".join(f"| {r['step']} | " + " | ".join(cell(r.get(k)) for k in keys) + " |\n" for r in rows)
    plot = f"\n\nPlot: `{png}`" if png else ""
    return f"# {stage}\n\n{summary}\n\n{header}{body}{plot}\n"


def report(stage: str, rows: list[dict], keys: tuple[str, ...], folder: Path, summary: str) -> None:
    png = plot_curve(rows, keys, folder / f"{stage}_curve.png") if rows else None
    create_markdown_artifact(key=ARTIFACT_KEYS[stage], markdown=curve_markdown(stage, rows, keys, png, summary))


@ptask(cache_policy=NO_CACHE, name="rft")
def rft(db: Path, model: str, out: Path, epochs: int, lr: float) -> str:
    from cudagym.train.sft import METRICS, SFTConfig, rft_stage

    summary = rft_stage(db, model, out, config=SFTConfig(lr=lr, epochs=epochs))
    rows = [json.loads(line) for line in (out / METRICS).read_text().splitlines() if line.strip()]
    report("rft", rows, ("loss", "grad_norm"), out,
           f"fine-tuned on {summary['samples']} rollouts in {summary['steps']} steps; checkpoint `{summary['checkpoint']}`")
    return summary["checkpoint"]


@ptask(cache_policy=NO_CACHE, name="value")
def value(db: Path, model: str, out: Path, max_steps: int, lr: float) -> str:
    from cudagym.train.ppo import PPOConfig
    from cudagym.train.value import ValuePretrainConfig, value_stage

    curve_file = out / "value_curve.json"
    if not curve_file.is_file():  # a finished stage is not redone
        value_stage(db, model, out, PPOConfig(critic_lr=lr), ValuePretrainConfig(max_steps=max_steps))
    saved = json.loads(curve_file.read_text())
    summary = saved["summary"]
    report("value", saved["curve"], ("explained_variance", "vf_loss"), out,
           f"critic pretrained on {summary['rollouts']} rollouts in {summary['steps']} steps ({summary['stopped']});"
           f" critic `{summary['critic']}`")
    return summary["critic"]


@ptask(cache_policy=NO_CACHE, name="ppo")
def ppo(config) -> list[dict]:
    from cudagym.train.ppo_engine import run_ppo

    rows = run_ppo(config)
    report("ppo", rows, ("reward", "pass_rate", "faster_than_compile", "kl", "clipfrac", "value_loss",
                         "explained_variance", "tokens_per_s"), Path(config.out),
           f"{len(rows)} PPO steps; checkpoints in `{config.out}/checkpoints`, metrics in `{config.out}/metrics.jsonl`")
    return rows


@flow(name="train", log_prints=True)
def train(rollouts: str = "out/rollouts", model: str = "", out: str = "out/train", tasks: str = "kernelbench",
          levels: list[int] | None = None, ids: str | None = None, ppo_steps: int = 1, rollouts_per_step: int = 1,
          max_turns: int = 150, max_new_tokens: int = 4096, device: str = "auto", sft_epochs: int = 2,
          sft_lr: float = 1e-5, value_max_steps: int = 200, actor_lr: float = 3e-6, critic_lr: float = 6e-6):
    """RFT, value pretraining and PPO of the causal LM `model` (a transformers checkpoint folder) on the
    rollouts of an agent run (`rollouts`: a `cudagym agent rollout --out` folder); outputs under `out`."""
    from cudagym.train.ppo import PPOConfig
    from cudagym.train.ppo_engine import LocalPPOConfig

    db = Path(rollouts) / "trajectories.duckdb"
    if not db.is_file():
        return Failed(message=f"{NO_ROLLOUTS} at {db}: run the agent_rollouts flow first or pass `rollouts`")
    if not (Path(model) / "config.json").is_file():
        return Failed(message=f"model {model!r} is not a transformers checkpoint folder (no config.json)")
    out_dir = Path(out)
    checkpoint = rft(db, model, out_dir / "rft", sft_epochs, sft_lr)
    critic = value(db, checkpoint, out_dir / "value", value_max_steps, critic_lr)
    config = LocalPPOConfig(tasks=tasks, model=checkpoint, critic=critic, out=str(out_dir / "ppo"), steps=ppo_steps,
                            rollouts_per_step=rollouts_per_step, levels=tuple(levels) if levels else None, ids=ids,
                            max_turns=max_turns, max_new_tokens=max_new_tokens, device=resolve_device(device),
                            ppo=PPOConfig(actor_lr=actor_lr, critic_lr=critic_lr))
    return ppo(config)
