"""``%wb step | plot | trace`` drive the current stepper."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import pytest
from IPython.core.error import UsageError

from workbench.cluster import Cluster
from workbench.ui import stepper as stepper_module
from workbench.ui.stepper import Stepper


def test_without_a_stepper_is_a_usage_error(ipython_shell: Any) -> None:
    saved = list(stepper_module._current)
    stepper_module._current.clear()
    try:
        with pytest.raises(UsageError, match="no stepper yet"):
            ipython_shell.run_line_magic("wb", "step")
    finally:
        stepper_module._current[:] = saved


def test_step_plot_and_export(
    ipython_shell: Any, cluster: Cluster, capsys: Any, tmp_path: Path
) -> None:
    stepper = Stepper(model="mlp-tiny", strategy="dp", batch_size=8, cluster=cluster)
    try:
        ipython_shell.run_line_magic("wb", "step --phase -n 2")
        out = capsys.readouterr().out.splitlines()
        assert out == [
            "[rank 0] step 0, next phase backward, loss -",
            "[rank 1] step 0, next phase backward, loss -",
        ]
        ipython_shell.run_line_magic("wb", "step -n 2")
        assert [s.step for s in stepper.status] == [2, 2]
        capsys.readouterr()
        fig = ipython_shell.run_line_magic("wb", "plot loss")
        assert isinstance(fig, go.Figure)
        # DDP ranks step the same global loss: one legend entry says the curves are identical
        legend = sorted(t.name for t in fig.data if t.showlegend is not False)
        assert legend == ["ranks 0–1 identical"] and len(fig.data) == 2
        with pytest.raises(UsageError, match="invalid choice: 'speed'"):
            ipython_shell.run_line_magic("wb", "plot speed")
        with pytest.raises(
            UsageError, match="-n 0 is not valid: out of range; use a number of steps >= 1"
        ):
            ipython_shell.run_line_magic("wb", "step -n 0")
        target = tmp_path / "trace.json"
        ipython_shell.run_line_magic("wb", f"trace export {target}")
        assert "events to" in capsys.readouterr().out
        assert json.loads(target.read_text())["traceEvents"]
    finally:
        stepper.close()


@pytest.mark.engines
def test_step_after_stop_names_the_magic_to_run(ipython_shell: Any, capsys: Any) -> None:
    """After ``%wb stop`` the stepper's engines are gone: ``%wb step`` and ``%wb checkpoint``
    say so in magic terms (not ``start_sync()``), before touching the cluster."""
    magics = ipython_shell._workbench_magics
    saved_steppers = list(stepper_module._current)
    try:
        ipython_shell.run_line_magic("wb", "start -n 2 --backend gloo")
        # Held here: the magics see the current stepper only while someone holds it.
        stepper = Stepper(model="mlp-tiny", strategy="dp", batch_size=8, cluster=magics.cluster)
        ipython_shell.run_line_magic("wb", "stop")
        capsys.readouterr()
        for line in ("step", "step --phase", "checkpoint list", "checkpoint save"):
            with pytest.raises(UsageError) as exc:
                ipython_shell.run_line_magic("wb", line)
            text = str(exc.value)
            assert "the current stepper's cluster is stopped" in text
            assert "`%wb start -n 2`" in text and "start_sync" not in text
        assert stepper.cluster.state == "stopped"
    finally:
        for started in magics.started:
            started.stop_sync()
        stepper_module._current[:] = saved_steppers
