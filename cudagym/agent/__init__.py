"""The agent's gym: a rollout's environment (workdir, tools, sandboxed shell, judge) and the loop
that drives a model through it. docs/agent.md describes both."""
