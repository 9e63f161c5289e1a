"""Stage 4, decontaminate and dedup: task sets against KernelBench, and within themselves.

- `parity`: the paper's PythonASTSimilarity on the Model class (flag > 0.9), exact and fast in batch.
- `strong`: our score, invariant to renaming, reformatting, docstrings and resized constants (flag >= 0.9).
- `decontaminate`: both scores against reference problems; `check_against` and the `Decontaminate` step.
- `near`: exact (normalised-AST sha256) and near (MinHash LSH, verified) duplicates; the `NearDedup` step.
"""

from cudagym.dedup.decontaminate import PARITY_THRESHOLD, Decontaminate, ReferenceSet, check_against
from cudagym.dedup.near import NEAR_THRESHOLD, NearDedup, find_duplicates
from cudagym.dedup.parity import ParityIndex, parity_score
from cudagym.dedup.strong import STRONG_THRESHOLD, StrongIndex, normalize, strong_score

__all__ = ["NEAR_THRESHOLD", "PARITY_THRESHOLD", "STRONG_THRESHOLD", "Decontaminate", "NearDedup", "ParityIndex",
           "ReferenceSet", "StrongIndex", "check_against", "find_duplicates", "normalize", "parity_score",
           "strong_score"]
