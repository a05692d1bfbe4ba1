# Measured for the issue 42 follow-up (longrun2); run from the repository root with
# .venv/bin/python benchmarks/results/issue42/attribution/NAME.py (starts a 2-rank cluster).

"""How many signed messages the kernel's client and each engine's session remember per step."""

from workbench.cluster import Cluster
from workbench.parallel import RunSpec
from workbench.session.training import TrainingSession


def engine_digests():
    from IPython import get_ipython

    return len(get_ipython().kernel.session.digest_history)


c = Cluster(n=2, backend="gloo", init_timeout=120)
c.start_sync()
try:
    s = TrainingSession(c, RunSpec(model="mlp-tiny", strategy="dp", batch_size=8))
    s.run(50)
    k0, e0 = len(c.client.session.digest_history), c.run(engine_digests)
    h0 = len(c.client.history)
    s.run(400)
    k1, e1 = len(c.client.session.digest_history), c.run(engine_digests)
    print(
        "kernel digests per step",
        (k1 - k0) / 400,
        "engines",
        [(b - a) / 400 for a, b in zip(e0, e1, strict=True)],
    )
    print(
        "size limit",
        c.client.session.digest_history_size,
        "client.history",
        len(c.client.history),
        "was",
        h0,
    )
    s.close()
finally:
    c.stop_sync()
