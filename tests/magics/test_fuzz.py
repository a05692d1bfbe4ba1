"""Fuzzed magic arguments only ever produce ``UsageError`` (or a shown --help), never an
unhandled traceback. Parse-only paths: no cluster is started in the fuzz loop."""

from __future__ import annotations

import argparse
import contextlib
import math
import string
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from IPython.core.error import UsageError

from workbench.magics.args import HelpShown, MagicParser, parse_ranks, split_line
from workbench.magics.core import COMMANDS, _cell_parser
from workbench.validate import MAX_SECONDS, MIN_REFRESH_S

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
            "--interval",
            "--hosts",
            "--profile",
            "--cluster-id",
            "node-a",
            "a b",
            "-inf",
            "1.5",
            "0-50000000",
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


@settings(max_examples=300, deadline=None)
@given(argv=_ARGV)
def test_start_arguments_fail_before_any_process_starts(argv: list[str]) -> None:
    """``%wb start``'s checks and the Cluster constructor (which starts nothing):
    whatever the arguments, the only failure is a UsageError, and an accepted set of
    arguments makes a Cluster whose settings are all valid."""
    from workbench.magics.cluster_cmds import make_cluster

    args = _parse_or_usage(_parser("start"), argv)
    if args is None:
        return
    try:
        cluster = make_cluster(args)
    except UsageError:
        return
    assert cluster.state == "stopped"
    assert math.isfinite(cluster.config.init_timeout) and cluster.config.init_timeout > 0
    assert all(h and "," not in h for h in cluster.config.hosts)


@settings(max_examples=300, deadline=None)
@given(
    text=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.sampled_from(["nan", "-inf", "inf", "0", "-0", "1e999", "abc", "1_0", "0x10"]),
    )
)
def test_timeouts_and_intervals_are_finite_positive_or_refused(text: str) -> None:
    """``%%wb --timeout`` and ``%wb dashboard --interval`` (``inf`` would wait forever,
    ``nan`` spun the refresh loop): accepted values are finite and in range."""
    for parser, option, low in (
        (_cell_parser(), "--timeout", 0.0),
        (_parser("dashboard"), "--interval", MIN_REFRESH_S),
    ):
        args = _parse_or_usage(parser, [option, text])
        value = getattr(args, option.lstrip("-")) if args is not None else None
        if value is None:
            continue
        assert math.isfinite(value) and low <= value <= MAX_SECONDS and value > 0


def test_a_huge_rank_range_is_refused_at_once_with_a_short_message() -> None:
    """``--ranks 0-50000000`` used to list every bad rank (a 489 MB message)."""
    for text in ("0-50000000", "1-" + "9" * 4000, ",".join(["0"] * 1000) + ",2"):
        with pytest.raises(UsageError) as exc:
            parse_ranks(text, 2)
        assert len(str(exc.value)) < 200, str(exc.value)[:300]
        assert "valid ranks are 0..1 (world size 2)" in str(exc.value)


@pytest.mark.parametrize(
    "text", ["\u0661", "\u0660-\u0661", "1_0", "0-1_0", "+1", "0,+1", "\uff11", "1\u00b2"]
)
def test_ranks_are_ascii_digits_only(text: str) -> None:
    """int() reads an Arabic-Indic or a full-width digit, '1_0' and '+1': refused here."""
    with pytest.raises(UsageError, match="is not a rank or a range"):
        parse_ranks(text, 16)


def test_ranks_may_have_spaces_around_their_numbers() -> None:
    assert parse_ranks("0, 1 - 2", 4) == [0, 1, 2]


@settings(max_examples=300, deadline=None)
@given(lo=st.integers(-5, 10**12), hi=st.integers(-5, 10**12), world=st.integers(1, 8))
def test_rank_ranges_are_bounded_by_the_world_size(lo: int, hi: int, world: int) -> None:
    text = f"{lo}-{hi}"
    try:
        ranks = parse_ranks(text, world)
    except UsageError as exc:
        assert len(str(exc)) < 200
        assert not (0 <= lo <= hi < world)
        return
    assert 0 <= lo <= hi < world and ranks == list(range(lo, hi + 1))


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
