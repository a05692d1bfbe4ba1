# Measured for the issue 42 follow-up (longrun2); run from the repository root with
# .venv/bin/python benchmarks/results/issue42/attribution/NAME.py (starts a 2-rank cluster).
"""What the ipyparallel client keeps per request after a stepper run."""

from collections import Counter

from workbench.cluster import Cluster
from workbench.parallel import RunSpec
from workbench.session.training import TrainingSession

c = Cluster(n=2, backend="gloo", init_timeout=120)
c.start_sync()
try:
    s = TrainingSession(c, RunSpec(model="mlp-tiny", strategy="dp", batch_size=8))
    s.run(20)
    cl = c.client
    n0 = (len(cl.results), len(cl.metadata), len(cl._futures), len(cl._output_futures))
    s.run(300)
    n1 = (len(cl.results), len(cl.metadata), len(cl._futures), len(cl._output_futures))
    print("results, metadata, futures, output futures before/after 300 steps", n0, n1)
    kinds = Counter(
        type(v).__name__ + (":" + ",".join(sorted(v)[:4]) if isinstance(v, dict) else "")
        for v in cl.results.values()
    )
    print(kinds.most_common(5))
    stale = [m for m in cl.results if m not in cl.outstanding][:3]
    for m in stale:
        md = cl.metadata.get(m)
        print(
            m,
            m in cl._futures,
            m in cl._output_futures,
            md and {k: md.get(k) for k in ("status", "engine_id", "completed", "outputs_ready")},
        )
    s.close()
finally:
    c.stop_sync()
