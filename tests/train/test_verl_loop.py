"""cudagym's verl agent loop (cudagym/train/verl_loop.py) inside real verl, on the CPU.

The loop is built the way verl's AgentLoopWorker builds one (hydra.utils.instantiate of the
registry entry, with verl's DictConfigWrap / ToolListWrap and RLHFDataset), and its server_manager
is a scripted token source, as in verl's own CPU agent-loop tests (tests/experimental/agent_loop/
test_agent_loop_extra_fields_schema_on_cpu.py): generate returns the token ids of scripted replies
written in the loop's `<tool_call>` format. Everything else is real: SmolLM2's tokenizer and chat
template, verl's Continuous Token builder, cudagym's loop and KernelEnv (workdir, tools, the judge).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import hydra
import pytest
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap, _agent_loop_registry
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.workers.rollout.replica import TokenOutput

from cudagym.agent.environment import EnvConfig, KernelEnv
from cudagym.agent.loop import TEXT_TOOLS_PROMPT
from cudagym.tasks import task_from_file
from cudagym.train.verl_loop import AGENT_NAME, CudagymAgentLoop, dataset_row

# the packaged agent-loop YAML (actor_rollout_ref.rollout.agent.agent_loop_config_path), as verl's worker loads it
(LOOP_ENTRY,) = OmegaConf.load(Path(__file__).resolve().parents[2] / "cudagym" / "train" / "verl_agent_loop.yaml")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TASK = FIXTURES / "problems" / "add_scale.py"
HONEST_KERNEL = (FIXTURES / "honest" / "add_scale_cpp.py").read_text()  # a C++ kernel the judge passes
# ModelNew returns x (the task is x * 2 + y): no op the policy refuses, just wrong outputs
WRONG_KERNEL = ("import torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
                "    def forward(self, x, y):\n        return x\n")
ENV = {"compile_baseline": False, "n_checks": 2}  # torch.compile on the CPU would take minutes
LOGPROB = -0.5  # every scripted token's log-prob: model tokens must carry it, tool tokens 0


def tool_call(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


class ScriptedTokenSource:
    """verl's server manager with generate scripted: reply k is the token ids of replies[k] and the
    end-of-turn token (where a sampling server stops). Records the prompt ids of every call."""

    def __init__(self, tokenizer, replies: list[str]):
        end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.replies = [tokenizer.encode(text, add_special_tokens=False) + [end] for text in replies]
        self.prompts: list[list[int]] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        assert sampling_params == {"temperature": 1.0}  # verl's sampling params reach the server as given
        self.prompts.append(list(prompt_ids))
        ids = self.replies[len(self.prompts) - 1]
        return TokenOutput(token_ids=ids, log_probs=[LOGPROB] * len(ids), stop_reason="completed")


def make_loop(tokenizer, source: ScriptedTokenSource, tmp_path: Path, prompt_length: int = 4096,
              response_length: int = 4096) -> CudagymAgentLoop:
    config = OmegaConf.create({
        "actor_rollout_ref": {"rollout": {"prompt_length": prompt_length, "response_length": response_length,
                                          "multi_turn": {"max_assistant_turns": 5}},
                              "model": {"path": "unused"}},
        "data": {"apply_chat_template_kwargs": {}},
        "cudagym": {"env": ENV, "workdirs": str(tmp_path / "workdirs")},
    })
    # as AgentLoopWorker._run_agent_loop, from the YAML's entry; SmolLM2's template is ChatML like
    # Qwen2's, so verl's Qwen builder (a newline after <|im_end|> before the next message) is the right one
    assert LOOP_ENTRY.name == AGENT_NAME and _agent_loop_registry[AGENT_NAME]["_target_"] == LOOP_ENTRY._target_
    loop = hydra.utils.instantiate(config=LOOP_ENTRY, trainer_config=DictConfigWrap(config),
                                   server_manager=source, tokenizer=tokenizer, processor=None, hf_model_type="qwen2",
                                   dataset_cls=RLHFDataset, data_config=DictConfigWrap(config.data),
                                   tools=ToolListWrap([]))
    assert type(loop) is CudagymAgentLoop
    return loop


def expected_prompt(tokenizer, tmp_path: Path) -> list[int]:
    """The chat-templated first prompt: the environment's system prompt with the loop's text tool
    prompt, then its task prompt (an environment of its own, for its prompts only)."""
    env = KernelEnv(task_from_file(TASK), tmp_path / "prompt-env", EnvConfig(**ENV))
    try:
        tools = "\n".join(json.dumps(t["function"]) for t in env.tool_schemas())
        messages = [{"role": "system", "content": env.system_prompt() + TEXT_TOOLS_PROMPT.format(tools=tools)},
                    {"role": "user", "content": env.task_prompt()}]
    finally:
        env.close()
    return tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False)


def run(tokenizer, source: ScriptedTokenSource, tmp_path: Path, prompt_length: int = 4096, response_length: int = 4096):
    """One episode; the loop is made inside the running event loop, as verl's worker makes it (the
    base class keeps the loop it was made in for its tokenizer calls)."""
    async def episode():
        row = dataset_row(task_from_file(TASK))  # the row's fields reach run() as verl passes them
        loop = make_loop(tokenizer, source, tmp_path, prompt_length, response_length)
        return await loop.run({"temperature": 1.0}, **row)

    return asyncio.run(episode())


def split(source: ScriptedTokenSource, prompt: list[int]) -> list[tuple[list[int], int]]:
    """The expected response as (ids, mask) segments: each scripted reply (1) and what came between
    it and the next prompt (0), read off the prompts the server was given."""
    segments = []
    for k, reply in enumerate(source.replies[:len(source.prompts)]):
        segments.append((reply, 1))
        if k + 1 < len(source.prompts):
            before, after = source.prompts[k], source.prompts[k + 1]
            # the sampled ids are kept as they are (token-in / token-out), then the tool outputs follow
            assert after[:len(before) + len(reply)] == before + reply
            segments.append((after[len(before) + len(reply):], 0))
    assert source.prompts[0] == prompt
    return segments


@pytest.mark.slow
def test_honest_trajectory_masks_and_judge_reward(smollm2_tokenizer, tmp_path):
    tok = smollm2_tokenizer
    replies = ["I write a C++ kernel.\n" + tool_call("write_file", path="model_new.py", content=HONEST_KERNEL),
               tool_call("verify"),
               "verify passes; done."]
    source = ScriptedTokenSource(tok, replies)
    out = run(tok, source, tmp_path)

    prompt = expected_prompt(tok, tmp_path)
    assert out.prompt_ids == prompt
    segments = split(source, prompt)
    assert [mask for _, mask in segments] == [1, 0, 1, 0, 1] and len(source.prompts) == 3
    assert out.response_ids == [i for ids, _ in segments for i in ids]
    assert out.response_mask == [mask for ids, mask in segments for _ in ids]
    assert out.response_logprobs == [LOGPROB if mask else 0.0 for ids, mask in segments for _ in ids]
    # the mask-0 spans are the environment's: the tool outputs in the loop's text format, each
    # closed by the template's turn end and the next assistant header
    tools_0, tools_1 = tok.decode(segments[1][0]), tok.decode(segments[3][0])
    for text in (tools_0, tools_1):
        assert text.startswith("\n<|im_start|>user\n<tool_response>\n") and text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert "model_new.py" in tools_0 and "verify: PASS" in tools_1
    assert out.num_turns == 1 + 3 + 2  # verl's count: the prompt, 3 model turns, 2 tool-output messages
    verdict = out.extra_fields["cudagym_verdict"]
    assert out.extra_fields["cudagym_stop_reason"] == "answer"
    assert [c["name"] for c in out.extra_fields["cudagym_tool_calls"]] == ["write_file", "verify"]
    assert verdict["status"] == "pass" and out.reward_score == verdict["reward"] >= 1
    # verl puts the reward on the last response token: here a model token (the final answer's end)
    fields = out.as_dict()
    assert fields["rm_scores"][-1] == out.reward_score and fields["response_mask"][-1] == 1
    assert not any(Path(tmp_path / "workdirs").iterdir())  # the rollout's workdir is gone


@pytest.mark.slow
def test_wrong_kernel_gets_the_judges_minus_one(smollm2_tokenizer, tmp_path):
    tok = smollm2_tokenizer
    source = ScriptedTokenSource(tok, [tool_call("write_file", path="model_new.py", content=WRONG_KERNEL), "Done."])
    out = run(tok, source, tmp_path)
    segments = split(source, out.prompt_ids)
    assert [mask for _, mask in segments] == [1, 0, 1]
    assert out.response_ids == [i for ids, _ in segments for i in ids]
    assert out.response_mask == [mask for ids, mask in segments for _ in ids]
    assert out.num_turns == 1 + 2 + 1
    verdict = out.extra_fields["cudagym_verdict"]
    assert verdict["status"] == "incorrect" and out.reward_score == verdict["reward"] == -1


def test_max_assistant_turns_ends_the_episode_on_a_model_turn(smollm2_tokenizer, tmp_path):
    """verl's multi_turn.max_assistant_turns is the loop's max_turns: the fifth reply's tool call
    runs (as in a cudagym rollout) but its output is never appended, so the response ends with model tokens."""
    tok = smollm2_tokenizer
    source = ScriptedTokenSource(tok, [tool_call("bash", command=f"echo turn {k}") for k in range(6)])
    out = run(tok, source, tmp_path)
    assert len(source.prompts) == 5 and out.extra_fields["cudagym_stop_reason"] == "max_turns"
    assert [c["ok"] for c in out.extra_fields["cudagym_tool_calls"]] == [True] * 5
    segments = split(source, out.prompt_ids)
    assert out.response_mask == [mask for ids, mask in segments for _ in ids]
    assert out.response_ids[-len(source.replies[4]):] == source.replies[4] and out.response_mask[-1] == 1
    assert "turn 3" in tok.decode(segments[-2][0])  # the 4th call's output, before the 5th reply
    assert out.reward_score == -1  # model_new.py is still the reference: the op policy rejects it


def test_a_prompt_longer_than_prompt_length_is_refused_not_cut(smollm2_tokenizer, tmp_path):
    """verl would keep the prompt's last prompt_length tokens, dropping the start of the system prompt."""
    source = ScriptedTokenSource(smollm2_tokenizer, ["Done."])
    with pytest.raises(ValueError, match=r"prompts take 1519 tokens, more than actor_rollout_ref.rollout.prompt_length=1000"):
        run(smollm2_tokenizer, source, tmp_path, prompt_length=1000)
    assert source.prompts == [] and not any(Path(tmp_path / "workdirs").iterdir())


def test_tool_output_that_would_fill_the_response_ends_the_episode_unappended(smollm2_tokenizer, tmp_path):
    """As verl's ToolAgentLoop: a tool output that would take the response to response_length is not
    appended and the model is not queried again; the response is the first reply alone."""
    tok = smollm2_tokenizer
    source = ScriptedTokenSource(tok, [tool_call("bash", command="seq 1 400"), "Done."])
    out = run(tok, source, tmp_path, response_length=200)
    assert len(source.prompts) == 1 and out.extra_fields["cudagym_stop_reason"] == "context_budget"
    assert out.response_ids == source.replies[0] and out.response_mask == [1] * len(source.replies[0])
    assert out.extra_fields["cudagym_tool_calls"] == [{"name": "bash", "ok": True, "valid": True}]
