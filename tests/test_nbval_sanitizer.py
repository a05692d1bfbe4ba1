"""Every rule of the shipped nbval sanitizer, on what the workbench (or the library it
masks) really prints: two outputs that differ only in what legitimately changes between
runs (hosts, pids, ports, timings, paths, library versions) compare equal after it, and an
output that differs in substance (a rank's state, the bytes of a collective) does not.
Also: nbval reads every rule the file holds, the ``nbval-config`` command, and the
merged file the ``--nbval-workbench`` plugin hands nbval."""

from __future__ import annotations

import asyncio
import io
import logging
import re
import warnings
from pathlib import Path
from typing import Any

import pytest

from workbench.cli import main
from workbench.cluster.dispatch.hang import hang_report, lost_engines_error
from workbench.cluster.dispatch.health import status_rows
from workbench.cluster.hosts.rendezvous import check_reachable
from workbench.cluster.ranks import RankAssignment
from workbench.errors import ClusterError, RankError
from workbench.magics.tables import start_banner, status_table
from workbench.nbval import SANITIZER, host_rule, merged_rules, read_rules, sanitize

RULES = read_rules(SANITIZER.read_text())
SECTIONS = re.findall(r"^\[([\w-]+)\]$", SANITIZER.read_text(), re.MULTILINE)


def clean(text: str) -> str:
    return sanitize(text, RULES)


def _ranks(
    hosts: list[str], pids: list[int], port: int = 29500, addr: str = "10.0.0.12"
) -> list[RankAssignment]:
    return [
        RankAssignment(
            rank=i,
            world_size=len(hosts),
            local_rank=0,
            local_world_size=1,
            node_rank=i,
            num_nodes=len(hosts),
            engine_id=i,
            host=h,
            pid=p,
            master_addr=addr,
            master_port=port,
            backend="gloo",
            device="cpu",
            threads=1,
        )
        for i, (h, p) in enumerate(zip(hosts, pids, strict=True))
    ]


class _Client:
    """What ``status_rows`` reads of ipyparallel's client: live engine ids, queues."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    def queue_status(self, verbose: bool = False) -> dict[int, Any]:
        return {i: {"queue": 0, "tasks": 0} for i in self.ids}


HERE = ["node-a", "node-b"]
THERE = ["gpu-worker-17.cluster.example.org", "gpu-worker-18.cluster.example.org"]


def test_nbval_reads_every_rule_the_file_holds() -> None:
    from nbval.plugin import get_sanitize_patterns

    assert len(get_sanitize_patterns(SANITIZER.read_text())) == len(SECTIONS) == len(RULES)


def test_every_rule_has_a_test_here() -> None:
    tested = {name for name, tests in RULE_TESTS.items() if all(t in globals() for t in tests)}
    assert set(SECTIONS) == set(RULE_TESTS) == tested


def test_status_table_hosts_pids_and_padding() -> None:
    a = status_table(status_rows(_ranks(HERE, [11810, 11806]), _Client([0, 1])))
    b = status_table(status_rows(_ranks(THERE, [7, 1234567]), _Client([0, 1])))
    one_dead = status_table(status_rows(_ranks(HERE, [11810, 11806]), _Client([0])))
    assert "node-a" in a and "11810" in a
    assert clean(a) == clean(b)
    assert clean(a) != clean(one_dead)  # a rank's state is what the table is for
    assert "node-a" not in clean(a) and "11810" not in clean(a)


def test_start_banner_is_compared_as_it_is() -> None:
    banner = start_banner(_ranks(HERE, [1, 2]))
    assert banner == "workbench: 2 ranks on 2 host(s), backend gloo, device cpu"
    assert clean(banner) == banner.replace(" ", "_")
    assert clean(banner) != clean(start_banner(_ranks(["node-a"], [1])))


def test_lost_engine_message_masks_host_and_pid() -> None:
    a = str(lost_engines_error(_ranks(HERE, [4242, 4243]), [1], None))
    b = str(lost_engines_error(_ranks(THERE, [99, 100001]), [1], None))
    assert "engine 1 on node-b, pid 4243" in a
    assert clean(a) == clean(b)
    assert clean(a) != clean(str(lost_engines_error(_ranks(HERE, [4242, 4243]), [0], None)))


def test_rank_failure_heading_masks_the_host() -> None:
    from workbench.session.rank_failures import rank_failure
    from workbench.session.run_state import RankStatus

    class Cluster:
        def __init__(self, hosts: list[str]) -> None:
            self.ranks, self.world_size = _ranks(hosts, [1, 2]), len(hosts)

    tb = "Traceback (most recent call last):\nValueError: boom"
    status = {1: RankStatus(rank=1, step=3, next_phase="forward")}
    a = str(rank_failure(RankError.from_failures({1: tb}), status, Cluster(HERE)))  # type: ignore[arg-type]
    b = str(rank_failure(RankError.from_failures({1: tb}), status, Cluster(THERE)))  # type: ignore[arg-type]
    assert a.startswith("rank 1 on node-b failed in phase 'forward' of step 3")
    assert clean(a) == clean(b)


def test_hosts_named_in_start_errors() -> None:
    class Refuses:
        def __getitem__(self, engine_id: int) -> Any:
            raise OSError("cannot assign requested address")

    def message(hosts: list[str]) -> str:
        with pytest.raises(ClusterError) as info:
            asyncio.run(check_reachable(Refuses(), _ranks(hosts, [1, 2])))
        return str(info.value)

    a, b = message(HERE), message(THERE)
    assert "on rank 0's host node-a:" in a
    assert clean(a) == clean(b)


def test_host_labels_of_ranks_across_hosts() -> None:
    # The label of a rank's output when the cluster spans hosts: "[host:rank N]".
    a = "[node-a:rank 0]\nloss 4.1\n[node-b:rank 1]\nloss 4.1\n"
    b = "[gpu-worker-17:rank 0]\nloss 4.1\n[gpu-worker-18:rank 1]\nloss 4.1\n"
    assert clean(a) == clean(b)
    assert clean(a) != clean(a.replace("rank 1]", "rank 2]"))


def test_this_machines_host_name_is_masked_wherever_it_appears() -> None:
    rule = host_rule("ci-runner-7.example.org")
    assert rule is not None
    both = [rule, *RULES]
    printed = "platform.node() = ci-runner-7 (ci-runner-7.example.org); ci-runner-70 is not"
    assert sanitize(printed, both) == "platform.node()_=_HOST_(HOST);_ci-runner-70_is_not"
    assert host_rule("vm") is None  # too short to mask everywhere: only where a host is named
    merged = merged_rules(host="ci-runner-7")
    assert "[this-host]" in merged and read_rules(merged)[0] == host_rule("ci-runner-7")


def _transformers_warnings() -> str:
    """What building a GPT-2 from a small config writes to stderr (transformers' logger)."""
    pytest.importorskip("transformers")
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("[transformers] %(message)s"))
    logger = hf_logging.get_logger("transformers")
    logger.addHandler(handler)
    # transformers says some of these once per process (warning_once): earlier tests in the
    # same process may have had them, so forget what was said
    hf_logging.warning_once.cache_clear()
    hf_logging.info_once.cache_clear()
    try:
        GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=32))
    finally:
        logger.removeHandler(handler)
    return stream.getvalue()


