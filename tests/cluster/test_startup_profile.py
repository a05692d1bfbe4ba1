"""The start-up profile: stage marks in order, per-engine milestones, the engine-side facts.
(That ``%load_ext workbench`` imports no torch is tests/magics/test_load_ext_imports.py.)"""

from __future__ import annotations

import pickle
import pickletools
import time

from workbench.cluster.lifecycle.startup import StartupProfile
from workbench.engine.boot import timed_engine_info


def test_table_lists_stages_in_time_order_with_increments_and_each_engine() -> None:
    profile = StartupProfile(t0=100.0, t0_wall=1000.0)
    profile.stages.update({"process group formed": 3.0, "controller started": 0.5})
    profile.notes["%load_ext workbench: imports"] = 0.25
    profile.engine(1, registered=1.5, answered=2.5, joined=3.0)
    profile.engine_facts(
        1,
        {
            "startup": {
                "process_created_wall": 1000.75,
                "forked_wall": 1001.0,
                "torch_import_s": 0.8,
            }
        },
    )
    profile.engine(0, registered=1.25)
    lines = profile.table().splitlines()
    assert lines[1].split() == ["%load_ext", "workbench:", "imports", "0.25", "s"]
    assert lines[2].split() == ["controller", "started", "0.50", "(+0.50)"]
    assert lines[3].split() == ["process", "group", "formed", "3.00", "(+2.50)"]
    assert lines[4].split()[0] == "engine"
    # engine rows in id order; a milestone not reached shows as "-"
    assert lines[5].split() == ["0", "-", "-", "1.25", "-", "-", "-"]
    assert lines[6].split() == ["1", "0.75", "1.00", "1.50", "0.80", "2.50", "3.00"]


def test_marks_are_seconds_since_the_start() -> None:
    profile = StartupProfile()
    time.sleep(0.01)
    profile.mark("x")
    profile.engine_now(3, "registered")
    assert 0.01 <= profile.stages["x"] < 60
    assert profile.engines[3]["registered"] >= profile.stages["x"]


def test_timed_engine_info_reports_the_process_start_and_torch_import() -> None:
    info = timed_engine_info()
    facts = info["startup"]
    assert info["pid"] > 0 and "host" in info
    assert facts["process_created_wall"] <= time.time()
    assert facts["torch_import_s"] >= 0.0


def test_timed_engine_info_unpickles_without_importing_anything() -> None:
    # The kernel unpickles this reply in the client's IO thread: a torch object in it (as
    # torch.__version__, a TorchVersion, was) imports torch there, ~1 s of every start.
    data = pickle.dumps(timed_engine_info(["pytest"]))
    imports = [
        (op.name, arg)
        for op, arg, _ in pickletools.genops(data)
        if op.name in ("GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "REDUCE", "NEWOBJ")
    ]
    assert imports == []
