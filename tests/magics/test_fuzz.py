"""Fuzzed magic arguments only ever produce ``UsageError`` (or a shown --help), never an
unhandled traceback. Parse-only paths: no cluster is started in the fuzz loop."""

from __future__ import annotations

import argparse
import contextlib
import string
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from IPython.core.error import UsageError

from workbench.magics.args import HelpShown, MagicParser, parse_ranks, split_line
from workbench.magics.core import COMMANDS, _cell_parser

# Tokens that look like the real options, mixed with junk, so argparse gets past the
# first error often enough to reach the type converters (-n, --step, --keep-last ...).
_TOKENS = st.one_of(
    st.sampled_from(
        [
            "-n",
            "--step",
            "--keep-last",
            "--dir",
            "--timeout",
            "--ranks",
            "-r",
            "--backend",
            "--launcher",
            "--threads",
            "--phase",
            "--json",
            "--full",
            "save",
            "load",
            "list",
            "memory",
            "export",
            "gloo",
            "nccl",
            "0",
            "-1",
            "2",
            "1e9",
            "nan",
            "inf",
            "0-1",
            "1,0",
            "all",
            "",
            "=",
            "--",
        ]
    ),
    st.text(alphabet=string.printable, max_size=12),
)
_ARGV = st.lists(_TOKENS, max_size=6)


def _parser(name: str) -> MagicParser:
    parser = MagicParser(prog=f"%wb {name}", description=COMMANDS[name].help)
    COMMANDS[name].parser(parser)
    return parser


def _parse_or_usage(parser: MagicParser, argv: list[str]) -> argparse.Namespace | None:
    try:
        return parser.parse(argv)
    except (UsageError, HelpShown):
        return None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(COMMANDS)), argv=_ARGV)
def test_every_command_parser_raises_only_usage_errors(name: str, argv: list[str]) -> None:
    _parse_or_usage(_parser(name), argv)


@settings(max_examples=200, deadline=None)
@given(argv=_ARGV)
def test_cell_parser_and_ranks_raise_only_usage_errors(argv: list[str]) -> None:
    args = _parse_or_usage(_cell_parser(), argv)
    if args is not None:
        for world in (1, 2, 4):
            try:
                ranks = parse_ranks(args.ranks, world)
            except UsageError:
                continue
            assert ranks is None or all(0 <= r < world for r in ranks)


@settings(max_examples=300, deadline=None)
@given(line=st.text(alphabet=string.printable, max_size=40))
def test_split_line_and_rank_text_raise_only_usage_errors(line: str) -> None:
    with contextlib.suppress(UsageError):
        split_line(line)
    with contextlib.suppress(UsageError):
        parse_ranks(line, 2)


@settings(max_examples=200, deadline=None)
@given(argv=_ARGV)
def test_line_magic_without_a_cluster_raises_only_usage_errors(argv: list[str]) -> None:
    """Through the real ``%wb`` entry point, for the commands that need a cluster or a
    stepper to exist before doing anything: with none, they must fail as UsageError."""
    from workbench.magics.core import WorkbenchMagics

    magics = WorkbenchMagics(shell=None)
    # No stepper either, even if another test in this process made one.
    with mock.patch("workbench.ui.stepper._current", []):
        for name in ("status", "step", "plot", "trace", "checkpoint"):
            line = " ".join([name, *(_quote(a) for a in argv)])
            with contextlib.suppress(UsageError):
                magics.wb(line)
        with contextlib.suppress(UsageError):
            magics.wb_cell(" ".join(_quote(a) for a in argv), "1 + 1")


def _quote(token: str) -> str:
    import shlex

    return shlex.quote(token)


@pytest.mark.parametrize("name", ["checkpoint"])
def test_checkpoint_arguments_are_validated(name: str) -> None:
    parser = _parser(name)
    assert parser.parse(["save", "--keep-last", "2"]).keep_last == 2
    assert parser.parse(["load", "--step", "3"]).step == 3
    for bad in (["load", "--step", "-1"], ["save", "--keep-last", "0"], ["frobnicate"]):
        with pytest.raises(UsageError):
            parser.parse(bad)
