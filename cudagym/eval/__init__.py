"""Evaluation: judge a candidate against a reference task, time it, score it."""
