"""Engine-side equivalence check: this run's full parameters against the single-device run."""

from __future__ import annotations

from typing import Any

from workbench.engine.run_slot import current_run

__all__ = ["compare_user_with_reference", "compare_with_reference"]


def compare_with_reference() -> dict[str, Any] | None:
    """Collective (call on every rank): gather the full parameters and, on rank 0, compare
    them with a single-device run of the same spec for the same number of steps.

    Returns ``{"max_param_diff", "max_loss_diff", "steps", "params"}`` on rank 0, None elsewhere.
    """
    from workbench.parallel import reference_losses_and_params

    return _compare(reference_losses_and_params)


def compare_user_with_reference() -> dict[str, Any] | None:
    """``compare_with_reference`` for a run of the user's own model (``UserRun``)."""
    from workbench.parallel.user_model import user_reference

    return _compare(user_reference)


def _compare(reference: Any) -> dict[str, Any] | None:
    from workbench.parallel import full_state_dict

    train_step = current_run()
    full = full_state_dict(train_step)
    if full is None:
        return None
    steps = train_step.step
    ref_losses, ref_params = reference(train_step.spec, steps)
    missing = sorted(set(ref_params) ^ set(full))
    if missing:
        raise RuntimeError(f"parameter names differ from the single-device model: {missing}")
    diff = max(float((full[k] - ref_params[k]).abs().max()) for k in ref_params)
    # The recorder lets events go once pulled; the run keeps every step's loss (NaN
    # before a restored step: not compared).
    pairs = zip(train_step.losses, ref_losses, strict=False)
    loss_diff = max((abs(a - b) for a, b in pairs if a == a), default=0.0)
    return {
        "max_param_diff": diff,
        "max_loss_diff": loss_diff,
        "steps": steps,
        "params": sum(int(v.numel()) for v in full.values()),
    }
