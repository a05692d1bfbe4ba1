"""Launching a cluster's engines and controller: how each process gets started.

``launchers`` (the options every launcher shares, the ipyparallel settings built from them
and the checks that make a launcher's failure one sentence), one module per way to start
engines (``fork``: a local cluster forked from one process; ``ssh``; ``slurm``: one job per
engine; ``mpi``: what is checked before mpiexec runs) and ``warm`` (taking over the
processes the workbench kernel started ahead: ``warm_start``, ``warm_controller``), and the
``standby``, a warm replacement engine forked ahead. What a started cluster does with its
engines lives beside this package, in ``workbench.cluster``.
"""
