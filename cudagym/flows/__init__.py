"""Prefect flows: thin wrappers that sequence the library's plain functions (STYLE point 3)."""
