"""The stepper's checkpointing checkbox on the user's own model (shared 2-rank cluster)."""

from __future__ import annotations

import cloudpickle
import pytest

from tests.parallel import _user_models as um
from workbench.cluster import Cluster

cloudpickle.register_pickle_by_value(um)


@pytest.mark.engines
def test_the_stepper_checkbox_turns_checkpointing_on_for_your_model(cluster: Cluster) -> None:
    """Off by default; the view's checkbox rebuilds the run with the blocks recomputed, and
    the activations saved for backward drop (the memory figure's category)."""
    import workbench as wb
    from workbench.ui.stepper_view import StepperView

    def peak(stepper: wb.Stepper) -> int:
        return max(e.activations for e in stepper.events if e.kind == "memory" and e.rank == 0)

    base = {"model": um.make_model, "data": um.make_data, "loss": um.lm_loss}
    stepper = wb.Stepper(**base, strategy="dp", cluster=cluster)
    try:
        view = StepperView(stepper)
        box = view.options["checkpointing"]
        assert box.value is False and not box.disabled
        stepper.step()
        plain = peak(stepper)
        box.value = True
        assert stepper.session.spec.checkpointing is True
        stepper.step()
        assert 0 < peak(stepper) < plain
    finally:
        stepper.close()
    named = wb.Stepper(**base, strategy="dp", checkpointing="blocks.*", cluster=cluster)
    try:
        assert StepperView(named).options["checkpointing"].disabled  # names: not a checkbox's
    finally:
        named.close()
