"""`cudagym` command line: parse, build a config, call one library function, print.

Heavy imports happen inside the commands. Bad input exits 1 with one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

DEFAULT_DB = "out/cudagym.duckdb"


class UsageError(Exception):
    """Bad input; printed as one line."""


def _levels(text: str) -> list[int]:
    try:
        levels = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"levels must be comma-separated integers, got {text!r}") from None
    if not levels or any(lv < 1 for lv in levels):
        raise argparse.ArgumentTypeError(f"levels must be positive integers, got {text!r}")
    return levels


def _ids(text: str) -> set[int]:
    """'1-10,12' -> {1..10, 12}."""
    from cudagym.tasks import TaskError, parse_id_ranges

    try:
        return parse_id_ranges(text)
    except TaskError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _default_device() -> str:
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"


def _parallel(args: argparse.Namespace, device: str) -> int:
    """Judges at once: one per CPU core on a GPU (timing stays exclusive); one on the CPU, where
    concurrent judges would time each other."""
    if args.parallel:
        return args.parallel
    return min(16, os.cpu_count() or 1) if device.startswith("cuda") else 1


def _eval_config(args: argparse.Namespace):
    from cudagym.eval.checks import STRICT_TOLERANCE, Tolerance
    from cudagym.eval.evaluate import EvalConfig

    device = args.device or _default_device()
    if device.startswith("cuda") and getattr(args, "runner", "local") == "local":  # a Ray driver needs no GPU
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--device cuda but no CUDA device is visible (use --device cpu)")
    try:
        tol = STRICT_TOLERANCE if args.tolerance == "strict" else Tolerance()
        config = EvalConfig(device=device, policy=args.policy, timing_mode=args.timing_mode, precision=args.precision,
                            n_checks=args.n_checks, timeout_s=args.timeout, atol=tol.atol, rtol=tol.rtol)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if device.startswith("cuda") and getattr(args, "runner", "local") == "local":
        from cudagym.eval.evaluate import with_timing_cpus

        # Every judge of the machine splits the cores the same way (gpulock.timing_cpu_split), and this
        # process (static checks, libcst, rich) stays off the ones they time on.
        config = with_timing_cpus(config)
        if config.work_cpus:
            os.sched_setaffinity(0, config.work_cpus)
    return config


def _open_store(path: str):
    from cudagym.eval.store import Store

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return Store(path)


def _tasks(args: argparse.Namespace):
    """The problems a command runs on: --problems file, else KernelBench at --kb-version/--levels."""
    from cudagym.kernelbench import load_problems
    from cudagym.tasks import load_task_set

    if getattr(args, "problems", None):
        tasks = load_task_set(args.problems)
        tasks = [t for t in tasks if t.level in args.levels] if args.levels_given else tasks
    else:
        tasks = load_problems(args.kb_version, args.levels)
    if getattr(args, "ids", None):
        tasks = [t for t in tasks if t.problem_id in args.ids]
    if not tasks:
        raise UsageError("no problems selected")
    return tasks


def _print_table(rows: list[dict], columns: list[str], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*[_fmt(row.get(col)) for col in columns])
    Console(stderr=False).print(table)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return "" if value is None else str(value)


# -- commands ---------------------------------------------------------------------------------------
def cmd_eval_one(args) -> int:
    from cudagym.eval.evaluate import CandidateError, evaluate_candidate, validate_candidate

    ref, cand = Path(args.ref), Path(args.candidate)
    for path in (ref, cand):
        if not path.is_file():
            raise UsageError(f"no such file: {path}")
    ref_code, cand_code = ref.read_text(), cand.read_text()
    try:
        compile(ref_code, str(ref), "exec")
    except SyntaxError as e:
        raise UsageError(f"{ref}: syntax error at line {e.lineno}: {e.msg}") from None
    try:
        validate_candidate(ref_code, cand_code)
    except CandidateError as e:
        raise UsageError(f"{cand}: {e}") from None
    verdict = evaluate_candidate(ref_code, cand_code, _eval_config(args))
    if args.json:
        print(verdict.to_json())
    else:
        _print_table([verdict.to_dict()], ["status", "reason", "flags", "t_candidate_ms", "t_eager_ms", "t_compile_ms",
                                           "speedup_vs_eager", "speedup_vs_compile", "reward"], f"{cand.name}")
    return 0


def cmd_eval_run(args) -> int:
    from cudagym.eval.batch import run_submission
    from cudagym.eval.metrics import compute_metrics

    config = _eval_config(args)
    tasks = _tasks(args)
    name = args.name or Path(args.submission_dir).resolve().name
    kb_version = None if args.problems else args.kb_version
    with _open_store(args.db) as store:
        verdicts = run_submission(args.submission_dir, tasks, store, name, config, parallel=_parallel(args, config.device),
                                  levels=args.levels if not args.problems else sorted({t.level for t in tasks}),
                                  kb_version=kb_version, runner=args.runner, address=args.address)
    rows = [v.to_dict() for v in verdicts]
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    metrics = compute_metrics(rows, expected=[(t.level, t.problem_id) for t in tasks])
    _print_table([{"scope": k, **m} for k, m in metrics.items()],
                 ["scope", "n", "pass_rate", "faster_than_compile_rate", "faster_than_eager_rate",
                  "geomean_all_vs_compile", "geomean_all_vs_eager"],
                 f"{name} ({config.timing_mode} timing, {config.precision} precision)")
    return 0


def cmd_baseline_run(args) -> int:
    from cudagym.eval.batch import run_baselines

    config = _eval_config(args)
    tasks = _tasks(args)
    with _open_store(args.db) as store:
        results = run_baselines(tasks, store, config, parallel=_parallel(args, config.device), runner=args.runner,
                                address=args.address)
    rows = [{"id": t.id, "name": t.name, **{k: results[t.id].get(k) for k in ("t_eager_ms", "t_compile_ms", "reason")}}
            for t in tasks]
    if args.json:
        print(json.dumps(rows))
    else:
        _print_table(rows, ["id", "name", "t_eager_ms", "t_compile_ms", "reason"], "baselines")
    return 0


def cmd_baseline_cache_export(args) -> int:
    from cudagym.eval.compile_cache import export_cache

    done = export_cache(args.file)
    print(f"{args.file}: {done['artifacts']} artifact files, {done['keys']} compiled graphs, {done['bytes'] / 1e6:.1f} MB")
    return 0


def cmd_baseline_cache_import(args) -> int:
    from cudagym.eval.compile_cache import artifacts_dir, import_cache

    done = import_cache(args.file)
    print(f"{args.file}: {done['artifacts']} artifact files ({done['keys']} compiled graphs) loaded into"
          f" {artifacts_dir().parent}")
    return 0


def cmd_audit(args) -> int:
    from cudagym.eval.batch import run_audit

    config = _eval_config(args)
    tasks = _tasks(args)
    with _open_store(args.db) as store:
        rows = run_audit(tasks, config, parallel=_parallel(args, config.device), runner=args.runner,
                         address=args.address, store=store)
    if args.json:
        print(json.dumps(rows))
    else:
        _print_table([r for r in rows if r.get("degenerate") or r.get("error")],
                     ["level", "problem_id", "name", "accepts", "near", "stochastic", "error"],
                     f"problems whose check accepts a degenerate answer ({sum(bool(r['accepts']) for r in rows)} of"
                     f" {len(rows)}), comes near one ({sum(bool(set(r.get('near') or []) - set(r['accepts'])) for r in rows)})"
                     f" or whose reference is random ({sum(bool(r['stochastic']) for r in rows)})")
    return 0


def cmd_leaderboard_metrics(args) -> int:
    from cudagym.eval.leaderboard import expected_problems
    from cudagym.eval.metrics import compute_metrics
    from cudagym.tasks import read_rows

    verdicts = read_rows(args.verdicts)
    expected = expected_problems(args.kb_version, args.levels) if (args.levels_given or args.kb_version_given) else None
    metrics = compute_metrics(verdicts, expected=expected, include_degenerate=args.include_degenerate)
    if args.json:
        print(json.dumps(metrics))
    else:
        _print_table([{"scope": k, **m} for k, m in metrics.items()],
                     ["scope", "n", "pass_rate", "faster_than_compile_rate", "faster_than_eager_rate",
                      "geomean_correct_vs_compile", "geomean_all_vs_compile", "geomean_all_vs_eager",
                      "n_degenerate_excluded"], str(args.verdicts))
        left_out = metrics["overall"]["n_degenerate_excluded"]
        if left_out:
            print(f"{left_out} degenerate problem{'s' if left_out != 1 else ''} left out"
                  " (--include-degenerate to count them)")
    return 0


def cmd_leaderboard_show(args) -> int:
    from cudagym.eval.leaderboard import show

    if not Path(args.db).is_file():
        raise UsageError(f"no database at {args.db} (run `cudagym eval run` first, or pass --db)")
    with _open_store(args.db) as store:
        show(store, include_degenerate=args.include_degenerate, compare=args.compare)
    return 0


def cmd_leaderboard_html(args) -> int:
    from cudagym.eval.leaderboard import write_html

    if not Path(args.db).is_file():
        raise UsageError(f"no database at {args.db} (run `cudagym eval run` first, or pass --db)")
    with _open_store(args.db) as store:
        path = write_html(store, args.out, include_degenerate=args.include_degenerate, compare=args.compare)
    print(path)
    return 0


def cmd_kernelbench_list(args) -> int:
    from cudagym.kernelbench import load_problems

    tasks = load_problems(args.kb_version, args.levels)
    _print_table([{"id": t.id, "name": t.name, "sha256": t.sha256[:12]} for t in tasks], ["id", "name", "sha256"],
                 f"KernelBench {args.kb_version}")
    return 0


def _dedup_tasks(path: str):
    """Tasks to check: a directory of *.py files (id = file name) or a JSONL/parquet file of rows with
    code and an id or name column."""
    from cudagym.tasks import Task, read_rows

    source = Path(path)
    if source.is_dir():
        files = sorted(source.glob("*.py"))
        if not files:
            raise UsageError(f"no .py files in {source}")
        return [Task(id=f.name, name=f.stem, code=f.read_text(), source=str(f)) for f in files]
    if not source.is_file():
        raise UsageError(f"no such file or directory: {source}")
    if source.suffix not in (".jsonl", ".json", ".parquet"):
        raise UsageError(f"{source}: expected a directory of .py files, a .jsonl or a .parquet file")
    tasks = []
    for n, row in enumerate(read_rows(source)):
        ident = row.get("id", row.get("name"))
        if not isinstance(row.get("code"), str) or ident is None:
            raise UsageError(f"{source}: row {n} needs a code column and an id or name column")
        tasks.append(Task(id=str(ident), name=str(row.get("name", ident)), code=row["code"],
                          level=row.get("level"), source=str(source)))
    if not tasks:
        raise UsageError(f"{source}: no rows")
    return tasks


def cmd_dedup_score(args) -> int:
    from cudagym.dedup.parity import parity_score
    from cudagym.dedup.strong import strong_score

    codes = []
    for path in (Path(args.a), Path(args.b)):
        if not path.is_file():
            raise UsageError(f"no such file: {path}")
        code = path.read_text()
        try:
            compile(code, str(path), "exec")
        except SyntaxError as e:
            raise UsageError(f"{path}: syntax error at line {e.lineno}: {e.msg}") from None
        codes.append(code)
    result = {"parity": parity_score(*codes), "strong": strong_score(*codes)}
    if args.json:
        print(json.dumps(result))
    else:
        _print_table([result], ["parity", "strong"], f"{args.a} vs {args.b}")
    return 0


def cmd_dedup_check(args) -> int:
    from cudagym.dedup.decontaminate import check_against
    from cudagym.kernelbench import load_problems

    tasks = _dedup_tasks(args.input)
    references = load_problems(args.kb_version, args.levels)
    rows = check_against(tasks, references, parity_threshold=args.parity_threshold,
                         strong_threshold=args.strong_threshold, workers=args.workers)
    if args.json:
        print(json.dumps(rows))
        return 0
    flagged = [r for r in rows if r["flagged"]]
    if flagged:
        _print_table(flagged, ["id", "parity_max", "parity_match", "strong_max", "strong_match"],
                     f"flagged against KernelBench {args.kb_version} levels {','.join(map(str, args.levels))}")
    errors = sum("error" in r for r in rows)
    print(f"{len(flagged)} of {len(rows)} tasks flagged (parity > {args.parity_threshold} or strong >= "
          f"{args.strong_threshold})" + (f"; {errors} did not parse" if errors else ""))
    return 0


def _scale(text: str) -> int | str:
    """--scale: a whole number >= 1, or `search` (each candidate sized to the runtime window)."""
    if text == "search":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"scale must be a whole number >= 1 or 'search', got {text!r}")
    return value


def _k_distribution(text: str) -> dict[int, float]:
    """'1:0.1,2:0.8,3:0.1' or a JSON object -> {1: 0.1, 2: 0.8, 3: 0.1}."""
    try:
        pairs = json.loads(text).items() if text.strip().startswith("{") else (p.split(":") for p in text.split(","))
        return {int(k): float(v) for k, v in pairs}
    except (ValueError, AttributeError):
        raise argparse.ArgumentTypeError(f"K distribution must look like 1:0.1,2:0.8,3:0.1, got {text!r}") from None


def cmd_dataset_build(args) -> int:
    from cudagym.synth.build import BuildConfig

    llm = None
    if args.composer == "llm":
        from cudagym.synth.llm import LLMConfig

        given = dict(model=args.model, base_url=args.base_url, api_key=args.api_key, concurrency=args.concurrency,
                     max_retries=args.max_retries, timeout_s=args.llm_timeout, temperature=args.temperature,
                     max_tokens=args.max_tokens, max_calls=args.max_llm_calls, max_failures=args.llm_max_failures)
        cache = args.llm_cache or str(Path(args.out) / "llm_cache.duckdb")
        llm = LLMConfig(cache_path=None if cache == "none" else cache, **{k: v for k, v in given.items() if v is not None})
    device = args.device or _default_device()
    config = BuildConfig(out=args.out, composer=args.composer, target=args.target, seed=args.seed, device=device,
                         scale=1 if args.scale == "search" else args.scale, scale_search=args.scale == "search",
                         max_scale=args.max_scale, scale_start=args.scale_start, scale_probes=args.scale_probes,
                         transformers=not args.no_transformers, kb_version=args.kb_version,
                         min_eager_ms=args.min_eager_ms, max_eager_ms=args.max_eager_ms, task_timeout_s=args.timeout,
                         parallel=args.parallel or (os.cpu_count() or 1), runner=args.runner, address=args.address,
                         llm=llm, round_size=args.round_size, max_rounds=args.max_rounds,
                         filter_passes=args.filter_passes, filter_stream=args.filter_stream, probes=args.probes,
                         overlap=args.overlap,
                         **({"k_distribution": args.k_distribution} if args.k_distribution else {}),
                         **({"transformers_share": args.transformers_share} if args.transformers_share is not None else {}))
    if args.prefect:
        from cudagym.flows.build_dataset import build_dataset
    else:
        from cudagym.synth.build import build_dataset
    try:
        funnel = build_dataset(config)
    except KeyboardInterrupt:  # before the build's store was open (the crawl): nothing to report yet
        print("cudagym: interrupted (Ctrl-C) before composing; nothing was lost", file=sys.stderr)
        return 130
    _print_table([{"stage": s["stage"], "in": s["in"], "kept": s["kept"],
                   "dropped": ", ".join(f"{k} {v}" for k, v in sorted(s["dropped"].items(), key=lambda kv: -kv[1]))}
                  for s in funnel["stages"]], ["stage", "in", "kept", "dropped"], "dataset funnel")
    print(f"K: {', '.join(f'{k}: {n}' for k, n in funnel['k_distribution'].items())}")
    wrote = [Path(args.out) / "dataset"] if funnel["stages"][-1]["kept"] else []
    print(f"wrote {' and '.join(map(str, wrote + [Path(args.out) / 'funnel.json']))}")
    if funnel.get("note"):
        print(f"cudagym: {funnel['note']}", file=sys.stderr)
    if funnel.get("stopped"):
        return 130 if funnel["stopped"] == "interrupted" else 3
    return 0 if funnel["stages"][-1]["kept"] >= args.target else 2


def cmd_dataset_publish(args) -> int:
    from cudagym.synth.publish import publish

    result = publish(args.dir, args.repo, dry_run=args.dry_run, out=args.out)
    print(f"wrote {result} (README.md, data/train-00000-of-00001.parquet)" if args.dry_run else f"pushed {result}")
    return 0


def cmd_serve(args) -> int:
    from cudagym.flows.serve import DEPLOYMENTS, ServeConfig, parse_assignment, parse_parameter, serve

    names = tuple(n.strip() for n in args.deployments.split(",") if n.strip()) if args.deployments else tuple(DEPLOYMENTS)
    cron = dict(parse_assignment(text, "--cron") for text in args.cron)
    interval = {}
    for text in args.interval:
        name, value = parse_assignment(text, "--interval")
        try:
            interval[name] = float(value)
        except ValueError:
            raise UsageError(f"--interval {name}= takes seconds, got {value!r}") from None
    parameters: dict[str, dict] = {}
    for text in args.param:
        name, key, value = parse_parameter(text)
        parameters.setdefault(name, {})[key] = value
    serve(ServeConfig(names=names, cron=cron, interval_s=interval, parameters=parameters,
                      start_server=args.start_server, port=args.port))
    return 0


# -- agent ------------------------------------------------------------------------------------------
def _rollout_config(args, **overrides):
    from cudagym.agent.rollout import RolloutConfig

    fields = dict(tasks=args.tasks, out=args.out, model=args.model, base_url=args.base_url, api_key=args.api_key,
                  levels=tuple(args.levels) if args.levels_given else None,
                  ids=",".join(map(str, sorted(args.ids))) if args.ids else None, kb_version=args.kb_version,
                  n_samples=args.n_samples, parallel=args.parallel, max_turns=args.max_turns,
                  device=args.device or _default_device(), temperature=args.temperature, top_p=args.top_p,
                  max_tokens=args.max_tokens, context_tokens=args.context_tokens, wall_s=args.wall_time,
                  max_invalid_calls=args.max_invalid_calls, tool_format=args.tool_format,
                  client_timeout_s=args.client_timeout, max_retries=args.max_retries, policy=args.policy,
                  timing_mode=args.timing_mode, precision=args.precision, bash_timeout_s=args.bash_timeout,
                  judge_timeout_s=args.judge_timeout, replay=args.replay)
    fields.update(overrides)
    if fields["max_turns"] is None:
        fields["max_turns"] = 150
    if fields["device"].startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--device cuda but no CUDA device is visible (use --device cpu)")
    return RolloutConfig(**fields)


def _print_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def cmd_agent_rollout(args) -> int:
    from cudagym.agent.rollout import run_rollouts

    summary = run_rollouts(_rollout_config(args), progress=_print_progress)
    print(json.dumps(summary) if args.json else
          f"{summary['finished']}/{summary['rollouts']} rollouts finished ({summary['failed']} failed), rewards "
          f"{summary['rewards']}, mean {_fmt(summary['mean_reward'])}; {summary['n_submitted']} problems in "
          f"{summary['submission']}; trajectories in {summary['db']}")
    return 0


def cmd_agent_eval(args) -> int:
    from cudagym.agent.rollout import run_agent_eval

    overrides = {"max_turns": args.max_turns or 200}
    if args.tasks == "kernelbench" and not args.levels_given:
        overrides["levels"] = (1, 2, 3)
    summary = run_agent_eval(_rollout_config(args, **overrides), progress=_print_progress)
    if args.json:
        print(json.dumps(summary))
        return 0
    _print_table([{"scope": k, **m} for k, m in summary["metrics"].items()],
                 ["scope", "n", "pass_rate", "faster_than_compile_rate", "faster_than_eager_rate",
                  "geomean_all_vs_compile", "geomean_all_vs_eager"], f"agent {args.model} (best of {args.n_samples})")
    print(f"trajectories: {summary['db']}; submission: {summary['submission']}")
    return 0


def cmd_agent_show(args) -> int:
    from cudagym.agent.rollout import DB_NAME
    from cudagym.agent.store import TrajectoryStore

    path = Path(args.run)
    db = path / DB_NAME if path.is_dir() else path
    if not db.is_file():
        raise UsageError(f"no trajectory store at {db} (pass a `cudagym agent rollout --out` folder)")
    with TrajectoryStore(db, read_only=True) as store:
        if not args.rollout:
            rows = store.rollouts()
            if args.json:
                print(json.dumps(rows, default=str))
                return 0
            columns = ["rollout_id", "level", "problem_id", "sample", "status", "stop_reason", "turns", "reward",
                       "tokens", "wall_s"]
            cells = [columns] + [[_fmt({**r, "tokens": (r["prompt_tokens"] or 0) + (r["completion_tokens"] or 0)}[c])
                                  for c in columns] for r in rows]
            widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
            print(f"{db}: {len(rows)} rollouts")
            for row in cells:  # plain text: rollout ids are never cut (they are what --rollout takes)
                print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
            return 0
        row = store.rollout(args.rollout)
        if row is None:
            raise UsageError(f"no rollout {args.rollout!r} in {db}")
        messages, calls, turns = store.messages(args.rollout), store.tool_calls(args.rollout), store.turns(args.rollout)
    if args.json:
        print(json.dumps({"rollout": row, "messages": messages, "tool_calls": calls, "turns": turns}, default=str))
        return 0
    limit = None if args.full else 600
    print(f"rollout {row['rollout_id']}  task {row['task_id']}  model {row['model']}  status {row['status']}  "
          f"stop {row['stop_reason']}  turns {row['turns']}  reward {row['reward']}")
    results = {c["call_id"]: c for c in calls}
    for m in messages:
        text = (m["content"] or "").strip()
        print(f"--- [{m['turn']}] {m['role']}" + (f" ({m['tool_call_id']})" if m["tool_call_id"] else ""))
        if text:
            print(text if limit is None or len(text) <= limit else text[:limit] + f" ... [{len(text) - limit} more chars]")
        for tc in m["tool_calls"] or ():
            call = results.get(tc["id"]) or {}
            print(f"  -> {tc['function']['name']}({tc['function']['arguments'][:200]})"
                  + ("" if call.get("valid", True) else "  [invalid]"))
    verdict = row.get("verdict") or {}
    print(f"--- final verdict: {verdict.get('status')} reward {verdict.get('reward')}"
          + (f": {verdict['reason']}" if verdict.get("reason") else ""))
    return 0


def _add_agent_commands(sub) -> None:
    ag = sub.add_parser("agent", help="LLM agents writing kernels: rollouts, eval, trajectories (docs/agent.md)"
                        ).add_subparsers(dest="sub", required=True, parser_class=_Parser)
    for name, help_text in (("rollout", "rollouts of a model on a task set (resumable; trajectories + submission)"),
                            ("eval", "rollouts on KernelBench L1-3 (200 turns) and the leaderboard's metrics")):
        p = ag.add_parser(name, help=help_text)
        p.add_argument("--tasks", default="kernelbench", help="kernelbench (default) or a task set: JSONL, parquet or folder")
        p.add_argument("--model", required=True, help="model name at the endpoint; scripted:POLICY runs a scripted"
                                                      " policy on an in-process server (no --base-url)")
        p.add_argument("--base-url", default=None, help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
        p.add_argument("--api-key", default=None, help="API key (default $OPENAI_API_KEY; local servers need none)")
        p.add_argument("--replay", default=None, help="with --model scripted:replay: a submission folder whose kernels "
                                                      "the scripted expert writes, verifies and profiles")
        p.add_argument("--levels", type=_levels, default=None, help="comma-separated levels (default 1,2,3)")
        p.add_argument("--kb-version", default=None, help="KernelBench version (default v0.1)")
        p.add_argument("--ids", type=_ids, default=None, help="only these problem ids, e.g. 1-10,12")
        p.add_argument("--n-samples", type=int, default=1, help="rollouts per task (default 1)")
        p.add_argument("--parallel", type=int, default=4, help="rollouts at once (default 4)")
        p.add_argument("--max-turns", type=int, default=None,
                       help=f"model queries per rollout (default {150 if name == 'rollout' else 200})")
        p.add_argument("--device", default=None, help="where the judge runs: cuda, cuda:N or cpu (default: cuda if visible)")
        p.add_argument("--out", default=f"out/agent-{name}", help="folder: trajectories.duckdb, submission/, workdirs/")
        p.add_argument("--temperature", type=float, default=0.7)
        p.add_argument("--top-p", type=float, default=None)
        p.add_argument("--max-tokens", type=int, default=4096, help="completion tokens per turn (default 4096)")
        p.add_argument("--context-tokens", type=int, default=32_768, help="context budget of a rollout (default 32768)")
        p.add_argument("--wall-time", type=float, default=3600.0, help="seconds per rollout's loop (default 3600)")
        p.add_argument("--max-invalid-calls", type=int, default=5, help="stop after this many invalid tool calls in a row")
        p.add_argument("--tool-format", choices=("auto", "native", "text"), default="auto",
                       help="native tool_calls, <tool_call> text, or auto (native, text when the reply has tags)")
        p.add_argument("--client-timeout", type=float, default=600.0, help="seconds per request (default 600)")
        p.add_argument("--max-retries", type=int, default=4, help="retries on 429 / 5xx / timeouts (default 4)")
        p.add_argument("--policy", default="strict", help="op policy of the judge: strict (default) or permissive")
        p.add_argument("--timing-mode", default="strict", help="strict (default), paper or kernelbench")
        p.add_argument("--precision", default="strict", help="strict (default) or kernelbench")
        p.add_argument("--bash-timeout", type=float, default=180.0, help="upper bound of one bash call (default 180 s)")
        p.add_argument("--judge-timeout", type=float, default=None, help="bound on one verify/profile/final judge call")
        p.add_argument("--json", action="store_true", help="print the summary as JSON")
        p.set_defaults(func=cmd_agent_rollout if name == "rollout" else cmd_agent_eval)
    show = ag.add_parser("show", help="a run's rollouts (turns, reward, status), or one trajectory")
    show.add_argument("run", help="a rollout --out folder (or its trajectories.duckdb)")
    show.add_argument("--rollout", default=None, help="one rollout id: its messages and tool calls")
    show.add_argument("--full", action="store_true", help="with --rollout: messages in full (default: 600 chars)")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=cmd_agent_show)


def _trajectory_store(run: str) -> Path:
    """The store of a `cudagym agent rollout --out` folder, or the file itself."""
    from cudagym.agent.rollout import DB_NAME

    db = Path(run) / DB_NAME if Path(run).is_dir() else Path(run)
    if not db.is_file():
        raise UsageError(f"no trajectory store at {db} (pass a `cudagym agent rollout --out` folder)")
    return db


def _train_device(args) -> str:
    """Where the model trains (and, in PPO, generates): checked here, so a missing GPU is one line."""
    device = args.train_device
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise UsageError(f"--train-device {device}: no CUDA GPU is visible")
    elif device != "cpu":
        raise UsageError(f"--train-device {device}: cpu, cuda or cuda:N")
    return device


def _add_train_device(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--train-device", default="cpu", help=f"{what}: cpu (default), cuda or cuda:N")


def cmd_train_rft(args) -> int:
    from cudagym.train.rft import RFTConfig, RFTSelect, write_dataset
    from cudagym.train.trajectories import load_trajectories

    db = _trajectory_store(args.run)
    config = RFTConfig(min_reward=args.min_reward, max_identical_calls_in_a_row=args.max_identical_calls)
    if args.model:  # selection + fine-tuning; a rerun resumes (the dataset is kept, a finished stage is not redone)
        from cudagym.train.sft import SFTConfig, rft_stage

        if not (Path(args.model) / "config.json").is_file():
            raise UsageError(f"--model {args.model} is not a transformers checkpoint folder (no config.json)")
        sft = SFTConfig(lr=args.lr, epochs=args.epochs, batch_size=args.batch_size, device=_train_device(args))

        def on_step(row: dict) -> None:
            print(f"step {row['step']} (epoch {row['epoch']}): loss {_fmt(row['loss'])}", file=sys.stderr, flush=True)

        summary = rft_stage(db, args.model, args.out, config, sft, on_step=on_step)
        print(f"fine-tuned on {summary['samples']} rollouts ({summary['model_tokens']} model tokens) in "
              f"{summary['steps']} steps: loss {_fmt(summary['first_loss'])} -> {_fmt(summary['last_loss'])}; "
              f"checkpoint in {summary['checkpoint']}, metrics in {summary['metrics']}")
        return 0
    if Path(args.out).exists():
        raise UsageError(f"{args.out} already exists; remove it or pass another --out")
    step = RFTSelect(config)
    kept = list(step.run(load_trajectories(db)))
    write_dataset(kept, args.out, step.stats, config)
    drops = ", ".join(f"{k.removeprefix('dropped_')} {v}" for k, v in sorted(step.stats.items()) if k.startswith("dropped_"))
    print(f"kept {step.stats['kept']} of {step.stats['in']} finished rollouts (dropped: {drops or 'none'}); "
          f"dataset and card in {args.out}")
    return 0


def cmd_train_value(args) -> int:
    from cudagym.train.ppo import PPOConfig
    from cudagym.train.value import ValuePretrainConfig, value_stage

    db = _trajectory_store(args.run)
    if not (Path(args.model) / "config.json").is_file():
        raise UsageError(f"--model {args.model} is not a transformers checkpoint folder (no config.json)")
    ppo = PPOConfig(critic_lr=args.lr, lam=args.lam, batch_size=args.mini_batch, mini_batch_size=args.mini_batch,
                    micro_batch_size=args.micro_batch)
    config = ValuePretrainConfig(max_steps=args.max_steps, patience=args.patience, min_delta=args.min_delta)

    def on_step(row: dict) -> None:
        print(f"step {row['step']}: explained variance {_fmt(row['explained_variance'])}, value loss {_fmt(row['vf_loss'])}",
              file=sys.stderr, flush=True)

    summary = value_stage(db, args.model, args.out, ppo, config, on_step=on_step, device=_train_device(args))
    print(json.dumps(summary) if args.json else
          f"critic pretrained on {summary['rollouts']} rollouts in {summary['steps']} steps ({summary['stopped']}): "
          f"explained variance {_fmt(summary['explained_variance'])} (best {_fmt(summary['best_explained_variance'])}); "
          f"critic in {summary['critic']}, curve in {summary['curve']}")
    return 0


def cmd_train_ppo(args) -> int:
    if args.engine == "verl":
        # The verl agent loop exists (cudagym.train.verl_loop, run by verl's own trainer); a launcher that
        # writes verl's config from PPOConfig and starts it does not, and nothing has run on a GPU with it.
        print("cudagym: error: --engine verl: no verl launcher yet (issue 14): run verl's trainer with "
              "actor_rollout_ref.rollout.agent.default_agent_loop=cudagym_agent (docs/train.md), or use --engine local",
              file=sys.stderr)
        return 2
    from cudagym.train.ppo import PPOConfig
    from cudagym.train.ppo_engine import LocalPPOConfig, run_ppo

    ppo = PPOConfig(actor_lr=args.actor_lr, critic_lr=args.critic_lr)
    config = LocalPPOConfig(tasks=args.tasks, model=args.model, out=args.out, critic=args.critic, steps=args.steps,
                            rollouts_per_step=args.rollouts_per_step, levels=tuple(args.level) if args.level else None,
                            ids=args.ids, max_turns=args.max_turns, max_new_tokens=args.max_new_tokens,
                            device=args.device, policy_device=_train_device(args), ppo=ppo)
    rows = run_ppo(config, progress=lambda line: print(line, file=sys.stderr, flush=True))
    last = rows[-1]
    print(f"{len(rows)} PPO steps in {args.out}: last reward {_fmt(last['reward'])}, pass rate {_fmt(last['pass_rate'])}; "
          f"checkpoints in {args.out}/checkpoints, metrics in {args.out}/metrics.jsonl")
    return 0


def _add_train_commands(sub) -> None:
    tr = sub.add_parser("train", help="training on agent trajectories (docs/train.md)"
                        ).add_subparsers(dest="sub", required=True, parser_class=_Parser)
    rft = tr.add_parser("rft", help="select rollouts for rejection fine-tuning; write them as a datasets folder + card")
    rft.add_argument("run", help="a `cudagym agent rollout --out` folder (or its trajectories.duckdb)")
    rft.add_argument("--out", required=True, help="new folder for the dataset (parquet + README.md)")
    rft.add_argument("--min-reward", type=float, default=1.0,
                     help="keep rollouts with a reward above this (default 1: faster than eager or compile)")
    rft.add_argument("--max-identical-calls", type=int, default=1,
                     help="identical tool calls allowed in a row before a rollout counts as stuck (default 1)")
    rft.add_argument("--model", help="also fine-tune this transformers checkpoint on the kept set (loss on model tokens"
                     " only); OUT/checkpoint, OUT/sft_metrics.jsonl; a rerun resumes")
    rft.add_argument("--lr", type=float, default=1e-5, help="fine-tuning learning rate (default 1e-5)")
    rft.add_argument("--epochs", type=int, default=2, help="fine-tuning epochs (default 2)")
    rft.add_argument("--batch-size", type=int, default=8, help="rollouts per optimizer step (default 8)")
    _add_train_device(rft, "where the model trains")
    rft.set_defaults(func=cmd_train_rft)
    val = tr.add_parser("value", help="value pretraining: a critic for --model fitted to the GAE returns of a run's rollouts")
    val.add_argument("run", help="a `cudagym agent rollout --out` folder (or its trajectories.duckdb)")
    val.add_argument("--model", required=True, help="transformers checkpoint folder of the actor (with its tokenizer)")
    val.add_argument("--out", required=True, help="folder for critic/ and value_curve.json")
    val.add_argument("--lr", type=float, default=6e-6, help="critic learning rate (default 6e-6, the paper's)")
    val.add_argument("--lam", type=float, default=0.95,
                     help="GAE lambda of the targets (default 0.95, the paper's; 1: Monte Carlo returns)")
    val.add_argument("--max-steps", type=int, default=200, help="epochs over the rollouts at most (default 200)")
    val.add_argument("--patience", type=int, default=5, help="stop after this many steps without a gain (default 5)")
    val.add_argument("--min-delta", type=float, default=0.01, help="explained-variance gain that counts (default 0.01)")
    val.add_argument("--mini-batch", type=int, default=256, help="rollouts per optimizer step (default 256)")
    val.add_argument("--micro-batch", type=int, default=1, help="rollouts per forward pass (default 1)")
    val.add_argument("--json", action="store_true", help="print the summary as JSON")
    _add_train_device(val, "where the model trains")
    val.set_defaults(func=cmd_train_value)
    ppo = tr.add_parser("ppo", help="multi-turn PPO on the agent environment, the policy served by the trainer itself")
    ppo.add_argument("--engine", choices=("local", "verl"), default="local", help="local (one machine) or verl (no launcher yet: docs/train.md)")
    ppo.add_argument("--tasks", default="kernelbench", help="kernelbench or a task-set path")
    ppo.add_argument("--model", required=True, help="transformers checkpoint folder of the actor (e.g. the RFT checkpoint)")
    ppo.add_argument("--critic", help="a pretrained critic folder (`train value` OUT/critic); default: a fresh one")
    ppo.add_argument("--out", required=True, help="folder for rollouts/, checkpoints/, metrics.jsonl; a rerun resumes")
    ppo.add_argument("--steps", type=int, default=1, help="PPO steps in all (default 1)")
    ppo.add_argument("--rollouts-per-step", type=int, default=1, help="rollouts per task per step (default 1)")
    ppo.add_argument("--level", type=int, action="append", help="task level (repeatable)")
    ppo.add_argument("--ids", help="problem ids, e.g. 1-10,12")
    ppo.add_argument("--max-turns", type=int, default=150, help="turns per rollout (default 150, the paper's)")
    ppo.add_argument("--max-new-tokens", type=int, default=4096, help="tokens per model turn (default 4096)")
    ppo.add_argument("--device", default="cpu", help="where the judge runs (default cpu)")
    ppo.add_argument("--actor-lr", type=float, default=3e-6, help="default 3e-6, the paper's")
    ppo.add_argument("--critic-lr", type=float, default=6e-6, help="default 6e-6, the paper's")
    _add_train_device(ppo, "where the model trains and generates")
    ppo.set_defaults(func=cmd_train_ppo)


# -- parser -----------------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 1 (argparse's default is usage text and exit 2)
        raise UsageError(f"{self.prog}: {message}")


def _add_selection(p: argparse.ArgumentParser, problems: bool = True) -> None:
    p.add_argument("--levels", type=_levels, default=None, help="comma-separated levels (default 1,2,3)")
    p.add_argument("--kb-version", default=None, help="KernelBench version: v0, v0.1 (default), latest")
    p.add_argument("--ids", type=_ids, default=None, help="only these problem ids, e.g. 1-10,12")
    if problems:
        p.add_argument("--problems", help="a task set (JSONL or parquet with level, problem_id, name, code) instead of KernelBench")


def _add_eval_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda if visible)")
    p.add_argument("--policy", default="strict", help="op policy: strict (default) or permissive")
    p.add_argument("--timing-mode", default="strict",
                   help="strict (default); paper: CUDA Agent's profiler sum; kernelbench: KernelBench's per-call event window")
    p.add_argument("--precision", default="strict",
                   help="strict: fp32 with TF32 off for every party (default); kernelbench: torch's defaults"
                        " (cuDNN TF32 on), as KernelBench runs; recorded in verdicts and cache keys")
    p.add_argument("--n-checks", type=int, default=5, help="fresh input sets per correctness check (default 5)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds a single candidate call may take")
    p.add_argument("--tolerance", choices=("paper", "strict"), default="paper",
                   help="paper: atol = rtol = 1e-2 (CUDA Agent parity, default); strict: 1e-4")


def _add_parallel(p: argparse.ArgumentParser) -> None:
    p.add_argument("--parallel", type=int, default=None,
                   help="judges at once, per GPU with --runner ray (default: one per core on a GPU, where timing"
                        " stays exclusive; 1 on CPU)")
    p.add_argument("--runner", choices=("local", "ray"), default="local",
                   help="local: judges on this machine (default); ray: one worker per GPU of a Ray cluster")
    p.add_argument("--address", default=None,
                   help="with --runner ray: the cluster to join (auto, host:port, ray://...; default: start a local"
                        " one); pass --device cuda if this machine has no GPU")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="cudagym", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    ev = sub.add_parser("eval", help="evaluate candidates").add_subparsers(dest="sub", required=True, parser_class=_Parser)
    one = ev.add_parser("one", help="one candidate against one reference; prints a verdict")
    one.add_argument("--ref", required=True)
    one.add_argument("--candidate", required=True)
    one.add_argument("--json", action="store_true")
    _add_eval_options(one)
    one.set_defaults(func=cmd_eval_one)
    run = ev.add_parser("run", help="a submission directory over KernelBench or a task set (resumable)")
    run.add_argument("submission_dir")
    run.add_argument("--db", default=DEFAULT_DB)
    run.add_argument("--name")
    run.add_argument("--json", action="store_true", help="print the verdicts as JSONL")
    _add_parallel(run)
    _add_selection(run)
    _add_eval_options(run)
    run.set_defaults(func=cmd_eval_run)

    bl = sub.add_parser("baseline", help="eager and torch.compile baselines").add_subparsers(dest="sub", required=True,
                                                                                             parser_class=_Parser)
    blr = bl.add_parser("run", help="time and cache the baselines",
                        description="Time eager and torch.compile for every selected problem not cached yet. Timing"
                                    " starts with the first compiled problem while the others compile; each"
                                    " baseline is stored as soon as it is timed, so a stopped run keeps them and a"
                                    " rerun times only the rest. Progress on stderr: problems compiled, timed,"
                                    " stored and an ETA.")
    blr.add_argument("--db", default=DEFAULT_DB)
    blr.add_argument("--json", action="store_true")
    _add_parallel(blr)
    _add_selection(blr)
    _add_eval_options(blr)
    blr.set_defaults(func=cmd_baseline_run)
    blc = bl.add_parser("cache", help="carry the torch.compile cache to another machine").add_subparsers(
        dest="cache", required=True, parser_class=_Parser)
    bce = blc.add_parser("export", help="bundle what baseline runs compiled here into FILE",
                         description="Bundle the torch.compile artifacts baseline judges saved here (this torch"
                                     " version) into FILE, for `cudagym baseline cache import` on a new machine"
                                     " of the same GPU, torch and CUDA.")
    bce.add_argument("file")
    bce.set_defaults(func=cmd_baseline_cache_export)
    bci = blc.add_parser("import", help="load a bundle from `baseline cache export` into this machine's caches",
                         description="Load FILE into the inductor and Triton caches the judges use, so the next"
                                     " `cudagym baseline run` finds its compiles there.")
    bci.add_argument("file")
    bci.set_defaults(func=cmd_baseline_cache_import)

    au = sub.add_parser("audit", help="degenerate-answer probes").add_subparsers(dest="sub", required=True, parser_class=_Parser)
    auk = au.add_parser("kernelbench", help="which problems accept zeros / constant / passthrough / ...")
    auk.add_argument("--json", action="store_true")
    auk.add_argument("--db", default=DEFAULT_DB, help="stores every audit row and reuses stored ones (default %(default)s)")
    _add_parallel(auk)
    _add_selection(auk)
    _add_eval_options(auk)
    auk.set_defaults(func=cmd_audit)

    lb = sub.add_parser("leaderboard", help="metrics and tables").add_subparsers(dest="sub", required=True, parser_class=_Parser)
    met = lb.add_parser("metrics", help="metrics of a verdict JSONL file")
    met.add_argument("verdicts")
    met.add_argument("--json", action="store_true")
    _add_selection(met, problems=False)
    degenerate_help = "count problems whose check cannot tell a real kernel from a trivial one (left out by default)"
    compare_help = "two entries side by side, A,B: each NAME, NAME@MODE or NAME@MODE@PRECISION"
    met.add_argument("--include-degenerate", action="store_true", help=degenerate_help)
    met.set_defaults(func=cmd_leaderboard_metrics)
    show = lb.add_parser("show", help="terminal table of every submission in the store")
    show.add_argument("--db", default=DEFAULT_DB)
    show.add_argument("--include-degenerate", action="store_true", help=degenerate_help)
    show.add_argument("--compare", metavar="A,B", help=compare_help)
    show.set_defaults(func=cmd_leaderboard_show)
    html = lb.add_parser("html", help="static page: per-level and per-problem tables, comparisons, speedup plots")
    html.add_argument("--out", required=True)
    html.add_argument("--db", default=DEFAULT_DB)
    html.add_argument("--include-degenerate", action="store_true", help=degenerate_help)
    html.add_argument("--compare", metavar="A,B", help=compare_help + " (strict vs paper of one submission: automatic)")
    html.set_defaults(func=cmd_leaderboard_html)

    kb = sub.add_parser("kernelbench", help="the KernelBench problem source").add_subparsers(dest="sub", required=True,
                                                                                             parser_class=_Parser)
    kbl = kb.add_parser("list", help="list problems")
    _add_selection(kbl, problems=False)
    kbl.set_defaults(func=cmd_kernelbench_list)

    dd = sub.add_parser("dedup", help="contamination and similarity scores").add_subparsers(dest="sub", required=True,
                                                                                           parser_class=_Parser)
    dds = dd.add_parser("score", help="parity and strong similarity of two sources")
    dds.add_argument("a")
    dds.add_argument("b")
    dds.add_argument("--json", action="store_true")
    dds.set_defaults(func=cmd_dedup_score)
    ddc = dd.add_parser("check", help="score tasks against KernelBench; flag (near-)copies")
    ddc.add_argument("input", help="a directory of .py files, or a JSONL/parquet file with code and id or name")
    ddc.add_argument("--against", default="kernelbench", choices=["kernelbench"], help="reference problems")
    ddc.add_argument("--levels", type=_levels, default=None, help="comma-separated levels (default 1,2,3)")
    ddc.add_argument("--kb-version", default=None, help="KernelBench version: v0, v0.1 (default), latest")
    ddc.add_argument("--parity-threshold", type=float, default=0.9, help="flag when parity > this (default 0.9)")
    ddc.add_argument("--strong-threshold", type=float, default=0.9, help="flag when strong >= this (default 0.9)")
    ddc.add_argument("--workers", type=int, default=None, help="processes (default: one per CPU for large inputs)")
    ddc.add_argument("--json", action="store_true", help="print every task's row as a JSON list")
    ddc.set_defaults(func=cmd_dedup_check)

    ds = sub.add_parser("dataset", help="build and publish the fused-operator task set").add_subparsers(
        dest="sub", required=True, parser_class=_Parser)
    dsb = ds.add_parser("build", help="crawl, compose, dedup, decontaminate, filter, label, publish (resumable)")
    dsb.add_argument("--out", default="out/build", help="build folder: build.duckdb, dataset/, funnel.json")
    dsb.add_argument("--composer", choices=("programmatic", "llm"), default="programmatic")
    dsb.add_argument("--target", type=int, default=200, help="rows to publish (default 200)")
    dsb.add_argument("--seed", type=int, default=0)
    dsb.add_argument("--device", default=None, help="where the filter runs: cuda or cpu (default: cuda if visible)")
    dsb.add_argument("--scale", type=_scale, default=1,
                     help="multiply composed tasks' dims (GPU-sized tasks: 8-32), or 'search': size each "
                          "programmatic candidate to the runtime window (its scale searched with the filter's timing)")
    dsb.add_argument("--max-scale", type=int, default=128, help="--scale search: the largest scale tried (default 128)")
    dsb.add_argument("--scale-start", type=int, default=16, help="--scale search: the first scale timed (default 16)")
    dsb.add_argument("--scale-probes", type=int, default=3,
                     help="--scale search: eager timings per candidate at most (default 3)")
    dsb.add_argument("--k-distribution", type=_k_distribution, default=None,
                     help="weights of K composed ops, e.g. 1:0.1,2:0.8,3:0.1 (default: the paper's)")
    dsb.add_argument("--min-eager-ms", type=float, default=None, help="runtime window (default 1 ms on GPU, 0.01 on CPU)")
    dsb.add_argument("--max-eager-ms", type=float, default=None, help="runtime window (default 100 ms on GPU, 1000 on CPU)")
    dsb.add_argument("--timeout", type=float, default=300.0, help="seconds one task's filter run may take")
    dsb.add_argument("--kb-version", default="v0.1", help="KernelBench version to decontaminate against")
    dsb.add_argument("--no-transformers", action="store_true", help="torch seeds only")
    dsb.add_argument("--transformers-share", type=float, default=None,
                     help="share of seed draws on transformers seeds (default 0.005: ~1-2%% of tasks, the paper's 1.2%%)")
    dsb.add_argument("--filter-passes", type=int, choices=[1, 2], default=None,
                     help="the GPU filter in 2 passes (check all, then time the survivors; the default on a GPU) "
                          "or 1 (each judge checks, compiles and times)")
    dsb.add_argument("--filter-stream", action=argparse.BooleanOptionalAction, default=None,
                     help="the filter's two passes streamed to one set of long-lived judges: each candidate that "
                          "passes its checks is timed at once (the default with the local runner); "
                          "--no-filter-stream: a pass of judges checks every candidate, then another times them")
    dsb.add_argument("--probes", choices=["streamed", "waves"], default="streamed",
                     help="with --scale search: each probe sent to one set of long-lived judges as its search asks "
                          "(streamed, the default) or in waves of new judges, one per step of the searches (waves)")
    dsb.add_argument("--round-size", type=int, default=None,
                     help="candidates a round composes and filters at most (default: all the target still needs); "
                          "small rounds publish rows sooner and bound what a stop loses (raise --max-rounds with it)")
    dsb.add_argument("--max-rounds", type=int, default=6, help="compose/filter rounds at most (default 6)")
    dsb.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=None,
                     help="compose the next round while this one filters (default: on a GPU)")
    dsb.add_argument("--prefect", action="store_true", help="run as the Prefect flow build_dataset")
    llm = dsb.add_argument_group("llm composer (OpenAI-compatible endpoint)")
    llm.add_argument("--model", help="model name (env CUDAGYM_LLM_MODEL)")
    llm.add_argument("--base-url", help="endpoint, e.g. http://127.0.0.1:8000/v1 (env CUDAGYM_LLM_BASE_URL / OPENAI_BASE_URL)")
    llm.add_argument("--api-key", help="API key (prefer env CUDAGYM_LLM_API_KEY / OPENAI_API_KEY)")
    llm.add_argument("--concurrency", type=int,
                     help="requests in flight (default 1, for a local one-request-at-a-time server; hosted APIs: 8)")
    llm.add_argument("--max-retries", type=int, help="retries on 429 / connection errors / 5xx (default 4)")
    llm.add_argument("--llm-timeout", type=float,
                     help="seconds per request, never retried on timeout (default 300; a slow local model needs more)")
    llm.add_argument("--max-llm-calls", type=int, help="stop the build after this many HTTP requests (default: no cap)")
    llm.add_argument("--llm-max-failures", type=int,
                     help="stop the build after this many attempts in a row get no answer (default 6)")
    llm.add_argument("--temperature", type=float, help="sampling temperature (default 0.7)")
    llm.add_argument("--max-tokens", type=int, help="completion token limit (default 2048)")
    llm.add_argument("--llm-cache", help="DuckDB cache of answers (default OUT/llm_cache.duckdb; 'none' disables)")
    _add_parallel(dsb)
    dsb.set_defaults(func=cmd_dataset_build)
    dsp = ds.add_parser("publish", help="publish a build to the Hugging Face Hub")
    dsp.add_argument("dir", help="a `cudagym dataset build` output folder")
    dsp.add_argument("--repo", required=True, help="OWNER/NAME of the Hub dataset repo")
    dsp.add_argument("--dry-run", action="store_true", help="write the folder that would be uploaded (DIR/hub) and stop")
    dsp.add_argument("--out", default=None, help="with --dry-run: where to write that folder (default DIR/hub)")
    dsp.set_defaults(func=cmd_dataset_publish)
    sv = sub.add_parser("serve", help="register and serve the Prefect deployments (docs/flows.md)")
    sv.add_argument("--deployments", metavar="NAME,...",
                    help="which (default all): build_dataset, refresh_leaderboard, audit, agent_rollouts, train")
    sv.add_argument("--cron", action="append", default=[], metavar="NAME=EXPR", help="schedule NAME by cron (repeatable)")
    sv.add_argument("--interval", action="append", default=[], metavar="NAME=SECONDS",
                    help="schedule NAME every SECONDS instead (repeatable)")
    sv.add_argument("--param", action="append", default=[], metavar="NAME.KEY=VALUE",
                    help="default parameter of a deployment, VALUE as JSON or a string (repeatable)")
    sv.add_argument("--start-server", action="store_true", help="start a local Prefect server on 127.0.0.1 first")
    sv.add_argument("--port", type=int, default=4200, help="with --start-server: its port (default 4200)")
    sv.set_defaults(func=cmd_serve)
    _add_agent_commands(sub)
    _add_train_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    import duckdb

    from cudagym.eval.gpulock import lock_policy
    from cudagym.tasks import TaskError
    from cudagym.tasks.db import interrupted

    try:
        args = build_parser().parse_args(argv)
        lock_policy()  # a bad CUDAGYM_GPU_LOCK_POLICY is one line here, not a crash in every judge
        args.levels_given = getattr(args, "levels", None) is not None
        args.kb_version_given = getattr(args, "kb_version", None) is not None
        if hasattr(args, "levels") and args.levels is None:
            args.levels = [1, 2, 3]
        if hasattr(args, "kb_version") and args.kb_version is None:
            args.kb_version = "v0.1"
        return args.func(args)
    except (UsageError, TaskError, ValueError, OSError) as e:
        print(f"cudagym: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, RuntimeError, duckdb.Error) as e:
        if not interrupted(e):  # Ctrl-C, also when DuckDB took it mid-statement (tasks.db.interrupted)
            raise
        where = f"; {e}" if isinstance(e, KeyboardInterrupt) and str(e) else ""  # an eval one's judge says where it was (evaluate.judge_phase)
        print(f"cudagym: interrupted{where} (results stored so far are kept; re-run to resume)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
