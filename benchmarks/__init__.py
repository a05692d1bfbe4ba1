"""Benchmarks: the workbench's costs as ratios against the raw tools, measured side by side.

``python -m benchmarks.run_all [--quick] [--only a,b]`` (``make bench``) runs them all and
writes ``benchmarks/results/latest.{md,json}``; each module also runs on its own
(``python -m benchmarks.<name> [--quick]``).
"""
