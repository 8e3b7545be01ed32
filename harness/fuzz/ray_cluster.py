"""Ray: how `kvconform fuzz --ray` and `kvconform gate --ray` use a cluster.

Ray is an optional extra (`pip install -e '.[ray]'`, pinned in the Makefile);
without it `require_ray` ends the verb with one line saying how to install it
(exit 3). `connect(address)` joins a cluster (a head's host:port, or
RAY_ADDRESS), or starts a private one on this machine for the run.

The work runs on `Worker` actors, one per CPU the run uses: each pays vLLM's
import and its first backends once (`start`, timed and reported apart), then
runs unit after unit (`run`: a module-level function named as
"module:function", so this module knows nothing of fuzzing or traces).
`WorkerPool.map_unordered` keeps every worker busy and hands each result back
the moment it arrives.

`local_head` starts a one-machine cluster on loopback for tests and benchmarks
(`ray start --head --block` on free ports, in its own temporary folder) and
stops it by its process id: `ray stop` would stop every Ray on the machine.

Authentication: since Ray 2.59 a cluster may require a token, and where Ray
is left to choose, the head and a client decide apart (each from whether
~/.ray/auth_token exists when it starts, a file any local `ray.init()` may
create meanwhile), so a client could be refused by a head started a moment
before. The clusters kvconform starts therefore always use a token of their
own, in their own folder: `local_head` gives it to its clients
(`LocalHead.client_env`), and the private cluster of a run without an
address sets it for the processes it starts. A cluster someone else started
is joined with Ray's own settings (RAY_AUTH_MODE, RAY_AUTH_TOKEN or
RAY_AUTH_TOKEN_PATH), untouched.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from harness.core.exit_codes import CommandError, ExitCode

RAY_EXTRA = "pip install -e '.[ray]'"
# Ray turns a loopback node address into the machine's reachable one unless
# told this is a one-machine cluster; servers then bind 127.0.0.1 only.
_LOOPBACK_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
_AUTH_MODE, _AUTH_TOKEN, _AUTH_TOKEN_PATH = "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"


def require_ray(address: str | None = None):
    """The ray module, or a CommandError (exit 3) that says how to install it.
    For a cluster on this machine (`address` on loopback, or none at all)
    Ray is told, before it is imported, to keep to loopback."""
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is None or _host(address) in _LOOPBACK_HOSTS:
        os.environ.setdefault(_LOOPBACK_ONLY, "0")  # read when ray is imported
    try:
        import ray
    except ImportError:
        raise CommandError(f"--ray needs Ray, an optional extra: {RAY_EXTRA} "
                           "(make install pins it)", ExitCode.ENVIRONMENT) from None
    return ray


def _host(address: str) -> str:
    host = address.removeprefix("ray://").rsplit(":", 1)[0]
    return host.strip("[]")


def connect(address: str | None):
    """Join the cluster whose head is at `address` (host:port); without one,
    RAY_ADDRESS's, or a private cluster on this machine (loopback only) that
    ends with the run. The ray module."""
    address = address or os.environ.get("RAY_ADDRESS") or None
    ray = require_ray(address)
    import logging

    options: dict[str, Any] = dict(logging_level=logging.ERROR, log_to_driver=False,
                                   configure_logging=False)
    if address is None:
        options.update(include_dashboard=False)
        _own_token_for_private_cluster()
    try:
        ray.init(address=address, **options)
    except Exception as e:  # noqa: BLE001 - Ray's many connection errors: one line
        where = f"at {address}" if address else "on this machine"
        raise CommandError(f"cannot start or reach a Ray cluster {where}: "
                           f"{type(e).__name__}: {e}", ExitCode.ENVIRONMENT) from None
    return ray


def _write_token(folder: str) -> str:
    """A fresh token in `folder`, readable by this user only; its path."""
    path = os.path.join(folder, "auth_token")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return path


def _auth_env(token_path: str) -> dict[str, str]:
    return {_AUTH_MODE: "token", _AUTH_TOKEN_PATH: token_path}


def _own_token_for_private_cluster() -> None:
    """The private cluster `ray.init()` starts gets a token of its own (its
    processes inherit this environment), unless the user chose Ray's
    authentication settings."""
    if any(os.environ.get(k) for k in (_AUTH_MODE, _AUTH_TOKEN, _AUTH_TOKEN_PATH)):
        return
    folder = tempfile.mkdtemp(prefix="kvconform-ray-auth-")
    atexit.register(shutil.rmtree, folder, True)
    os.environ.update(_auth_env(_write_token(folder)))


def cluster_cpus(ray) -> int:
    return max(int(ray.cluster_resources().get("CPU", 1)), 1)


class Worker:
    """A Ray actor: vLLM imported once, then unit after unit."""

    def start(self, profile_name: str) -> float:
        """vLLM's import and a first pair of backends (then the GC freeze);
        the seconds it took."""
        from harness.fuzz.campaign import start_up
        from impl.profiles import get_profile

        return start_up(get_profile(profile_name))

    def run(self, target: str, *args):
        module, name = target.split(":")
        return getattr(importlib.import_module(module), name)(*args)

    def where(self) -> str:
        return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(slots=True)
class Failed:
    """A unit that did not come back (its worker died, Ray failed it)."""

    message: str


class WorkerPool:
    def __init__(self, ray, num_workers: int) -> None:
        self.ray = ray
        actor = ray.remote(num_cpus=1)(Worker)
        self.workers = [actor.remote() for _ in range(num_workers)]
        self.startup_seconds: list[float] = []

    def first(self, n: int) -> WorkerPool:
        """The same pool, its first n (started) workers only."""
        view = object.__new__(WorkerPool)
        view.ray, view.workers = self.ray, self.workers[:n]
        view.startup_seconds = self.startup_seconds[:n]
        return view

    def start(self, profile_name: str) -> float:
        """Start every worker (in parallel); the slowest one's seconds."""
        self.startup_seconds = self.ray.get([w.start.remote(profile_name)
                                             for w in self.workers])
        return max(self.startup_seconds, default=0.0)

    def map_unordered(self, target: str, units: Iterator, args: tuple = ()
                      ) -> Iterator[tuple[Any, Any]]:
        """(unit, result or Failed) for each unit, as they finish; a unit is
        drawn from `units` only when a worker is free, so a generator can
        decide late (deadlines) or stop."""
        ray = self.ray
        in_flight: dict = {}
        units = iter(units)

        def submit(worker) -> None:
            unit = next(units, None)
            if unit is not None:
                in_flight[worker.run.remote(target, unit, *args)] = (worker, unit)

        for w in self.workers:
            submit(w)
        while in_flight:
            ready, _ = ray.wait(list(in_flight), num_returns=1)
            worker, unit = in_flight.pop(ready[0])
            try:
                result = ray.get(ready[0])
            except ray.exceptions.RayActorError as e:
                yield unit, Failed(f"worker lost: {type(e).__name__}")
                continue  # a dead worker takes no more units
            except ray.exceptions.RayError as e:
                result = Failed(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            yield unit, result
            submit(worker)

    def close(self) -> None:
        for w in self.workers:
            with contextlib.suppress(Exception):
                self.ray.kill(w)


def open_pool(address: str | None, workers: int | None, profile_name: str,
              say: Callable[[str], None]) -> WorkerPool:
    """Connect, start `workers` workers (default: one per CPU of the cluster)
    and their vLLM; say what it cost."""
    ray = connect(address)
    cpus = cluster_cpus(ray)
    n = min(workers or cpus, cpus)
    if workers and workers > cpus:
        say(f"ray: the cluster has {cpus} CPUs; using {n} workers, not {workers}")
    pool = WorkerPool(ray, n)
    t0 = time.perf_counter()
    slowest = pool.start(profile_name)
    say(f"ray: {n} workers started in {time.perf_counter() - t0:.1f}s (vLLM's import and "
        f"first backends: {slowest:.1f}s on the slowest; not counted)")
    return pool


def close_pool(pool: WorkerPool | None) -> None:
    if pool is None:
        return
    pool.close()
    with contextlib.suppress(Exception):
        pool.ray.shutdown()


# -- a one-machine cluster for tests and benchmarks ----------------------------------


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


@dataclass(slots=True)
class LocalHead:
    address: str
    pid: int
    temp_dir: str
    token_path: str

    def client_env(self) -> dict[str, str]:
        """The environment of a process that joins this head (this one's,
        plus the head's token, which a RAY_AUTH_TOKEN set here would override)."""
        env = {**os.environ, **_auth_env(self.token_path)}
        env.pop(_AUTH_TOKEN, None)
        return env


@contextlib.contextmanager
def local_head(num_cpus: int = 2, timeout: float = 300.0) -> Iterator[LocalHead]:
    """A Ray head on this machine, loopback only, `num_cpus` worker slots,
    stopped (its whole process group, by id) when the block ends."""
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    # Short: Ray's socket paths must fit in 107 bytes.
    temp_dir = tempfile.mkdtemp(prefix="kvr-", dir="/tmp")
    # All at once: ports taken in separate rounds may come back twice.
    gcs, client, manager, objects, agent, agent_grpc, env_agent, metrics, dashboard, *workers = (
        _free_ports(9 + 2 * num_cpus + 8))
    cmd = [ray_cli, "start", "--head", "--block", "--port", str(gcs),
           "--node-ip-address", "127.0.0.1", "--num-cpus", str(num_cpus),
           "--include-dashboard", "false", "--disable-usage-stats",
           "--temp-dir", temp_dir, "--object-store-memory", str(100 << 20),
           "--ray-client-server-port", str(client), "--node-manager-port", str(manager),
           "--object-manager-port", str(objects), "--dashboard-agent-listen-port", str(agent),
           "--dashboard-agent-grpc-port", str(agent_grpc),
           "--runtime-env-agent-port", str(env_agent), "--metrics-export-port", str(metrics),
           "--dashboard-port", str(dashboard), "--worker-port-list", ",".join(map(str, workers))]
    head = LocalHead(f"127.0.0.1:{gcs}", 0, temp_dir, _write_token(temp_dir))
    log = open(os.path.join(temp_dir, "head.log"), "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**head.client_env(), _LOOPBACK_ONLY: "0"},
                            preexec_fn=_die_with_parent)
    head.pid = proc.pid
    try:
        _wait_started(proc, os.path.join(temp_dir, "head.log"), timeout)
        yield head
    finally:
        _stop(proc)
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


def _die_with_parent() -> None:
    """In the child: SIGTERM when the process that started it dies (killed by
    a timeout, say), so that `ray start --block` still stops what it started."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _wait_started(proc: subprocess.Popen, log_path: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ray start exited {proc.returncode}: "
                               f"{open(log_path, errors='replace').read()[-2000:]}")
        with open(log_path, errors="replace") as f:
            if "Ray runtime started" in f.read():
                return
        time.sleep(0.5)
    raise TimeoutError(f"Ray did not start within {timeout:.0f}s")


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to `ray start --block` stops the processes it started; then
    anything left in its process group is killed."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pass
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