def test_library_warnings_are_compared_by_their_presence() -> None:
    hf = _transformers_warnings()
    assert "bos_token_id" in hf  # what the README's GPT-2 writes on every rank
    with warnings.catch_warnings():
        py = warnings.formatwarning("`torch.jit` is deprecated", DeprecationWarning, "/x/y.py", 3)
    other_version = "[transformers] The config attribute `n_ctx` is deprecated.\n"
    assert clean(hf + py) == clean(other_version) == "LIBRARY-WARNING\n"
    assert clean(hf + "done\n") != clean("done\n")  # that a warning came still counts


def test_progress_bars() -> None:
    tqdm = pytest.importorskip("tqdm").tqdm

    def bar(n: int, elapsed: float) -> str:  # what tqdm prints, at n of 4 after elapsed s
        return str(tqdm.format_meter(n=n, total=4, elapsed=elapsed, ascii=True))

    assert "4/4" in bar(4, 0.5) and bar(4, 0.5) != bar(4, 12.7)
    assert clean("loading: " + bar(4, 0.5)) == clean("loading: " + bar(4, 12.7))
    assert clean("loading: " + bar(4, 0.5)) == "loading:_PROGRESS"
    assert clean(str(tqdm.format_meter(n=3, total=None, elapsed=0.3))) == "PROGRESS"


def test_timings_of_the_start_up_profile() -> None:
    from workbench.cluster.lifecycle.startup import StartupProfile

    def table(scale: float) -> str:
        profile = StartupProfile()
        profile.notes["%load_ext workbench: imports"] = 0.31 * scale
        profile.stages = {"controller": 0.4 * scale, "engines registered": 1.9 * scale}
        profile.engines = {0: {"registered": 1.2 * scale, "torch_import_s": 0.0}}
        return profile.table()

    a, b = table(1.0), table(3.7)
    assert "0.31 s" in a
    assert clean(a) == clean(b)
    assert "engines_registered" in clean(a)


def test_rates_of_calibrate() -> None:
    a, b = "bandwidth B = 1.234 GB/s (rms error 3%)", "bandwidth B = 0.870 GB/s (rms error 3%)"
    assert clean(a) == clean(b) == "bandwidth_B_=_RATE_(rms_error_3%)"


