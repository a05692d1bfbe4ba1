"""``%wb trace on`` + ``wb.traced`` in a ``%%wb`` cell: a hand-written DDP loop on the
engines is traced (spans, memory by category, DDP buckets, losses), pulled by cursor into
the kernel, plotted and exported to Perfetto."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import pytest
from IPython.core.error import UsageError

from workbench.cluster import Cluster
from workbench.magics.trace_cmds import trace_log
from workbench.trace import CommEvent, MemorySample, Metric, PhaseSpan

CELL = """
import torch, torch.distributed as dist
import workbench as wb
from torch.nn.parallel import DistributedDataParallel as DDP
torch.manual_seed(0)
net = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)))
opt = torch.optim.SGD(net.parameters(), lr=0.1)
with wb.traced(net, opt) as t:
    for _ in range(3):
        x = torch.randn(4, 8)
        with t.phase("forward"):
            loss = (net(x) ** 2).mean()
        with t.phase("backward"):
            loss.backward()
        with t.phase("optimizer"):
            opt.step(); opt.zero_grad()
        t.step(loss=loss)
"""
N_PARAMS = 8 * 16 + 16 + 16 * 4 + 4


def test_trace_on_and_traced_loop(
    ipython_shell: Any, cluster: Cluster, capsys: Any, tmp_path: Path
) -> None:
    magics = ipython_shell._workbench_magics
    saved = magics.trace_log
    magics.trace_log = None
    assert magics.cluster is cluster  # started from Python, current for the magics too
    try:
        # A new TraceLog pulls what the engines recorded since they started: earlier tests'
        # traced blocks on this shared cluster too. This test counts only its own: a first
        # log takes those (its second pull tells the engines they are taken), the test's
        # own log starts after them. (Slicing one log's events by the count first pulled
        # is not enough: its store keeps only the steps its recording policy selects.)
        drained = trace_log(magics)
        drained.pull()
        drained.pull()
        magics.trace_log = None
        earlier = len(trace_log(magics).events)
        ipython_shell.run_line_magic("wb", "trace on")
        ipython_shell.run_cell_magic("wb", "", CELL)
        ipython_shell.run_line_magic("wb", "trace off")
        ipython_shell.run_cell_magic("wb", "", "y = 1")  # not traced any more
        events = magics.trace_log.events[earlier:]
        spans = Counter((e.rank, e.phase) for e in events if isinstance(e, PhaseSpan))
        for rank in (0, 1):
            assert spans[(rank, "cell")] == 1 and spans[(rank, "traced")] == 1
            assert spans[(rank, "forward")] == 3 and spans[(rank, "backward")] == 3
        buckets = [e for e in events if isinstance(e, CommEvent) and e.source == "ddp-bucket"]
        assert {e.phase for e in buckets} == {"backward"}
        assert sum(e.bytes for e in buckets if e.rank == 0) == 3 * 4 * N_PARAMS
        start = [e for e in events if isinstance(e, MemorySample) and e.label == "start"]
        assert [m.params for m in start] == [4 * N_PARAMS, 4 * N_PARAMS]
        assert len([e for e in events if isinstance(e, Metric)]) == 6
        fig = ipython_shell.run_line_magic("wb", "trace plot memory")
        assert isinstance(fig, go.Figure) and fig.data
        with pytest.raises(UsageError, match="choose one of memory, comm, loss"):
            ipython_shell.run_line_magic("wb", "trace plot speed")
        target = tmp_path / "loop.json"
        capsys.readouterr()
        ipython_shell.run_line_magic("wb", f"trace export {target}")
        assert "traced events to" in capsys.readouterr().out
        names = {e.get("name") for e in json.loads(target.read_text())["traceEvents"]}
        assert {"forward", "backward", "traced"} <= names
    finally:
        magics.trace_log = saved
