"""Code that runs on the engines: one process per rank, driven by the kernel through ipyparallel.

Everything here is imported *on the engine* from the installed package (the kernel ships
calls by module and function name): joining the process group, the out-of-band status
thread, driving a training run, the traced loop's recorder, the equivalence check. The
kernel side lives in ``workbench.cluster`` (engines, ranks, dispatch) and
``workbench.session`` (training runs).
"""
