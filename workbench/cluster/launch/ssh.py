"""ipyparallel's SSH engine launcher, made fast and quiet: one ssh round trip per action.

ipyparallel's ``SSHEngineLauncher`` starts each engine with four ssh round trips, each
starting a remote Python (shell detection, a python check, ``ipython profile create``,
then the start), starts engines one after another, fetches output with scp, and kills with
a remote Python that prints a traceback when the engine has already exited. Here every
action is one ssh running one POSIX shell line, all engines start at once, and every
signal goes to the engine's own host (a remote pid is never signalled here).
"""

from __future__ import annotations

import asyncio
import shlex
import signal
import subprocess
from typing import Any

from ipyparallel.cluster.launcher import SSHEngineLauncher, SSHEngineSetLauncher

from workbench.cluster.lifecycle.elastic import probe_host
from workbench.errors import ClusterError

__all__ = ["FastSSHEngineLauncher", "SSHParallelEngineSetLauncher", "attach_nannies"]

_SSH_TIMEOUT_S = 60.0
# The cluster asked the engine to exit before this stop; one still finalising (torch,
# gloo threads) after this long is killed, as the local launcher's stop does.
_KILL_AFTER_S = 2.0


def _end_nannies(pids: list[int], delay: float) -> str:
    """Shell: after ``delay`` s, end the given nanny pids that still run (the cmdline check
    guards against a pid reused since)."""
    if not pids:
        return "true"
    listed = " ".join(str(p) for p in pids)
    return (
        f"sleep {delay}; for p in {listed}; do grep -qs ipyparallel /proc/$p/cmdline && "
        "kill -KILL $p 2>/dev/null; done; true"
    )


class FastSSHEngineLauncher(SSHEngineLauncher):
    """One engine on one host, started, watched and signalled over plain ssh + sh.

    ``nanny_pids`` (set by the cluster once the engine reported them): ipyparallel's nanny
    beside the engine. It outlives its engine when the controller is already gone (its
    goodbye message waits on a socket), so it is ended on its host after the engine.
    """

    nanny_pids: list[int] = []  # noqa: RUF012  (replaced per instance, never mutated)
    _stopping = False

    def _ssh(
        self, command: str, timeout: float = _SSH_TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        argv = [*self.ssh_cmd, *self.ssh_args, self.location, command]
        try:
            return subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:  # a silent host: a failed ssh, not a raise in a stop
            return subprocess.CompletedProcess(argv, 255, "", f"no answer within {timeout}s")

    def start(self, hostname: str | None = None, user: str | None = None, port: Any = None) -> None:  # type: ignore[override]
        if hostname is not None:
            self.hostname = hostname
        if user is not None:
            self.user = user
        if port is not None and "-p" not in self.ssh_args:
            self.ssh_args = [*self.ssh_args, "-p", str(port)]
        out = self.remote_output_file
        env = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in self.get_env().items())
        program = " ".join(shlex.quote(str(a)) for a in self.program + self.program_args)
        # setsid: the engine leaves the ssh session, so closing ssh does not end it.
        line = (
            f"cd && mkdir -p {shlex.quote(out.rsplit('/', 1)[0] or '.')} && "
            f"{{ env {env} setsid {program} > {shlex.quote(out)} 2>&1 < /dev/null & }} && "
            'echo "__wb_pid=$!"'
        )
        done = self._ssh(line)
        pids = [w for w in done.stdout.split() if w.startswith("__wb_pid=")]
        if done.returncode != 0 or not pids:
            raise ClusterError(
                f"ssh {self.location} could not start an engine (exit {done.returncode}): "
                f"{done.stderr.strip() or done.stdout.strip()}"
            )
        self.pid = int(pids[0].split("=", 1)[1])
        self.notify_start({"host": self.location, "pid": self.pid})
        self._start_waiting()

    def wait_one(self, timeout: float | None) -> int:
        """Wait (on the engine's host) until the engine exits; TimeoutError if it runs on."""
        rounds = max(1, int((timeout or 60) / 0.2))
        line = (
            f"i=0; while kill -0 {self.pid} 2>/dev/null; do i=$((i+1)); "
            f'[ "$i" -ge {rounds} ] && {{ echo running; exit 0; }}; sleep 0.2; done; echo gone'
        )
        done = self._ssh(line, timeout=(timeout or 60) + _SSH_TIMEOUT_S)
        if "gone" in done.stdout:
            if self.nanny_pids and not self._stopping:  # it reports the death, then goes
                self._ssh(_end_nannies(self.nanny_pids, 3.0))
            return 0  # not our child there: the exit code is not knowable
        if "running" in done.stdout:
            raise TimeoutError("still running")
        if done.returncode == 255 and not probe_host(self.hostname):
            return 0  # the host is gone whole (host_loss.py), its engine with it: nothing
            # is left to wait for, and a stop need not ssh to a host that does not answer
        raise RuntimeError(f"ssh {self.location}: {done.stderr.strip()}")

    def signal(self, sig: int) -> None:
        if self.state == "running" and self.pid:
            name = signal.Signals(sig).name.removeprefix("SIG")
            self._ssh(f"kill -{name} {self.pid} 2>/dev/null; true")

    def get_output(self, remove: bool = False) -> str:
        out = shlex.quote(self.remote_output_file)
        if self._output is None:
            done = self._ssh(f"cd && cat {out} 2>/dev/null" + (f"; rm -f {out}" if remove else ""))
            self._output = done.stdout
            self._removed = remove
        elif remove and not getattr(self, "_removed", False):
            self._ssh(f"cd && rm -f {out}")
            self._removed = True
        return self._output

    async def stop(self) -> None:
        """TERM, KILL after ``_KILL_AFTER_S``, end the nanny and remove the log: one ssh.

        Called after the engine was asked to exit, so the kill usually finds nothing; the
        output of an engine stopped on purpose is not kept (ipyparallel would fetch it
        with scp, blocking the event loop once per engine).
        """
        if self.state != "running" or not self.pid:
            return
        self._stopping = True  # the stop below ends the nanny; the watcher need not wait
        rounds = max(1, int(_KILL_AFTER_S / 0.1))
        pid = self.pid
        line = (
            f"kill -TERM {pid} 2>/dev/null; i=0; while kill -0 {pid} 2>/dev/null; do "
            f'i=$((i+1)); [ "$i" -ge {rounds} ] && kill -KILL {pid} 2>/dev/null; sleep 0.1; '
            f"done; cd && rm -f {shlex.quote(self.remote_output_file)}; "
            + _end_nannies(self.nanny_pids, 0.5)
        )
        await asyncio.to_thread(self._ssh, line)
        self._output, self._removed = "", True
        thread = getattr(self, "_wait_thread", None)
        if thread is not None:  # it sees the exit within its next poll and reports the stop
            self._stop_waiting.set()
            await asyncio.to_thread(thread.join, _SSH_TIMEOUT_S)


