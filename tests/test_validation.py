"""Every public entry point refuses bad settings before any process starts, with one
message style: ``<name>=<value!r> is not valid: <why>; <valid range>``.

No engines here: each check must fire before a cluster is even looked for.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench import validate
from workbench.cluster import Cluster
from workbench.cluster.dispatch.hang import hang_report, read_status
from workbench.config import ClusterConfig
from workbench.errors import ConfigError
from workbench.parallel.run_spec import MAX_BATCH_SIZE, MAX_SEED, RunSpec

# Any float at all, NaN and both infinities included, plus the values users type by mistake.
_FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, -1.0, 1e-300, 1e300, validate.MAX_SECONDS]),
)
_NOT_NUMBERS = st.one_of(
    st.booleans(), st.text(max_size=5), st.none(), st.lists(st.integers(), max_size=2)
)


def _valid_seconds(x: float) -> bool:
    return math.isfinite(x) and 0 < x <= validate.MAX_SECONDS


def _assert_message(exc: pytest.ExceptionInfo[ConfigError], name: str, value: Any) -> None:
    text = str(exc.value)
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:60] + "..."  # cut to a line
    assert text.startswith(f"{name}={shown} is not valid: "), text
    assert "; use " in text, text  # the valid range follows the reason


# -- the shared checks ------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(x=_FLOATS)
def test_seconds_accepts_exactly_the_finite_positive_bounded_numbers(x: float) -> None:
    if _valid_seconds(x):
        assert validate.seconds("timeout", x) == x
    else:
        with pytest.raises(ConfigError) as exc:
            validate.seconds("timeout", x)
        _assert_message(exc, "timeout", x)
        assert str(validate.MAX_SECONDS)[:8] in str(exc.value)


@settings(max_examples=200, deadline=None)
@given(value=st.one_of(_NOT_NUMBERS, st.floats(allow_nan=True), st.integers()))
def test_integer_refuses_bools_floats_and_out_of_range(value: Any) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 64
    if ok:
        assert validate.integer("n", value, minimum=1, maximum=64) == value
    else:
        with pytest.raises(ConfigError) as exc:
            validate.integer("n", value, minimum=1, maximum=64)
        _assert_message(exc, "n", value)
        assert ">= 1 and <= 64" in str(exc.value)


@pytest.mark.parametrize("value", ["no", "False", 0, 1, None, 1.0])
def test_boolean_refuses_everything_but_true_and_false(value: Any) -> None:
    with pytest.raises(ConfigError, match=r"is not valid: not a bool; use True or False"):
        validate.boolean("overlap", value)


# -- Cluster / ClusterConfig ------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(["init_timeout", "start_timeout"]), x=_FLOATS)
def test_cluster_timeouts_are_finite_positive_seconds(name: str, x: float) -> None:
    if _valid_seconds(x):
        assert getattr(ClusterConfig(**{name: x}), name) == x
    else:
        with pytest.raises(ConfigError) as exc:
            Cluster(n=2, **{name: x})  # type: ignore[arg-type]
        _assert_message(exc, name, x)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"threads_per_engine": 1.5}, "threads_per_engine=1.5 is not valid: not a whole number"),
        ({"threads_per_engine": True}, "threads_per_engine=True is not valid: not a whole number"),
        ({"threads_per_engine": 0}, "threads_per_engine=0 is not valid: out of range"),
        ({"n": 2.0}, "n=2.0 is not valid: not a whole number; use a number of engines >= 1"),
        ({"n": True}, "n=True is not valid"),
        ({"backend": ["gloo"]}, "backend=\\['gloo'\\] is not valid; choose one of"),
        ({"hosts": "node-a"}, "launcher='local' does not place engines on named hosts"),
        ({"launcher": "ssh", "hosts": ["node a"]}, "'node a' is not a host name"),
        ({"launcher": "ssh", "hosts": [""]}, "'' is not a host name"),
        ({"launcher": "ssh", "hosts": 5}, "hosts=5 is not valid: not a list of host names"),
        ({"profile": ""}, "profile='' is not valid: not a name"),
    ],
)
def test_cluster_refuses_bad_settings(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Cluster(**kwargs)


@pytest.mark.parametrize(
    ("hosts", "expected"),
    [
        ("node-a", ("node-a",)),  # one host, never the six characters of its name
        ("node-a,node-b", ("node-a", "node-b")),  # as %wb start --hosts takes them
        (["node-a", "user@node-b"], ("node-a", "user@node-b")),
        (("node-a",), ("node-a",)),
    ],
)
def test_hosts_as_a_string_is_one_host_or_a_comma_list(hosts: Any, expected: tuple[str]) -> None:
    assert Cluster(n=2, launcher="ssh", hosts=hosts).config.hosts == expected


def test_profile_without_a_controller_names_the_file_looked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path))
    expected = tmp_path / "profile_x" / "security" / "ipcontroller-client.json"
    with pytest.raises(ConfigError) as exc:
        Cluster(n=2, profile="x")
    text = str(exc.value)
    assert text.startswith("profile='x' is not valid: no ipyparallel controller")
    assert str(expected) in text and "ipcluster start --profile=x" in text
    # A cluster id that is not running: the ids that are running are named.
    security = tmp_path / "profile_default" / "security"
    security.mkdir(parents=True)
    (security / "ipcontroller-1234-abcd-client.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"running cluster ids in profile 'default': 1234-abcd"):
        Cluster(n=2, cluster_id="nope")
    # With the connection file there, the setting is accepted (nothing is started).
    assert Cluster(n=2, cluster_id="1234-abcd").config.cluster_id == "1234-abcd"


@pytest.mark.parametrize("timeout", [0, -1.0, math.nan, math.inf, 1e300, "10"])
def test_run_and_execute_refuse_a_bad_timeout_before_sending_work(timeout: Any) -> None:
    """A zero or negative timeout used to end in a misleading CollectiveTimeout: now it is
    refused first (this cluster never started, so any later check would say so instead)."""
    cluster = Cluster(n=2)
    for call in (
        lambda: cluster.run(print, timeout=timeout),
        lambda: cluster.execute("1", timeout=timeout),
    ):
        with pytest.raises(ConfigError) as exc:
            call()
        _assert_message(exc, "timeout", timeout)
        assert "or None (no limit)" in str(exc.value)


# -- RunSpec ----------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(lr=_FLOATS)
def test_learning_rate_is_a_finite_positive_number(lr: float) -> None:
    if math.isfinite(lr) and lr > 0:
        assert RunSpec(lr=lr).learning_rate == lr
    else:
        with pytest.raises(ConfigError) as exc:
            RunSpec(lr=lr)
        _assert_message(exc, "lr", lr)


@settings(max_examples=100, deadline=None)
@given(
    name=st.sampled_from(["overlap", "checkpointing", "trace", "per_module"]),
    value=st.one_of(st.text(max_size=3), st.integers(), st.none(), st.floats()),
)
def test_switches_must_be_bools(name: str, value: Any) -> None:
    with pytest.raises(ConfigError) as exc:
        RunSpec(**{name: value})
    _assert_message(exc, name, value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"overlap": "no"}, "overlap='no' is not valid: not a bool; use True or False"),
        ({"batch_size": 8.0}, "batch_size=8.0 is not valid: not a whole number"),
        ({"batch_size": MAX_BATCH_SIZE + 1}, f"<= {MAX_BATCH_SIZE}"),
        ({"seed": MAX_SEED + 1}, f"seed={MAX_SEED + 1} is not valid: out of range"),
        ({"seed": -1}, "seed=-1 is not valid: out of range; use an integer >= 0"),
        ({"microbatches": 1.5}, "microbatches=1.5 is not valid: not a whole number"),
        ({"lr": True}, "lr=True is not valid: not a number"),
        ({"model": ["gpt-tiny"]}, "model=\\['gpt-tiny'\\] is not valid; choose one of"),
        (
            {"schedule": {}},
            "schedule={} is not valid; choose one of: '1f1b', 'dualpipe_v', 'gpipe'",
        ),
    ],
)
def test_run_spec_refuses_bad_settings(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RunSpec(**kwargs)


# -- Stepper and Dashboard: refused before a cluster is looked for ----------------------
@settings(max_examples=100, deadline=None)
@given(timeout=_FLOATS.filter(lambda x: not _valid_seconds(x)))
def test_stepper_timeout_is_checked_before_anything_else(timeout: float) -> None:
    from workbench.ui.stepper import Stepper

    # No cluster anywhere: a ClusterError would mean the check came too late.
    with mock.patch("workbench.cluster.cluster._current", []), pytest.raises(ConfigError) as exc:
        Stepper(timeout=timeout)
    _assert_message(exc, "timeout", timeout)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"capacity": -5}, "capacity=-5 is not valid: out of range; use a number of bytes >= 1"),
        ({"capacity": 1.5e9}, "capacity=1500000000.0 is not valid: not a whole number"),
        ({"reference": "yes"}, "reference='yes' is not valid: not a bool"),
        ({"keep_last": 0}, "keep_last=0 is not valid: out of range"),
        ({"checkpoint_every": 2.5}, "checkpoint_every=2.5 is not valid: not a whole number"),
        ({"checkpoint_dir": 3}, "checkpoint_dir=3 is not valid: not a path"),
        ({"overlap": "no"}, "overlap='no' is not valid: not a bool"),
        ({"lr": math.nan}, "lr=nan is not valid: not a finite number"),
        ({"cluster": "local"}, "cluster='local' is not valid: not a Cluster"),
        ({"elastic": "yes"}, "elastic='yes' is not valid: not a bool"),
        (
            {"elastic": True, "model": lambda: None, "data": [], "loss": print},
            "elastic=True is not valid: a run of your own model keeps its world size",
        ),
    ],
)
def test_stepper_refuses_bad_settings(kwargs: dict[str, Any], message: str) -> None:
    from workbench.ui.stepper import Stepper

    no_cluster = mock.patch("workbench.cluster.cluster._current", [])
    with no_cluster, pytest.raises(ConfigError, match=message):
        Stepper(**kwargs)


@pytest.mark.parametrize("interval", [math.nan, math.inf, 0.0, -1.0, 0.01])
def test_dashboard_interval_is_checked_before_the_cluster(interval: float) -> None:
    from workbench.ui.dashboard import Dashboard

    no_cluster = mock.patch("workbench.cluster.cluster._current", [])
    with no_cluster, pytest.raises(ConfigError, match=rf"interval={re.escape(repr(interval))} is"):
        Dashboard(interval=interval)


# -- the hang report reads whatever a status file holds ---------------------------------
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(
    content=st.one_of(
        _JSON.map(json.dumps),
        st.dictionaries(st.sampled_from(["in_flight", "step", "phase"]), _JSON, min_size=1).map(
            json.dumps
        ),
        st.text(max_size=20),
    )
)
def test_hang_report_survives_any_status_file(content: str, tmp_path_factory: Any) -> None:
    run_dir = tmp_path_factory.mktemp("run")
    (run_dir / "rank-00000.json").write_text(content)
    (run_dir / "rank-00001.json").write_text(json.dumps({"step": 3, "phase": "backward"}))
    message, report = hang_report(run_dir, pending=[0, 1], finished=[], timeout=5.0)
    assert report["pending"] == [0, 1]
    assert "rank 1: busy at step 3, phase backward" in message
    status = read_status(run_dir, 0)
    assert status is None or isinstance(status, dict)
    if status is None:
        assert "rank 0: busy, status file unreadable" in message


@pytest.mark.parametrize("content", ["[1, 2]", "7", '"text"', "{not json", '{"in_flight": 5}'])
def test_a_non_object_status_file_is_reported_as_unreadable(content: str, tmp_path: Path) -> None:
    (tmp_path / "rank-00000.json").write_text(content)
    assert read_status(tmp_path, 0) is None
    message, _report = hang_report(tmp_path, pending=[0], finished=[], timeout=1.0)
    assert "rank 0: busy, status file unreadable" in message
    message, _report = hang_report(tmp_path, pending=[1], finished=[], timeout=1.0)
    assert "rank 1: busy, no status (engine on another host?)" in message


@pytest.mark.parametrize(
    "value",
    [10**5000, 10**100, ["node-a"] * 100_000, "x" * 10_000],
    ids=["int", "big", "list", "str"],
)
def test_messages_stay_short_whatever_the_value(value: Any) -> None:
    with pytest.raises(ConfigError) as exc:
        validate.integer("n", value, minimum=1, maximum=64)
    assert len(str(exc.value)) < 200, str(exc.value)[:300]
    assert str(exc.value).startswith("n=")
