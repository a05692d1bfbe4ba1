"""A private JupyterLab server on loopback for the real-browser tests, and process hygiene.

The server gets its own Jupyter/IPython state directories (so clusters it starts are found
under its own ``IPYTHONDIR`` and nothing touches ``~/.jupyter``), a random token, a fixed
free port with ``port_retries=0`` (so the URL we open is the server we started) and
``expose_app_in_browser`` (so the test can ask the page whether the kernel is ready).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

__all__ = ["LabServer"]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LabServer:
    """``jupyter lab`` serving ``root`` (a temp dir) with private state under ``state``."""

    def __init__(self, root: Path, state: Path) -> None:
        self.root = root
        self.state = state
        self.port = _free_port()
        self.token = secrets.token_hex(16)
        self.log_path = state / "jupyterlab.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str, **query: str) -> str:
        params = "&".join(
            [*(f"{k}={v}" if v else k for k, v in query.items()), f"token={self.token}"]
        )
        return f"{self.base_url}/{path.lstrip('/')}?{params}"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        jupyter = self.state / "jupyter"
        env.update(
            IPYTHONDIR=str(self.state / "ipython"),
            JUPYTER_CONFIG_DIR=str(jupyter / "config"),
            JUPYTER_DATA_DIR=str(jupyter / "data"),
            JUPYTER_RUNTIME_DIR=str(jupyter / "runtime"),
            JUPYTERLAB_SETTINGS_DIR=str(jupyter / "lab-settings"),
            JUPYTERLAB_WORKSPACES_DIR=str(jupyter / "lab-workspaces"),
            JUPYTER_PLATFORM_DIRS="1",
            PYDEVD_DISABLE_FILE_VALIDATION="1",
            OMP_NUM_THREADS="1",
        )
        return env

    def _quiet_settings(self) -> None:
        """No "get Jupyter news?" toast over the screenshots (and no fetch attempt)."""
        path = self.state / "jupyter" / "lab-settings" / "@jupyterlab" / "apputils-extension"
        path.mkdir(parents=True, exist_ok=True)
        (path / "notification.jupyterlab-settings").write_text(
            json.dumps({"fetchNews": "false", "checkForUpdates": False})
        )
        # Every cell laid out, on screen or not: with JupyterLab's default windowing an
        # output below the fold is not laid out, and a plotly figure drawn into it stayed
        # blank (default axes, no title) on a loaded machine at 1,280 x 800.
        notebook = path.parent / "notebook-extension"
        notebook.mkdir(parents=True, exist_ok=True)
        (notebook / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))

    def start(self, timeout: float = 60.0) -> None:
        self._quiet_settings()
        cmd = [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--ServerApp.token={self.token}",
            f"--ServerApp.root_dir={self.root}",
            "--ServerApp.allow_root=True",
            "--ServerApp.terminals_enabled=False",
            "--LabApp.expose_app_in_browser=True",
            "--LabApp.news_url=",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.extension_manager=readonly",
        ]
        log = self.log_path.open("wb")
        # Own session: the finally block can signal the server's whole process group.
        self.proc = subprocess.Popen(
            cmd,
            cwd=self.root,
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"JupyterLab exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            try:
                self.api("GET", "api/status")
                return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.25)
        raise RuntimeError(f"JupyterLab did not answer within {timeout:.0f} s:\n{self.log_tail()}")

    def api(self, method: str, path: str, timeout: float = 5.0) -> Any:
        request = urllib.request.Request(
            f"{self.base_url}/{path}",
            method=method,
            headers={"Authorization": f"token {self.token}"},
            data=b"" if method == "POST" else None,
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
        return json.loads(body) if body else None

    def shutdown_kernels(self) -> None:
        """Delete every session (and so shut its kernel down) through the REST API."""
        for session in self.api("GET", "api/sessions"):
            self.api("DELETE", f"api/sessions/{session['id']}", timeout=30.0)

    def stop(self, timeout: float = 15.0) -> None:
        """Ask the server to shut down; signal its process group if it does not."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            self.api("POST", "api/shutdown")
            self.proc.wait(timeout)
        except (urllib.error.URLError, ConnectionError, TimeoutError, subprocess.TimeoutExpired):
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(self.proc.pid, sig)
                    self.proc.wait(5)
                    break
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    continue

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""
