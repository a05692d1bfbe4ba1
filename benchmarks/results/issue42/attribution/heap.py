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
    tracemalloc.start(3)
    r0 = process_rss()
    s0 = tracemalloc.take_snapshot()
    st.run(1500)
    gc.collect()
    s1 = tracemalloc.take_snapshot()
    r1 = process_rss()
    print("RSS growth MiB per 1k steps", (r1 - r0) / 2**20 / 1.5)
    diff = s1.compare_to(s0, "filename")
    print("heap growth MiB per 1k", sum(d.size_diff for d in diff) / 2**20 / 1.5)
    for d in diff[:12]:
        kib, objs = d.size_diff / 1.5 / 1024, d.count_diff / 1.5
        print(f"{kib:9.1f} KiB/1k  {objs:8.0f} obj/1k  {d.traceback}")
    st.close()
finally:
    c.stop_sync()