def test_addresses_and_ports_of_a_cluster() -> None:
    from workbench.cluster import Cluster
    from workbench.cluster.world import World

    def shown(port: int) -> str:
        cluster = Cluster(n=2)
        cluster._set_world(World(tuple(_ranks(HERE, [1, 2], port=port, addr="127.0.0.1"))))
        env = "\n".join(f"{k}={v}" for k, v in cluster.ranks[1].env().items())
        return f"{cluster!r}\n{env}"

    a, b = shown(29500), shown(41234)
    assert "master=127.0.0.1:29500" in a and "MASTER_PORT=29500" in a
    assert clean(a) == clean(b)
    assert "ADDRESS:PORT" in clean(a) and "MASTER_PORT=PORT" in clean(a)


def test_pids_and_temp_paths_in_messages(tmp_path: Path) -> None:
    import tempfile

    saved = f"workbench: saved step 3 to {tempfile.mkdtemp(dir=tmp_path)}/step-00000003"
    other = "workbench: saved step 3 to /private/var/folders/xy/T/tmpa1b2/step-00000003"
    assert clean(saved) == clean(other) == "workbench:_saved_step_3_to_TMPPATH"
    assert clean("watchdog pid=4242") == clean("watchdog pid 77") == "watchdog_pid_PID"


def test_hang_report_keeps_what_matters(tmp_path: Path) -> None:
    import json

    from workbench.engine.hang import status_path

    def report(nbytes: int) -> str:
        flight = {
            "op": "all_reduce",
            "bytes": nbytes,
            "group_size": 2,
            "source": "user",
            "step": 0,
            "phase": "",
        }
        status = {"rank": 0, "pid": 4242, "step": 0, "phase": "", "in_flight": [flight]}
        status_path(tmp_path, 0).write_text(json.dumps(status))
        status_path(tmp_path, 1).write_text(json.dumps({**status, "rank": 1, "in_flight": []}))
        return hang_report(tmp_path, [0], [1], 5.0)[0]

    a = report(32)
    assert "rank 0: waits in all_reduce (32 bytes" in a
    assert clean(a) == clean(report(32))
    assert clean(a) != clean(report(64))  # what hung is the report's substance
    assert "timeout=DURATION" in clean(a)


def test_hex_addresses_and_plotly_versions() -> None:
    assert clean(repr(object())) == clean(repr(object())) == "<object_object_at_0xADDRESS>"
    import plotly
    import plotly.graph_objects as go

    html = go.Figure().to_html(include_plotlyjs="cdn", full_html=False, div_id="fig")
    assert "plotly-" in html
    other = re.sub(r"plotly-\d+\.\d+\.\d+", "plotly-9.9.9", html)
    assert clean(html) == clean(other)
    assert plotly.__version__


def test_nbval_config_prints_the_sanitizers_path(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["nbval-config"]) == 0
    assert Path(capsys.readouterr().out.strip()) == SANITIZER
    assert SANITIZER.is_file()


def test_merged_rules_put_the_users_first_and_check_them() -> None:
    own = "[mine]\nregex: loss \\d+\\.\\d+\nreplace: loss LOSS\n"
    rules = read_rules(merged_rules(own, host="vm"))
    assert rules[0] == ("loss \\d+\\.\\d+", "loss LOSS")
    assert rules[1:] == RULES  # no host rule for a short name; then the shipped ones
    assert sanitize("loss 4.13  (0.2 s)", rules) == "loss_LOSS_(DURATION)"
    with pytest.raises(ValueError, match="2 'regex:' lines but nbval reads 1 rules"):
        merged_rules(own + "regex: dropped\nreplace:\n")  # no space after the colon


# rule -> the tests above that exercise it on real output
RULE_TESTS: dict[str, tuple[str, ...]] = {
    "status-row": ("test_status_table_hosts_pids_and_padding",),
    "rank-host": (
        "test_lost_engine_message_masks_host_and_pid",
        "test_rank_failure_heading_masks_the_host",
    ),
    "host-label": ("test_host_labels_of_ranks_across_hosts",),
    "host-word": ("test_hosts_named_in_start_errors",),
    "library-warnings": ("test_library_warnings_are_compared_by_their_presence",),
    "library-warnings-once": ("test_library_warnings_are_compared_by_their_presence",),
    "progress-bars": ("test_progress_bars",),
    "profile-stages": ("test_timings_of_the_start_up_profile",),
    "profile-engines": ("test_timings_of_the_start_up_profile",),
    "load-average": ("test_timings_of_the_start_up_profile",),
    "durations": ("test_timings_of_the_start_up_profile", "test_hang_report_keeps_what_matters"),
    "rates": ("test_rates_of_calibrate",),
    "ports": ("test_addresses_and_ports_of_a_cluster",),
    "port-words": ("test_addresses_and_ports_of_a_cluster",),
    "pids": ("test_pids_and_temp_paths_in_messages", "test_lost_engine_message_masks_host_and_pid"),
    "temp-paths": ("test_pids_and_temp_paths_in_messages",),
    "hex-addresses": ("test_hex_addresses_and_plotly_versions",),
    "plotly-version": ("test_hex_addresses_and_plotly_versions",),
    "whitespace": (
        "test_status_table_hosts_pids_and_padding",
        "test_start_banner_is_compared_as_it_is",
    ),
}
