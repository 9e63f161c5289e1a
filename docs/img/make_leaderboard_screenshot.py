"""Build the sample store behind docs/img/leaderboard*.png, render the page and screenshot it.

    .venv/bin/python docs/img/make_leaderboard_screenshot.py [OUT_DIR]   # needs `chromium` on PATH

The verdicts are made up but shaped like real H200 ones (KernelBench v0.1 names, costs and times of
the right order): two submissions, one timed in both strict and paper mode, one degenerate problem
(19_ReLU accepts a passthrough), one candidate rejected with a flag. The problem set is patched to
these eight problems so that the page stays one screen long.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from cudagym.eval import leaderboard
from cudagym.eval.store import Store

ENV = {"gpu": "NVIDIA H200", "torch": "2.11.0", "cuda": "13.0"}
PROBLEMS = {  # (level, id): name, cost (FLOPs, least bytes moved)
    (1, 1): ("1_Square_matrix_multiplication_", 2 * 2048**3, 3 * 2048**2 * 4),
    (1, 12): ("12_Matmul_with_diagonal_matrices_", 4096 * 4096, (4096 + 2 * 4096 * 4096) * 4),
    (1, 19): ("19_ReLU", 16 * 16384, 2 * 16 * 16384 * 4),
    (1, 40): ("40_LayerNorm", 8 * 16 * 64 * 256 * 8, 2 * 16 * 64 * 256 * 256 * 4),
    (2, 1): ("1_Conv2D_ReLU_BiasAdd", 2 * 128 * 16 * 30 * 30 * 3 * 3 * 3, (128 * 3 * 32 * 32 + 128 * 16 * 900) * 4),
    (2, 12): ("12_Gemm_Multiply_LeakyReLU", 2 * 128 * 1024 * 512, (128 * 1024 + 1024 * 512 + 128 * 512) * 4),
    (2, 17): ("17_Conv2d_InstanceNorm_Divide", 2 * 128 * 16 * 30 * 30 * 27, (128 * 3 * 32 * 32 + 128 * 16 * 900) * 4),
    (2, 95): ("95_Matmul_Add_Swish_Tanh_GELU_Hardtanh", 2 * 128 * 1024 * 512, (128 * 1024 + 1024 * 512) * 4),
}
DEGENERATE = {(1, 19): "its check accepts passthrough (atol=0.01, rtol=0.01)"}


def verdict(key, status, mode, t_eager, t_compile, t_ms=None, reason=None, flags=(), details=None) -> dict:
    name, flops, n_bytes = PROBLEMS[key]
    correct = status == "pass"
    v = {"level": key[0], "problem_id": key[1], "name": name, "kb_version": "v0.1", "status": status,
         "correct": correct, "reason": reason, "flags": list(flags), "t_candidate_ms": t_ms if correct else None,
         "t_eager_ms": t_eager, "t_compile_ms": t_compile, "timing_mode": mode, "precision": "strict",
         "degenerate": DEGENERATE.get(key), "cost": {"flops": flops, "bytes": n_bytes}, "env": ENV,
         "timing": {"flag_details": details} if details else {}}
    v["speedup_vs_eager"] = t_eager / t_ms if correct and t_ms else None
    v["speedup_vs_compile"] = t_compile / t_ms if correct and t_ms else None
    beats_eager = correct and (t_eager - t_ms) / t_eager > 0.05
    beats_compile = correct and (t_compile - t_ms) / t_compile > 0.05
    v["reward"] = -1 if not correct else 3 if beats_eager and beats_compile else 2 if beats_eager else 1
    return v


def fill(store: Store) -> None:
    store.add_submission("agent-v2", "/subs/agent-v2", "strict", levels=[1, 2], kb_version="v0.1")
    for args in [((1, 1), "pass", 0.362, 0.371, 0.408), ((1, 12), "pass", 1.95, 0.061, 0.052),
                 ((1, 19), "pass", 0.0092, 0.0105, 0.0071),
                 ((1, 40), "rejected", 0.118, 0.094, None,
                  "static check: torch compute in forward (torch.nn.functional.layer_norm, line 31)",
                  ["torch_compute_in_forward"], {"torch_compute_in_forward": ["line 31: F.layer_norm(x, ...)"]}),
                 ((2, 1), "pass", 0.214, 0.152, 0.131), ((2, 12), "pass", 0.081, 0.061, 0.047),
                 ((2, 17), "incorrect", 0.305, 0.188, None,
                  "max abs error 0.31 > atol + rtol |ref| on check 2 (3.1% of elements)"),
                 ((2, 95), "compile_error", 0.093, 0.058, None,
                  "nvcc: kernel.cu(41): error: identifier \"__hmax2\" is undefined")]:
        store.add_verdict("agent-v2", verdict(args[0], args[1], "strict", *args[2:]))
    store.add_submission("agent-v2", "/subs/agent-v2", "paper", levels=[1, 2], kb_version="v0.1")
    for args in [((1, 1), "pass", 0.351, 0.355, 0.392), ((1, 12), "pass", 1.91, 0.043, 0.036),
                 ((1, 19), "pass", 0.0040, 0.0038, 0.0031),
                 ((1, 40), "rejected", 0.106, 0.081, None,
                  "static check: torch compute in forward (torch.nn.functional.layer_norm, line 31)",
                  ["torch_compute_in_forward"]),
                 ((2, 1), "pass", 0.181, 0.122, 0.109), ((2, 12), "pass", 0.052, 0.038, 0.029),
                 ((2, 17), "incorrect", 0.262, 0.151, None,
                  "max abs error 0.31 > atol + rtol |ref| on check 2 (3.1% of elements)"),
                 ((2, 95), "compile_error", 0.071, 0.040, None,
                  "nvcc: kernel.cu(41): error: identifier \"__hmax2\" is undefined")]:
        store.add_verdict("agent-v2", verdict(args[0], args[1], "paper", *args[2:]))
    store.add_submission("agent-v1", "/subs/agent-v1", "strict", levels=[1, 2], kb_version="v0.1")
    for args in [((1, 1), "pass", 0.362, 0.371, 0.96), ((1, 12), "pass", 1.95, 0.061, 0.118),
                 ((1, 19), "rejected", 0.0092, 0.0105, None,
                  "timed output differs from the checked one (rep 4 of 37)", ["timed_output_mismatch"],
                  {"timed_output_mismatch": ["rep 4: max abs err 1.7 against the reference"]}),
                 ((2, 1), "pass", 0.214, 0.152, 0.198), ((2, 12), "runtime_error", 0.081, 0.061, None,
                                                          "CUDA error: an illegal memory access was encountered")]:
        store.add_verdict("agent-v1", verdict(args[0], args[1], "strict", *args[2:]))


def screenshot(page: Path, png: Path, height: int) -> None:
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--hide-scrollbars", f"--screenshot={png}",
                    f"--window-size=1400,{height}", page.resolve().as_uri()], check=True)


def main(out_dir: str) -> None:
    out = Path(out_dir)
    leaderboard.expected_problems = lambda kb_version, levels: [k for k in PROBLEMS if k[0] in levels]
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "sample.duckdb") as store:
        fill(store)
        page = leaderboard.write_html(store, out, compare="agent-v2,agent-v1")
        # the top of the page (overview, comparisons) ...
        screenshot(page, Path(__file__).with_name("leaderboard.png"), 1800)
        # ... and one entry's section (metrics, plot, per-problem table), rendered on a page of its own
        # (headless screenshots start at the top of the page, whatever the URL's #fragment)
        entry = leaderboard.resolve_entry(leaderboard.build_entries(store), "agent-v2")
        (out / "entry.html").write_text(leaderboard.render_html([entry]))
        screenshot(out / "entry.html", Path(__file__).with_name("leaderboard-entry.png"), 1500)
    print(page)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "out/leaderboard-sample")
