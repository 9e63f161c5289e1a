"""The ReAct loop and its client (cudagym/agent/loop.py, client.py) against the scripted server.

Pure parts (text tool-call parsing, context shortening) are tested as functions; the client with the
real `openai.AsyncOpenAI` against `ScriptedServer` (429 with Retry-After, 5xx, a slow answer past
the client timeout, a server that stays down, no usage); the loop's outcomes in one batch of real
rollouts (real KernelEnv, real DuckDB): malformed and unknown tool calls, text tool calls, server
failures, max turns, invalid-call and context-budget stops.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from cudagym.agent.client import ChatClient, ClientConfig, ClientError, Reply, Sampling, estimate_tokens
from cudagym.agent.loop import SHORTENED_MARKER, fit_context, parse_arguments, parse_text_tool_calls, shorten
from cudagym.agent.rollout import RolloutConfig, rollout_id, run_rollouts, select_tasks
from cudagym.agent.scripted import ScriptedServer, write_task_set
from cudagym.agent.store import TrajectoryStore

MARKER_TEXT = "output shortened to fit the context budget"


# -- parsing ----------------------------------------------------------------------------------------
def test_text_tool_calls_parse_in_order_and_report_broken_blocks():
    content = ('I will look first.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "model.py"}}\n</tool_call>\n'
               '<tool_call>{"name": "bash", "arguments": "{\\"command\\": \\"ls\\"}"}</tool_call>\n'
               '<tool_call>{"name": "verify"}</tool_call>\n'
               '<tool_call>{"name": "bash", "arguments": {"command": </tool_call>\n'
               '<tool_call>["not", "an", "object"]</tool_call>\n'
               '<tool_call>{"name": "grep", "arguments": {"pattern": "x"}}')  # cut off: no closing tag
    calls = parse_text_tool_calls(content)
    assert [(name, json.loads(args) if not err else None) for name, args, err in calls[:3]] == [
        ("read_file", {"path": "model.py"}), ("bash", {"command": "ls"}), ("verify", {})]
    assert all(err is None for _, _, err in calls[:3])
    assert "not JSON" in calls[3][2]
    assert "must be" in calls[4][2]
    # a block cut off before its closing tag (servers that stop at </tool_call>) counts when its JSON is whole
    assert calls[5] == ("grep", '{"pattern": "x"}', None)
    cut = parse_text_tool_calls('<tool_call>{"name": "bash", "argu')
    assert cut[0][0] == "" and "no </tool_call>" in cut[0][2]  # never dropped silently
    assert parse_text_tool_calls("no calls here, I am done") == []


def test_arguments_must_be_a_json_object():
    assert parse_arguments('{"path": "a"}') == ({"path": "a"}, None)
    assert parse_arguments("") == ({}, None)
    assert "not JSON" in parse_arguments("{oops")[1]
    assert "JSON object" in parse_arguments("[1, 2]")[1]


# -- context budget ---------------------------------------------------------------------------------
def test_context_is_fitted_by_shortening_old_outputs_oldest_first():
    outputs = [f"output {i} " + "z" * 4000 for i in range(4)]
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
    indices = []
    for out in outputs:
        messages.append({"role": "assistant", "content": "", "tool_calls": [{"id": "c", "function": {}}]})
        indices.append(len(messages))
        messages.append({"role": "tool", "tool_call_id": "c", "content": out})
    shortened: set[int] = set()
    full = estimate_tokens(messages)
    budget = full - 900  # needs one output shortened (each is ~1000 tokens)
    assert fit_context(messages, indices, budget, estimate_tokens, keep_recent=2, keep_chars=100, shortened=shortened)
    assert shortened == {indices[0]}  # the oldest only
    assert messages[indices[0]]["content"].startswith("output 0 ") and MARKER_TEXT in messages[indices[0]]["content"]
    assert messages[indices[1]]["content"] == outputs[1]
    # a budget only met by cutting the newest two as well: they are kept, and it does not fit
    assert not fit_context(messages, indices, 1500, estimate_tokens, keep_recent=2, keep_chars=100, shortened=shortened)
    assert shortened == {indices[0], indices[1]}
    assert [messages[i]["content"] for i in indices[2:]] == outputs[2:]


def test_shorten_says_how_much_was_dropped():
    text = "a" * 1000
    short = shorten(text, 100)
    assert short == "a" * 100 + SHORTENED_MARKER.format(dropped=900, total=1000)
    assert shorten("tiny", 100) == "tiny"


# -- the client -------------------------------------------------------------------------------------
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "read a file",
                                           "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]


def _chat(server: ScriptedServer, model: str, waits: list[float], **config) -> Reply | ClientError:
    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    async def main():
        client = ChatClient(ClientConfig(model=model, base_url=server.base_url, **config), sleep=sleep)
        try:
            return await client.chat([{"role": "system", "content": "s"}, {"role": "user", "content": "t"}],
                                     TOOLS, Sampling(max_tokens=64))
        finally:
            await client.close()

    return asyncio.run(main())


@pytest.mark.slow
def test_client_retries_and_classifies_server_failures():
    with ScriptedServer(slow_s=6.0, retry_after_s=0.25) as server:
        waits: list[float] = []
        reply = _chat(server, "scripted:quick+429", waits)
        assert isinstance(reply, Reply) and reply.attempts == 2 and waits == [0.25]  # Retry-After honoured
        assert reply.message["tool_calls"][0]["function"]["name"] == "read_file"
        assert reply.usage_source == "server" and reply.prompt_tokens > 0

        waits = []
        reply = _chat(server, "scripted:quick+500", waits, backoff_s=0.2)
        assert isinstance(reply, Reply) and reply.attempts == 2 and 0.1 <= waits[0] <= 0.2  # backoff with jitter

        waits = []
        reply = _chat(server, "scripted:quick+slow", waits, timeout_s=3.0, backoff_s=0.1)
        assert isinstance(reply, Reply) and reply.attempts == 2  # the first attempt timed out

        waits = []
        error = _chat(server, "scripted:quick+down", waits, max_retries=2, backoff_s=0.1)
        assert isinstance(error, ClientError) and error.reason == "llm_error" and error.attempts == 3
        assert len(waits) == 2 and waits[1] > waits[0] / 2  # doubling backoff

        waits = []
        error = _chat(server, "scripted:no-such-policy", waits)  # a 404: retrying cannot help
        assert isinstance(error, ClientError) and error.attempts == 1 and waits == []

        reply = _chat(server, "scripted:quick+nousage", [])
        assert reply.usage_source == "estimate" and reply.prompt_tokens == estimate_tokens(
            [{"role": "system", "content": "s"}, {"role": "user", "content": "t"}], TOOLS)


def test_client_config_checks():
    with pytest.raises(ValueError, match="base URL"):
        ClientConfig(model="m", base_url="localhost:8000")
    with pytest.raises(ValueError, match="temperature"):
        Sampling(temperature=3)
    assert ClientConfig(model="m", base_url="http://x/v1").key  # a placeholder when no key is set


# -- the loop, in real rollouts ---------------------------------------------------------------------
LOOP_POLICIES = ["malformed", "invalid", "chatty", "big", "quick+text", "quick+nousage", "quick+429", "quick+500",
                 "quick+slow", "quick+down"]


@pytest.mark.slow
def test_loop_outcomes_in_one_batch(tmp_path):
    tasks = write_task_set(tmp_path / "tasks", LOOP_POLICIES)
    with ScriptedServer(slow_s=15.0, retry_after_s=0.2) as server:
        config = RolloutConfig(tasks=str(tasks), out=str(tmp_path / "out"), model="scripted:task",
                               base_url=server.base_url, device="cpu", parallel=3, max_turns=8, context_tokens=5000,
                               max_tokens=256, client_timeout_s=6.0, max_retries=2, bash_timeout_s=20)
        lines: list[str] = []
        summary = run_rollouts(config, progress=lines.append)
        bodies = list(server.bodies)
    assert summary["finished"] == len(LOOP_POLICIES) and summary["failed"] == 0
    assert len([line for line in lines if line.startswith("[")]) == len(LOOP_POLICIES)  # a progress line each
    ids = {t.name.split("_", 1)[1]: rollout_id(t, 0) for t in select_tasks(config)}  # "3_quick_text" -> quick_text
    with TrajectoryStore(summary["db"], read_only=True) as store:
        rows = {r["rollout_id"]: r for r in store.rollouts()}
        row = {policy: rows[ids[policy.replace("+", "_")]] for policy in LOOP_POLICIES}
        calls = {policy: store.tool_calls(row[policy]["rollout_id"]) for policy in LOOP_POLICIES}
        messages = {policy: store.messages(row[policy]["rollout_id"]) for policy in LOOP_POLICIES}
        turns = {policy: store.turns(row[policy]["rollout_id"]) for policy in LOOP_POLICIES}

    for policy in LOOP_POLICIES:  # every one scored by the judge: the starting model_new.py breaks the op policy
        assert row[policy]["status"] == "finished" and row[policy]["reward"] == -1, policy
        assert row[policy]["verdict"]["status"] == "rejected", policy

    # malformed: each bad call answered with an error, and the loop went on to a valid call and an answer
    assert row["malformed"]["stop_reason"] == "answer"
    assert [c["valid"] for c in calls["malformed"]] == [False, False, False, False, True]
    errors = [c["output"] for c in calls["malformed"][:4]]
    assert "not JSON" in errors[0] and "unknown tool 'launch_missiles'" in errors[1]
    assert "JSON object" in errors[2] and "not JSON" in errors[3]
    assert calls["malformed"][4]["ok"] and "torch.softmax" in calls["malformed"][4]["output"]
    tool_msgs = [m["content"] for m in messages["malformed"] if m["role"] == "tool"]
    assert tool_msgs[:3] == errors[:3]  # what the model was sent back
    assert any(m["role"] == "user" and "<tool_response>" in m["content"] and "not JSON" in m["content"]
               for m in messages["malformed"][2:])  # the broken text block's answer

    assert (row["invalid"]["stop_reason"], row["invalid"]["turns"]) == ("invalid_calls", 5)
    assert (row["chatty"]["stop_reason"], row["chatty"]["turns"]) == ("max_turns", 8)
    assert [c["output"].split("\n")[0] for c in calls["chatty"][:2]] == ["turn 0", "turn 1"]

    # text tool calls: parsed from the content, answered in a user message, never as a tool message
    text_calls = calls["quick+text"]
    assert [(c["name"], c["format"], c["ok"]) for c in text_calls] == [("read_file", "text", True)]
    assert not any(m["role"] == "tool" for m in messages["quick+text"])
    assert any(m["role"] == "user" and "<tool_response>" in m["content"] and "torch.softmax" in m["content"]
               for m in messages["quick+text"])
    assert row["quick+text"]["stop_reason"] == "answer"

    assert {t["usage_source"] for t in turns["quick+nousage"]} == {"estimate"}
    assert {t["usage_source"] for t in turns["quick+text"]} == {"server"}
    for policy in ("quick+429", "quick+500", "quick+slow"):  # each first request failed once, then the loop went on
        assert [t["attempts"] for t in turns[policy]] == [2, 2], policy
        assert row[policy]["stop_reason"] == "answer", policy
    assert row["quick+down"]["stop_reason"] == "client_error" and "llm_error" in row["quick+down"]["detail"]
    assert turns["quick+down"][0]["error"] and turns["quick+down"][0]["attempts"] == 3

    # context budget: old outputs were shortened in what the server saw (oldest first), never in the store
    assert row["big"]["stop_reason"] == "context_budget"
    assert all(len(c["output"]) >= 6000 for c in calls["big"])
    big_bodies = [b for b in bodies if "scripted-policy: big" in b["messages"][1]["content"]]
    last = [m["content"] for m in big_bodies[-1]["messages"] if m["role"] == "tool"]
    assert MARKER_TEXT in last[0] and all(MARKER_TEXT not in text for text in last[-2:])
    assert all(MARKER_TEXT not in (m["content"] or "") for m in messages["big"])


@pytest.mark.slow
def test_wall_time_budget_stops_a_rollout(tmp_path):
    tasks = write_task_set(tmp_path / "tasks", ["chatty+delay"])  # runs echo forever, each reply after 0.5 s
    config = RolloutConfig(tasks=str(tasks), out=str(tmp_path / "out"), model="scripted:task", device="cpu",
                           parallel=1, max_turns=1000, wall_s=3.0)
    summary = run_rollouts(config)
    assert summary["stop_reasons"] == {"wall_time": 1} and summary["finished"] == 1
    with TrajectoryStore(summary["db"], read_only=True) as store:
        (row,) = store.rollouts()
    assert 1 <= row["turns"] < 1000 and row["reward"] == -1  # still scored by the judge
