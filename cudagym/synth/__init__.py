"""Synthesis of CUDA-Agent-Ops-style training tasks.

A build is a list of steps (STYLE point 4): crawl seed operators (`crawl`), compose up to five of
them into one fused task (`compose`, `llm`), dedup and decontaminate (`cudagym.dedup`), run each
task in the harness's sandbox (`filter`), label and publish (`publish`); `build` runs them,
resumably, and `cudagym.flows.build_dataset` is the same as a Prefect flow.

- `crawl.crawl_torch()` / `crawl.crawl_transformers()` -> (seeds, skips): every seed verified by
  running it on meta tensors and on small real CPU inputs; every rejected candidate is a `Skip`
  with a reason code.
- `compose.COMPOSERS["programmatic"]` chains seeds whose shapes connect and writes the fused
  `Model` with libcst (`render`); `llm.LLMComposer` asks an OpenAI-compatible endpoint;
  `labels.ops_from_code` / `labels.data_source_of` derive the dataset's `ops` and `data_source`
  labels from a task's AST.

Imports go one way: seeds <- labels, render <- crawl <- compose <- llm <- build (tests/eval/test_pool.py).
- `filter.decide` keeps or drops a task from what the sandboxed judge measured (`filter.REASONS`).
"""

from cudagym.synth.crawl import crawl_torch, crawl_transformers
from cudagym.synth.seeds import InputSpec, Seed, Skip

__all__ = ["InputSpec", "Seed", "Skip", "crawl_torch", "crawl_transformers"]
