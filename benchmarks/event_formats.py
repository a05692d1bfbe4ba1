"""Which file holds a long run's events (issue 42): sqlite (``trace.event_file``, stdlib)
against Arrow IPC and Parquet (pyarrow), on the same synthetic DDP events.

    PYTHONPATH=<dir with pyarrow> .venv/bin/python -m benchmarks.event_formats [--steps N]

For each format: seconds to append the events step by step (what the store does as steps
leave the window), seconds to read one 10-step window back (a zoom) and all of it (an
export), and the file's size. pyarrow is not a workbench dependency; without it only sqlite
is measured.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

__all__ = ["main"]


def _events(steps: int) -> list[list[Any]]:
    from workbench.plots import synthetic_events
    from workbench.plots.synthetic import at_step

    base = synthetic_events(steps=1, world_size=2)
    return [at_step(base, step) for step in range(steps)]


def _sqlite(batches: list[list[Any]], where: Path) -> dict[str, float]:
    from workbench.trace.event_file import EventFile

    f = EventFile(where / "events.sqlite")
    start = time.perf_counter()
    for batch in batches:
        f.write(batch)
    write = time.perf_counter() - start
    mid = len(batches) // 2
    start = time.perf_counter()
    window = f.read(mid, mid + 9)
    zoom = time.perf_counter() - start
    start = time.perf_counter()
    everything = f.read()
    read = time.perf_counter() - start
    f.close()
    size = sum(p.stat().st_size for p in where.glob("events.sqlite*"))
    assert len(everything) == sum(len(b) for b in batches) and window
    return {"write_s": write, "zoom_s": zoom, "read_all_s": read, "bytes": size}


def _arrow(batches: list[list[Any]], where: Path, parquet: bool) -> dict[str, float]:
    import pyarrow as pa
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    from workbench.trace.events import CommEvent, MemorySample, Metric, PhaseSpan

    classes = (PhaseSpan, MemorySample, CommEvent, Metric)
    names = {c: [f.name for f in fields(c)] for c in classes}
    writers: dict[type, Any] = {}
    paths = {c: where / f"{c.kind}.{'parquet' if parquet else 'arrow'}" for c in classes}
    start = time.perf_counter()
    for batch in batches:  # one record batch per kind per step, as the store would write
        by_kind: dict[type, list[Any]] = {}
        for e in batch:
            by_kind.setdefault(type(e), []).append(e)
        for cls, events in by_kind.items():
            cols = {n: [getattr(e, n) for e in events] for n in names[cls]}
            table = pa.table(cols)
            if cls not in writers:
                writers[cls] = (
                    pq.ParquetWriter(paths[cls], table.schema)
                    if parquet
                    else ipc.new_file(paths[cls], table.schema)
                )
            writers[cls].write_table(table) if parquet else writers[cls].write(table)
    for w in writers.values():
        w.close()
    write = time.perf_counter() - start
    mid = len(batches) // 2

    def read(first: int | None = None) -> int:
        n = 0
        for cls in writers:
            if parquet:
                filters = [("step", ">=", first), ("step", "<=", first + 9)] if first else None
                table = pq.read_table(paths[cls], filters=filters)
            else:
                table = ipc.open_file(paths[cls]).read_all()
                if first:
                    import pyarrow.compute as pc

                    mask = pc.and_(
                        pc.greater_equal(table["step"], first),
                        pc.less_equal(table["step"], first + 9),
                    )
                    table = table.filter(mask)
            rows = table.to_pylist()
            n += len([cls(**r) for r in rows])
        return n

    start = time.perf_counter()
    assert read(mid)
    zoom = time.perf_counter() - start
    start = time.perf_counter()
    assert read() == sum(len(b) for b in batches)
    everything = time.perf_counter() - start
    size = sum(p.stat().st_size for p in paths.values())
    return {"write_s": write, "zoom_s": zoom, "read_all_s": everything, "bytes": size}


def main(argv: list[str] | None = None) -> int:
    from benchmarks.long_run import write_json

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    batches = _events(args.steps)
    result: dict[str, Any] = {"steps": args.steps, "events": sum(len(b) for b in batches)}
    with tempfile.TemporaryDirectory() as tmp:
        result["sqlite"] = _sqlite(batches, Path(tmp))
    try:
        import pyarrow

        result["pyarrow"] = pyarrow.__version__
        for name, parquet in (("arrow_ipc", False), ("parquet", True)):
            with tempfile.TemporaryDirectory() as tmp:
                result[name] = _arrow(batches, Path(tmp), parquet)
    except ImportError:
        result["pyarrow"] = None
    print(json.dumps(result, indent=1))
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
