"""``workbench kernel install``: the "Python 3 (workbench)" kernel spec.

The kernel is IPython's, started by ``workbench.kernel_launcher``, which first starts a
local cluster's engine forker (it imports torch) and controller, so ``%wb start`` does not
wait for their imports. Installed with jupyter_client's own installer: into this
environment (``--sys-prefix``, the default, where this environment's JupyterLab looks),
the user's Jupyter directory (``--user``) or a prefix (``--prefix``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from workbench.cli.kernel_logo import write_logos
from workbench.errors import ConfigError

__all__ = ["DEFAULT_NAME", "install", "kernel_json", "register"]

DEFAULT_NAME = "workbench"
DISPLAY_NAME = "Python 3 (workbench)"
# What jupyter_client accepts as a kernel spec's directory name.
_NAME = re.compile(r"^[a-z0-9._-]+$", re.IGNORECASE)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "kernel",
        help="install the workbench's Jupyter kernel (a local cluster's processes started ahead)",
        description="Install the 'Python 3 (workbench)' kernel spec: IPython's kernel, "
        "with a local cluster's engine forker (importing torch) and controller started as "
        "the kernel starts. Notebooks run the same in it and in the plain Python kernel.",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    inst = actions.add_parser("install", help="install the kernel spec")
    inst.add_argument("--name", default=DEFAULT_NAME, help="kernel spec name (default workbench)")
    inst.add_argument("--display-name", default=DISPLAY_NAME)
    where = inst.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="the user's Jupyter data directory")
    where.add_argument("--prefix", type=Path, help="under PREFIX/share/jupyter/kernels")
    where.add_argument("--sys-prefix", action="store_true", help="this environment (the default)")
    p.set_defaults(handler=run)


def kernel_json(display_name: str = DISPLAY_NAME) -> dict[str, Any]:
    """The spec: this interpreter, the workbench's launcher, IPython's kernel."""
    return {
        "argv": [sys.executable, "-m", "workbench.kernel_launcher", "-f", "{connection_file}"],
        "display_name": display_name,
        "language": "python",
        "metadata": {"debugger": True},
    }


def install(
    name: str = DEFAULT_NAME,
    display_name: str = DISPLAY_NAME,
    user: bool = False,
    prefix: str | None = None,
) -> str:
    """Install the spec; returns the directory it went to."""
    if not _NAME.match(name):
        raise ConfigError(
            f"kernel name {name!r} is not valid: use letters, digits, '.', '_' and '-' only"
        )
    if not display_name.strip():
        raise ConfigError("the kernel's display name is empty")
    from jupyter_client.kernelspec import KernelSpecManager

    with tempfile.TemporaryDirectory(prefix="wb-kernel-") as tmp:
        (Path(tmp) / "kernel.json").write_text(json.dumps(kernel_json(display_name), indent=1))
        write_logos(Path(tmp))  # the launcher's icon (logo-svg.svg, logo-32x32/64x64.png)
        try:
            return str(
                KernelSpecManager().install_kernel_spec(
                    tmp, kernel_name=name, user=user, prefix=prefix
                )
            )
        except OSError as exc:  # a file in the way, no permission, a read-only file system
            where = f"prefix {prefix!r}" if prefix is not None else "the Jupyter directory"
            raise ConfigError(
                f"cannot install the kernel spec under {where}: "
                f"{exc.strerror or exc} ({exc.filename}); give a writable --prefix, "
                "--user or --sys-prefix"
            ) from None


def run(args: argparse.Namespace) -> int:
    prefix = None
    if args.prefix is not None:
        prefix = str(args.prefix)
    elif not args.user:  # --sys-prefix, or nothing said
        prefix = sys.prefix
    where = install(args.name, args.display_name, user=args.user, prefix=prefix)
    print(f"installed kernel spec {args.name!r} ({args.display_name}) in {where}")
    return 0
