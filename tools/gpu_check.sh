#!/usr/bin/env bash
# make gpu-check: install what the GPU checks need, run the tests marked `gpu` (tests/gpu/ and
# the collective tracer's CUDA test), write benchmarks/results/gpu/gpu-check.{json,md}.
# One run, on one GPU machine.
#
#   tools/gpu_check.sh                     # build .venv-gpu, install, run the checks
#   tools/gpu_check.sh --dry-run           # print the install commands and run none of them;
#                                          # resolve the same requirements with pip --dry-run,
#                                          # run the checks in .venv (they skip without CUDA)
#   tools/gpu_check.sh --wheels DIR        # no package index there: install from DIR only
#   tools/gpu_check.sh --fetch-wheels DIR  # where the index is: the wheels --wheels needs
#
# Where torch comes from. If $GPU_PYTHON (default python3) already has a CUDA build of
# torch (a GPU machine's own image), .venv-gpu sees that interpreter's packages (a .pth
# file naming its site-packages) and keeps its torch: nothing of CUDA is installed. Else
# torch==2.13.0 is installed through constraints.txt from the package index, which on
# Linux x86_64 serves the CUDA build, its nvidia-* and triton dependencies pinned exactly
# by torch's own metadata. (`make venv`'s CPU build comes from a local wheel directory,
# pip's find-links, never from the index.) The project's other packages: those of
# constraints.txt that the GPU checks import (no JupyterLab, no mpi4py).
#
# GPU_KEEP_TORCH=1 keeps $GPU_PYTHON's torch even when it is a CPU build: a rehearsal of
# the install on a CPU machine, which then stops at the CUDA check.
set -euo pipefail
cd "$(dirname "$0")/.."

DRY=0
WHEELS=""
FETCH=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --wheels) WHEELS="${2:?--wheels needs a directory}"; shift ;;
    --fetch-wheels) FETCH="${2:?--fetch-wheels needs a directory}"; shift ;;
    *) echo "gpu_check.sh: unknown option '$1'; valid: --dry-run, --wheels DIR," \
            "--fetch-wheels DIR" >&2
       exit 2 ;;
  esac
  shift
done

GPU_PYTHON="${GPU_PYTHON:-python3}"
GPU_VENV="${GPU_VENV:-.venv-gpu}"
RESULTS="${WB_GPU_RESULTS:-benchmarks/results/gpu}"
# What the GPU checks import beyond torch and numpy: the package's own dependencies
# (pyproject.toml) and the test runner. The package itself comes from this tree (-e .).
NEEDS=(ipyparallel ipython ipykernel ipywidgets plotly anywidget psutil cloudpickle
       pytest pytest-timeout)

run() {  # print a command; run it unless this is a dry run
  echo "+ $*"
  [ "$DRY" = 1 ] || "$@"
}

if [ -n "$FETCH" ]; then
  # Wheels of NEEDS and all they depend on, at constraints.txt's versions, for the GPU
  # machine's Python (GPU_PY_VERSION, default 3.12: the H200 image's).
  run "${PYTHON:-python3}" -m pip download -q --only-binary=:all: \
    --python-version "${GPU_PY_VERSION:-3.12}" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -c constraints.txt -d "$FETCH" "${NEEDS[@]}"
  run du -sh "$FETCH"
  exit 0
fi

venv_site() {  # the venv's site-packages (its Python is GPU_PYTHON's version)
  echo "$GPU_VENV/lib/python$("$GPU_PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')/site-packages"
}

has_cuda_torch() {
  "$1" -c 'import torch, sys; sys.exit(0 if torch.version.cuda else 1)' 2>/dev/null
}

echo "== gpu-check: install into $GPU_VENV (from $GPU_PYTHON)"
TORCH=()
if has_cuda_torch "$GPU_PYTHON" || [ "${GPU_KEEP_TORCH:-0}" = 1 ]; then
  echo "   $GPU_PYTHON has torch ($("$GPU_PYTHON" -c 'import torch; print(torch.__version__)'))" \
       "built for CUDA $("$GPU_PYTHON" -c 'import torch; print(torch.version.cuda)'): kept"
  run "$GPU_PYTHON" -m venv "$GPU_VENV"
  # The new venv sees the interpreter's own packages, also when that is itself a venv
  # (--system-site-packages would reach only the base Python's).
  SITE=$("$GPU_PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "+ echo $SITE > $(venv_site)/_gpu_python.pth"
  [ "$DRY" = 1 ] || echo "$SITE" > "$(venv_site)/_gpu_python.pth"
else
  echo "   $GPU_PYTHON has no CUDA build of torch: torch==2.13.0 (CUDA) from the package index"
  run "$GPU_PYTHON" -m venv "$GPU_VENV"
  TORCH=(torch==2.13.0 numpy)
fi
PIP=("$GPU_VENV/bin/python" -m pip install -q)
if [ -n "$WHEELS" ]; then
  # No index: only DIR; no -c, so what the kept interpreter already has stays as it is and
  # only what is missing comes from DIR (fetched at constraints.txt's versions).
  run "${PIP[@]}" --no-index --find-links "$WHEELS" "${TORCH[@]}" "${NEEDS[@]}"
  # The package from this tree without building it (which would need setuptools there):
  # a .pth file puts the tree on the venv's path, as an editable install does.
  echo "+ echo $PWD > $(venv_site)/_workbench_tree.pth"
  [ "$DRY" = 1 ] || echo "$PWD" > "$(venv_site)/_workbench_tree.pth"
else
  if [ ${#TORCH[@]} -gt 0 ]; then run "${PIP[@]}" -c constraints.txt "${TORCH[@]}"; fi
  run "${PIP[@]}" -c constraints.txt -e . "${NEEDS[@]}"
fi

PY="$GPU_VENV/bin/python"
if [ "$DRY" = 1 ]; then
  PY=".venv/bin/python"  # the CPU venv: the checks are collected and skip without CUDA
  echo "== dry run: the same requirements resolved in $PY (pip --dry-run, nothing installed)"
  # (its output, setuptools' warnings included, is shown only when it fails)
  if ! out=$("$PY" -m pip install -q --dry-run -c constraints.txt -e . "${NEEDS[@]}" 2>&1); then
    echo "$out" >&2
    exit 1
  fi
  echo "   resolved: every requirement is met at constraints.txt's versions"
elif ! has_cuda_torch "$PY"; then
  echo "gpu-check: torch in $GPU_VENV is not a CUDA build" \
       "($("$PY" -c 'import torch; print(torch.__version__)')); the checks need one:" \
       "a GPU_PYTHON with CUDA torch, or a package index that serves it" >&2
  exit 1
fi

echo "== gpu-check: tests/gpu (results under $RESULTS)"
"$PY" -c 'import torch; print("   torch", torch.__version__, "CUDA", torch.version.cuda)'
WB_GPU_RESULTS="$RESULTS" PYTHONUNBUFFERED=1 "$PY" -m pytest -q -p no:cacheprovider -p tests.gpu.report -rs \
  -m gpu -o timeout=300 tests/gpu tests/trace/test_comm.py
