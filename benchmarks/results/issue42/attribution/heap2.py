# Measured for the issue 42 follow-up (longrun2); run from the repository root with
# .venv/bin/python benchmarks/results/issue42/attribution/NAME.py (starts a 2-rank cluster).

"""Where the kernel's Python heap grows over a stepper run (tracemalloc, top lines)."""

import gc
import tracemalloc

from workbench.cluster import Cluster
from workbench.trace.storage import process_rss
from workbench.ui.stepper import Stepper

c = Cluster(n=2, backend="gloo", init_timeout=120)
c.start_sync()
try:
    st = Stepper(model="gpt-tiny", strategy="dp", cluster=c, batch_size=8)
    st.run(200)
    gc.collect()
    tracemalloc.start(12)
    r0 = process_rss()
    s0 = tracemalloc.take_snapshot()
    st.run(600)
    gc.collect()
    s1 = tracemalloc.take_snapshot()
    r1 = process_rss()
    print("RSS growth MiB per 1k steps", (r1 - r0) / 2**20 / 0.6)
    diff = [
        d
        for d in s1.compare_to(s0, "traceback")
        if "serialize" in str(d.traceback) or "events.py" in str(d.traceback)
    ]
    print("heap growth MiB per 1k", sum(d.size_diff for d in diff) / 2**20 / 0.6)
    for d in diff[:6]:
        kib, objs = d.size_diff / 0.6 / 1024, d.count_diff / 0.6
        print(f"{kib:9.1f} KiB/1k  {objs:8.0f} obj/1k")
        print("\n".join(d.traceback.format()[-12:]))
    st.close()
finally:
    c.stop_sync()
