"""Benchmarks: `specd bench` (suite, runners, prompts, report)."""
