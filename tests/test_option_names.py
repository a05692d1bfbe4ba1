"""A mistyped option name is the workbench's ConfigError naming the nearest valid name and
listing them, at every entry point that takes options, before any process starts."""

from __future__ import annotations

import pytest

from workbench.errors import ConfigError


def test_stepper_names_the_nearest_option() -> None:
    from workbench.ui.stepper import Stepper

    with pytest.raises(ConfigError, match="did you mean 'microbatches'") as info:
        Stepper(model="gpt-tiny", strategy="pp", micro_batches=4)
    assert "'micro_batches'" in str(info.value) and "schedule" in str(info.value)


def test_compare_names_the_nearest_option() -> None:
    from workbench.compare import compare

    with pytest.raises(ConfigError, match="did you mean 'steps'"):
        compare(model=None, data=None, loss=None, step=4)
    with pytest.raises(ConfigError, match="did you mean 'microbatches'"):
        compare(model=None, data=None, loss=None, strategies=[{"pp": 2, "micro_batches": 4}])


def test_plan_names_the_nearest_option() -> None:
    from workbench.planner import plan

    with pytest.raises(ConfigError, match="did you mean 'micro_batches'") as info:
        plan("llama2-7b", gpus=8, microbatches=4)
    assert "valid options:" in str(info.value)


def test_magic_step_names_the_nearest_flag() -> None:
    from IPython.core.error import UsageError

    from workbench.magics.args import MagicParser
    from workbench.magics.registry import COMMANDS

    parser = MagicParser(prog="%wb step")
    COMMANDS["step"].parser(parser)
    with pytest.raises(ConfigError, match="did you mean '--phase'") as info:
        parser.parse(["--phases"])
    assert isinstance(info.value, UsageError)  # IPython shows it as a usage error
