"""Synthesis of CUDA-Agent-Ops-style training tasks.

A build is a list of steps (STYLE point 4): crawl seed operators (`crawl`), compose up to five of
them into one fused task (`compose`), then filter, dedup, decontaminate and write (later steps).

- `crawl.crawl_torch()` / `crawl.crawl_transformers()` -> (seeds, skips): every seed verified by
  running it on meta tensors and on small real CPU inputs; every rejected candidate is a `Skip`
  with a reason code.
- `compose.COMPOSERS["programmatic"]` chains seeds whose shapes connect and writes the fused
  `Model` with libcst; `compose.ops_from_code` / `compose.data_source_of` derive the dataset's
  `ops` and `data_source` labels from a task's AST.
"""

from cudagym.synth.crawl import InputSpec, Seed, Skip, crawl_torch, crawl_transformers

__all__ = ["InputSpec", "Seed", "Skip", "crawl_torch", "crawl_transformers"]
