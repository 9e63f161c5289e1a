"""The dataset build as a Prefect flow: the stages of `cudagym.synth.build`, one Prefect task each.

The flow only sequences calls; every stage is the plain function the CLI runs too, and every
stage's result lives in the build's DuckDB file, so a failed or cancelled flow run resumes where it
stopped when it is run again. Tasks pass paths and small summaries, never task lists.

    cudagym dataset build --out DIR --prefect     # or: python -m cudagym.flows.build_dataset
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger
from prefect import task as ptask
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.tasks import exponential_backoff

from cudagym.flows import artifacts
from cudagym.flows.devices import device_slot
from cudagym.synth import build
from cudagym.synth.build import BuildConfig, BuildStore
from cudagym.synth.compose import ComposeStopped

# No task result caching: every stage reads the build's store, which changes between calls.


def _store(config: BuildConfig) -> BuildStore:
    return BuildStore(Path(config.out) / "build.duckdb")


@ptask(cache_policy=NO_CACHE, name="crawl")
def crawl(config: BuildConfig) -> dict:
    return build.crawl_stage(config)[1]


def _retry_unless_stopped(task, task_run, state) -> bool:
    """A composer that stopped the build (endpoint down, --max-llm-calls spent) is not retried: a retry
    would spend the call cap again, or wait out a dead endpoint twice more."""
    try:
        state.result()
    except ComposeStopped:
        return False
    except Exception:  # noqa: BLE001 - anything else may be passing
        return True
    return True


# LLM endpoints drop connections and rate-limit: a failed compose is retried with backoff (what it
# stored before failing stays; the retry composes what is still missing).
@ptask(cache_policy=NO_CACHE, name="compose", retries=2, retry_delay_seconds=exponential_backoff(backoff_factor=30),
       retry_jitter_factor=0.5, retry_condition_fn=_retry_unless_stopped)
def compose(config: BuildConfig, n_tasks: int) -> int:
    seeds, _ = build.crawl_stage(config)  # cached per process: the seed list never leaves this task
    with _store(config) as store:
        return build.compose_stage(store, seeds, config, build.next_round(store), n_tasks)


@ptask(cache_policy=NO_CACHE, name="dedup, decontaminate, filter, label")
def select(config: BuildConfig, filter_more: int) -> tuple[int, list[dict]]:
    with _store(config) as store:
        labelled, stages = build.select(store, config, filter_more)
        return len(labelled), stages


@ptask(cache_policy=NO_CACHE, name="filter batch")
def filter_batch(config: BuildConfig, missing: int) -> int:
    with _store(config) as store:
        return build.filter_batch(store, config, missing)


@ptask(cache_policy=NO_CACHE, name="publish")
def publish(config: BuildConfig, crawl_entry: dict, stopped: tuple[str, str] | None = None) -> dict:
    with _store(config) as store:
        labelled, stages = build.select(store, config)
        return build.publish_stage(config, build.dataset_rows(store, labelled), [crawl_entry] + stages, stopped)


@ptask(cache_policy=NO_CACHE, name="push to the Hub", retries=3,
       retry_delay_seconds=exponential_backoff(backoff_factor=60), retry_jitter_factor=0.5)
def push_to_hub(config: BuildConfig, repo: str) -> str:
    from cudagym.synth.publish import publish as publish_build

    return str(publish_build(config.out, repo, dry_run=False))


@flow(name="build_dataset", log_prints=True)
def build_dataset(config: BuildConfig, hub_repo: str | None = None) -> dict:
    """`cudagym.synth.build.build_dataset`, stage by stage, with the funnel as flow artifacts; then,
    with `hub_repo` (OWNER/NAME), the push to the Hugging Face Hub (token from the environment)."""
    logger = get_run_logger()
    with _store(config) as store:
        store.check_identity(config.identity())
    crawl_entry = crawl(config)
    stopped = None
    with device_slot(config.device):  # the filter runs candidates on the device
        try:
            _build_rounds(config, logger)
        except ComposeStopped as e:  # the funnel is still written: it says why
            stopped = (e.reason, "; ".join(filter(None, [str(e), e.progress])))
    funnel = publish(config, crawl_entry, stopped)
    create_table_artifact(key=artifacts.DATASET_FUNNEL_KEY, table=[
        {"stage": s["stage"], "in": s["in"], "kept": s["kept"],
         "dropped": ", ".join(f"{k} {v}" for k, v in s["dropped"].items())} for s in funnel["stages"]],
        description="cudagym dataset funnel")
    create_markdown_artifact(key=artifacts.DATASET_K_KEY, markdown="| K | rows |\n|---|---|\n" + "\n".join(
        f"| {k} | {n} |" for k, n in funnel["k_distribution"].items()))
    if hub_repo:
        logger.info("pushed %s", push_to_hub(config, hub_repo))
    return funnel


@ptask(cache_policy=NO_CACHE, name="compose first")
def compose_first(config: BuildConfig, stages: list[dict], missing: int) -> int:
    """Candidates an overlapped round composes before it filters (`build.compose_first`)."""
    with _store(config) as store:
        return build.compose_first(store, config, stages, missing)


@ptask(cache_policy=NO_CACHE, name="plan round")
def plan_round(config: BuildConfig, stages: list[dict], missing: int, last: bool) -> tuple[int, int]:
    """An overlapped round's plan: (candidates it filters, candidates it composes meanwhile) (`build.round_plan`)."""
    with _store(config) as store:
        return build.round_plan(store, config, stages, missing, last)


def _build_rounds(config: BuildConfig, logger) -> None:
    if config.overlapped:
        return _overlapped_rounds(config, logger)
    for _ in range(config.max_rounds):
        n_rows, stages = select(config, 0)
        missing = config.target - n_rows
        if missing <= 0:
            break
        wanted = filter_batch(config, missing)
        pending = build.unfiltered(stages)
        if pending < wanted:
            compose(config, wanted - pending)
        n_rows, _ = select(config, wanted)
        logger.info("%d of %d rows", n_rows, config.target)


def _overlapped_rounds(config: BuildConfig, logger) -> None:
    """`build.overlapped_rounds` as tasks: a round's filter (the select task, submitted) runs while the
    next round's compose task does."""
    n_rows, stages = select(config, 0)
    for round_ in range(config.max_rounds):
        missing = config.target - n_rows
        if missing <= 0:
            break
        first = compose_first(config, stages, missing)
        if first:
            compose(config, first)
            n_rows, stages = select(config, 0)
        batch, ahead = plan_round(config, stages, missing, round_ + 1 == config.max_rounds)
        if batch:
            filtering = select.submit(config, batch)
            try:
                if ahead:
                    compose(config, ahead)
            finally:  # a compose that failed or stopped leaves no filter running behind the flow's back
                filtering.wait()
            filtering.result()
        n_rows, stages = select(config, 0)
        logger.info("%d of %d rows", n_rows, config.target)


if __name__ == "__main__":
    import sys

    build_dataset(BuildConfig(out=sys.argv[1] if len(sys.argv) > 1 else "out/build"))