class SSHParallelEngineSetLauncher(SSHEngineSetLauncher):
    """ipyparallel's SSH engine set, but every engine starts at once. The connection info
    reaches the engines in their environment, so no file is copied to the hosts."""

    launcher_class = FastSSHEngineLauncher

    async def start(self, n: int) -> list[str]:  # type: ignore[override]
        engine_traits = self.launcher_class.class_traits(config=True)
        shared = set(self.traits(config=True)).intersection(engine_traits)
        inherited = shared.difference({"location", "user", "hostname", "to_send", "to_fetch"})
        inherited |= {"profile_dir", "cluster_id"}
        jobs = []
        for full_host, count in self.engines.items():
            user, _, host = full_host.rpartition("@")
            host, _, port = host.partition(":")
            for i in range(min(int(count), n - len(jobs))):
                kwargs = {attr: getattr(self, attr) for attr in inherited}
                # the host is known before the start, so the watchdog can reach it at once
                kwargs["hostname"] = host
                if user:
                    kwargs["user"] = user
                key = f"{full_host}/{i}"
                el = self.launchers[key] = self.launcher_class(
                    parent=self, identifier=key, **kwargs
                )
                el.to_send = []
                # the engine reports where it was started, so a replacement goes there too
                el.environment = {**el.environment, "WB_LAUNCH_HOST": full_host}
                el.loop  # noqa: B018  (bind the launcher to this thread's event loop)
                el.on_stop(self._notice_engine_stopped)
                jobs.append((key, el, user or None, host, port or None))
        results = await asyncio.gather(
            *(
                asyncio.to_thread(el.start, user=user, hostname=host, port=port)
                for _, el, user, host, port in jobs
            ),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result
        started = [key for key, *_ in jobs]
        self.notify_start(started)
        self.n = len(started)
        return started


def attach_nannies(ipp_cluster: object, facts: dict[int, dict[str, object]]) -> None:
    """Tell each ssh engine launcher its engine's nanny pids (matched by host and pid)."""
    by_engine = {
        (str(f.get("launch_host", "")), int(f["pid"])): list(f.get("nanny_pids", []))  # type: ignore[call-overload]
        for f in facts.values()
    }
    for engine_set in getattr(ipp_cluster, "engines", {}).values():
        for key, el in getattr(engine_set, "launchers", {}).items():
            if isinstance(el, FastSSHEngineLauncher):
                found = by_engine.get((key.rsplit("/", 1)[0], int(el.pid or 0)))
                if found is not None:
                    el.nanny_pids = found
