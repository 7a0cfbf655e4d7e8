"""Run a sweep's tasks on Ray: a local Ray started for the run, or an existing cluster.

`RayExecutor` keeps the executor contract of `executors` (dependencies first, ``on_done`` in
this process as each task finishes, on a failure no new task and `TaskFailed` naming the
task and the original exception) and adds what Ray brings: each task runs on a Ray worker
with its ``resources`` ({"cpu", "gpu"}) reserved, anywhere on the cluster, and a task whose
worker dies (a killed process, a lost node, the out-of-memory killer) is run again, up to
``max_retries`` times. An exception raised by the task itself is not retried: tasks are
deterministic, so it would fail again.

Scheduling stays in this process: a task is submitted once its dependencies have returned
and while the cluster has room for it (its CPUs and GPUs fit in the cluster's totals minus
what our running tasks hold). Passing the dependencies' ObjectRefs to Ray instead would save
one round trip per task, but the outputs travel as files, not objects, and Ray would then
start queued tasks by itself: on a failure the contract (start nothing new, let the running
tasks finish) could not be kept, because Ray cannot tell a queued task from a running one
without interrupting it.

Workers must import shortcutlab (the task function is sent by reference). A local Ray
started here sees the same code: its workers get this process's extra ``sys.path`` entries
(a checkout on ``PYTHONPATH``, an editable install, the test folder). On a remote cluster,
install shortcutlab on every node or pass ``runtime_env`` (e.g. ``{"py_modules": [...]}``
or ``{"working_dir": ".", "pip": [...]}``).

Example:
    >>> from shortcutlab.sweep.executors.ray import RayExecutor        # doctest: +SKIP
    >>> RayExecutor(num_cpus=2).run(graph.ordered(), run_task)        # doctest: +SKIP
    >>> with RayExecutor(address="auto") as ex:                       # one connection, many runs
    ...     ex.run(first, run_task); ex.run(second, run_task)         # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import socket
import sys
from typing import Any, Mapping, Sequence

from shortcutlab.environ import environ
from shortcutlab.warnings_summary import quiet_logger
from shortcutlab.sweep.executors.base import DoneFn, ExecutorError, TaskFailed, TaskFn, check_order
from shortcutlab.sweep.executors.registry import register
from shortcutlab.sweep.graph import Task

_INSTALL = 'pip install "shortcutlab[ray]"'


class RayExecutorError(ExecutorError):
    """Ray is missing, an option is invalid, the cluster cannot be reached or cannot run a task."""


class WorkerDied(RuntimeError):
    """The Ray worker running a task died (every attempt); the cause of a `TaskFailed`."""


class WorkerSetupError(RuntimeError):
    """A Ray worker could not load the task function or its arguments (shortcutlab or the
    function's module not importable there); the cause of a `TaskFailed`."""


def _ray():
    try:
        import ray
    except ImportError as e:
        raise RayExecutorError(f"the Ray executor needs Ray, which is not installed ({e}); install it with {_INSTALL}") from None
    return ray


def _ray_installed() -> bool:
    if "ray" in sys.modules:  # imported already, or blocked (None)
        return sys.modules["ray"] is not None
    return importlib.util.find_spec("ray") is not None


def _run_task(fn: TaskFn, task: Task) -> dict:
    """What a Ray worker runs: the task function on one task (any picklable callable)."""
    return fn(task)


def _extra_sys_path() -> list[str]:
    """This process's import folders that a fresh interpreter would not have (PYTHONPATH
    entries, the folder pytest or a script inserted, a checkout), for a local Ray's workers."""
    prefixes = tuple({os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})
    out: list[str] = []
    for p in sys.path:
        full = os.path.realpath(p or os.getcwd())
        if os.path.isdir(full) and not (full + os.sep).startswith(prefixes) and full not in out:
            out.append(full)
    return out


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail fast on a "HOST:PORT" or "ray://HOST:PORT" nobody listens at (Ray itself retries
    for minutes, printing warnings); "auto" and other forms are left to Ray."""
    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit() or not host:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        raise RayExecutorError(
            f"cannot reach the Ray cluster at {address!r} ({e.strerror or e}); start one with `ray start --head` "
            "and pass the address it prints (or 'auto' on one of its machines)"
        ) from None


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _fmt(x: float) -> str:
    return f"{x:g}"


def _describe(need: Mapping[str, float]) -> str:
    names = {"CPU": "CPU", "GPU": "GPU"}
    return ", ".join(f"{_fmt(v)} {names.get(k, k)}" for k, v in need.items() if v) or "nothing"


@register("ray")
class RayExecutor:
    """Run tasks on Ray workers with their resource needs; retry those whose worker died.

    Args:
        address: None starts a local Ray for the run (shut down after it); "auto" joins the
            cluster this machine belongs to (`ray start`); "HOST:PORT" or "ray://HOST:PORT"
            connects to a cluster's head. If this process is already connected to Ray (its
            own ``ray.init``, or inside ``with RayExecutor(...)``), `run` uses that connection.
        num_cpus, num_gpus: what a local Ray offers (default: all of this machine's); only
            with ``address=None``.
        max_retries: how many times a task whose worker died is run again (0: never).
        runtime_env: Ray's runtime environment for the workers (``working_dir``,
            ``py_modules``, ``pip``, ``env_vars``), e.g. to ship shortcutlab to a cluster.
        check_resources: refuse, before submitting anything, a task that no node of the
            cluster can hold (a GPU task on a CPU-only cluster would otherwise wait forever).
            Turn it off on an autoscaling cluster whose nodes appear on demand.
        quiet: keep Ray's logs out of the terminal (workers' output, start-up messages).
        init_options: further keyword arguments for ``ray.init`` (``object_store_memory``,
            ``_temp_dir``, ...).
    """

    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        num_cpus: float | None = None,
        num_gpus: float | None = None,
        max_retries: int = 2,
        runtime_env: Mapping[str, Any] | None = None,
        check_resources: bool = True,
        quiet: bool = True,
        init_options: Mapping[str, Any] | None = None,
    ) -> None:
        if not _ray_installed():
            raise RayExecutorError(f"the Ray executor needs Ray, which is not installed; install it with {_INSTALL}")
        if address is not None and (not isinstance(address, str) or not address.strip()):
            raise RayExecutorError(f"address must be 'auto', 'HOST:PORT' or 'ray://HOST:PORT' (or None for a local Ray); got {address!r}")
        for key, value in (("num_cpus", num_cpus), ("num_gpus", num_gpus)):
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or (key == "num_cpus" and value == 0):
                expected = "a positive number" if key == "num_cpus" else "a number >= 0"
                raise RayExecutorError(f"{key} must be {expected}; got {value!r}")
            if address is not None:
                raise RayExecutorError(f"{key} applies to a local Ray only (address=None); a cluster at {address!r} has its own resources")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise RayExecutorError(f"max_retries must be an integer >= 0; got {max_retries!r}")
        if runtime_env is not None and not isinstance(runtime_env, Mapping):
            raise RayExecutorError(f"runtime_env must be a dict (working_dir, py_modules, pip, env_vars, ...); got {type(runtime_env).__name__}")
        self.address = address.strip() if address else None
        self.num_cpus, self.num_gpus = num_cpus, num_gpus
        self.max_retries = max_retries
        self.runtime_env = dict(runtime_env) if runtime_env else None
        self.check_resources = check_resources
        self.quiet = quiet
        self.init_options = dict(init_options or {})
        self._owns_ray = False

    # --- connection ---------------------------------------------------------------------------
    def __enter__(self) -> "RayExecutor":
        self._connect()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Shut down the local Ray this executor started, or disconnect from the cluster it
        connected to (the cluster keeps running); nothing if it found Ray already connected."""
        if self._owns_ray:
            self._owns_ray = False
            _ray().shutdown()

    def _connect(self) -> bool:
        """Connect (or start a local Ray); return True if this call started the connection."""
        ray = _ray()
        if ray.is_initialized():
            return False
        opts: dict[str, Any] = dict(log_to_driver=not self.quiet, include_dashboard=False, configure_logging=True)
        if self.quiet:
            opts["logging_level"] = logging.WARNING
        if self.runtime_env:
            opts["runtime_env"] = self.runtime_env
        env: dict[str, str | None] = {"RAY_USAGE_STATS_ENABLED": os.environ.get("RAY_USAGE_STATS_ENABLED", "0")}
        if self.address is None:
            opts.update(num_cpus=self.num_cpus, num_gpus=self.num_gpus)
            # The workers of a local Ray start from this environment: give them our import path.
            extra = _extra_sys_path()
            current = os.environ.get("PYTHONPATH")
            env["PYTHONPATH"] = os.pathsep.join(extra + ([current] if current else [])) or None
        else:
            _check_reachable(self.address)
            opts["address"] = self.address
        opts.update(self.init_options)
        # Ray warns on every local start that it enabled token authentication (its default,
        # which we keep); the warning is noise for a sweep's user.
        with environ(**env), quiet_logger("ray._private.authentication.authentication_token_setup", self.quiet):
            try:
                ray.init(**opts)
            except (ConnectionError, TimeoutError, RuntimeError) as e:
                where = f"the Ray cluster at {self.address!r}" if self.address else "a local Ray"
                raise RayExecutorError(f"cannot start or reach {where}: {_first_line(e)}") from e
        self._owns_ray = True
        return True

    # --- running ------------------------------------------------------------------------------
    def run(self, tasks: Sequence[Task], fn: TaskFn, on_done: DoneFn | None = None) -> None:
        """Run `tasks` (a topological order) with `fn` on Ray; see the module docstring."""
        tasks = list(tasks)
        check_order(tasks)
        if not tasks:
            return
        started = self._connect()
        try:
            self._run(tasks, fn, on_done)
        finally:
            if started:
                self.close()

    @staticmethod
    def _needs(task: Task) -> dict[str, float]:
        """The task's resources as Ray names them: CPU, GPU and any custom resource."""
        need = {}
        for key, value in (task.resources or {}).items():
            name = {"cpu": "CPU", "gpu": "GPU"}.get(key, key)
            need[name] = float(value or 0)
        need.setdefault("CPU", 1.0)
        need.setdefault("GPU", 0.0)
        return need

    def _capacity(self, ray, tasks: list[Task]) -> dict[str, float]:
        """The cluster's totals; refuse a task that no alive node can hold."""
        nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
        total: dict[str, float] = {}
        for res in nodes:
            for k, v in res.items():
                total[k] = total.get(k, 0.0) + float(v)
        if self.check_resources:
            for t in tasks:
                need = self._needs(t)
                if not any(all(res.get(k, 0.0) >= v for k, v in need.items() if v) for res in nodes):
                    largest = max(nodes, key=lambda r: (r.get("GPU", 0.0), r.get("CPU", 0.0)), default={})
                    raise RayExecutorError(
                        f"{t.kind} task {t.id} needs {_describe(need)}, but no node of the Ray cluster has that much "
                        f"({len(nodes)} node(s), the largest with {_fmt(largest.get('CPU', 0.0))} CPU, {_fmt(largest.get('GPU', 0.0))} GPU); "
                        "add such a node, lower the task's resources, or pass check_resources=False on an autoscaling cluster"
                    )
        return total

    def _run(self, tasks: list[Task], fn: TaskFn, on_done: DoneFn | None) -> None:
        ray = _ray()
        total = self._capacity(ray, tasks)
        remote = ray.remote(_run_task)
        fn_ref = ray.put(fn)  # sent once, not with every task
        done: set[str] = set()
        pending = list(tasks)
        running: dict[Any, Task] = {}
        held: dict[str, float] = {}
        failure: TaskFailed | None = None

        def fits(need: Mapping[str, float]) -> bool:
            if not running:
                return True  # the feasibility check (or Ray's queue) covers a lone task
            return all(held.get(k, 0.0) + v <= total.get(k, 0.0) + 1e-9 for k, v in need.items() if v)

        try:
            while pending or running:
                if failure is None:
                    for t in [t for t in pending if all(d in done for d in t.deps)]:
                        need = self._needs(t)
                        if not fits(need):
                            continue
                        custom = {k: v for k, v in need.items() if k not in ("CPU", "GPU") and v}
                        ref = remote.options(
                            num_cpus=need["CPU"],
                            num_gpus=need["GPU"],
                            resources=custom or None,
                            max_retries=self.max_retries,
                            retry_exceptions=False,
                            name=f"{t.kind}:{t.id}",
                        ).remote(fn_ref, t)
                        running[ref] = t
                        for k, v in need.items():
                            held[k] = held.get(k, 0.0) + v
                        pending.remove(t)
                if not running:
                    break
                finished, _ = ray.wait(list(running), num_returns=1)
                for ref in finished:
                    t = running.pop(ref)
                    for k, v in self._needs(t).items():
                        held[k] -= v
                    try:
                        result = ray.get(ref)
                    except Exception as e:
                        if failure is None:
                            failure = TaskFailed(t, self._cause(ray, e))
                            failure.__cause__ = e
                        continue
                    done.add(t.id)
                    if on_done:
                        on_done(t, result)
        except BaseException:
            # Ctrl-C or a failing on_done: do not leave our tasks running on a shared cluster.
            for ref in running:
                with contextlib.suppress(Exception):
                    ray.cancel(ref, force=False)
            raise
        if failure is not None:
            raise failure from failure.__cause__

    def _cause(self, ray, e: BaseException) -> BaseException:
        """The original exception of a failed task, or a `WorkerDied` for a system failure."""
        if isinstance(e, ray.exceptions.RayTaskError):
            cause = getattr(e, "cause", None)
            if isinstance(cause, ray.exceptions.RaySystemError):
                text = _first_line(cause).removeprefix("System error: ")
                hint = ""
                if "No module named" in text:
                    hint = "; install shortcutlab and the task function's module on every node, or pass runtime_env (py_modules, working_dir)"
                return WorkerSetupError(f"a Ray worker could not load the task: {text}{hint}")
            if isinstance(cause, BaseException) and not isinstance(cause, ray.exceptions.RayTaskError):
                return cause
            return e
        if isinstance(e, ray.exceptions.RayError):
            tries = self.max_retries + 1
            return WorkerDied(
                f"the Ray worker running it died ({type(e).__name__}; {tries} attempt{'s' if tries > 1 else ''}, "
                f"max_retries={self.max_retries}): {_first_line(e)}"
            )
        return e
