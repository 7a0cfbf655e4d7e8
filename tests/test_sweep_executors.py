"""Executors: the same outputs and on_done calls in process, on a process pool and on Ray.

The toy task reads its dependencies' output files and writes its own (a SHA-256 of its
parameters and its inputs), so a task run before a dependency fails, and the expected files
follow from a plain recursion over the graph written here, with no executor involved. The Ray
tests start one local 2-CPU Ray (with one declared GPU, so a GPU request can be granted) for
the module; Ray workers import this module through the import path the executor hands them.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time

import pytest

from shortcutlab.errors import ShortcutlabError
from shortcutlab.io import write_text
from shortcutlab.sweep import LocalExecutor, Task, TaskFailed, TaskGraph, executors, get_executor
from shortcutlab.testing import check_executor


# --- the toy task (module level: process pools and Ray workers import it by name) ------------
def _digest(params: dict, inputs: list[str]) -> str:
    return hashlib.sha256((json.dumps(params, sort_keys=True) + "|" + "|".join(inputs)).encode()).hexdigest()


def toy(out_dir: str, task: Task) -> dict:
    """Check the deps' outputs exist, read them, write `<id>.txt`; fail or die when told to."""
    inputs = []
    for d in task.deps:
        path = os.path.join(out_dir, f"{d}.txt")
        if not os.path.exists(path):
            raise RuntimeError(f"dependency {d} of {task.id} has no output yet")
        with open(path) as f:
            inputs.append(f.read())
    name = task.params["name"]
    if task.params.get("fail"):
        raise ValueError(f"planted failure in {name}")
    if task.params.get("die_once"):
        marker = os.path.join(out_dir, f"{task.id}.died")
        if not os.path.exists(marker):
            write_text(marker, "")
            os._exit(1)  # the worker process dies, as under the OOM killer
    time.sleep(task.params.get("sleep", 0.0))
    text = _digest(task.params, inputs)
    write_text(os.path.join(out_dir, f"{task.id}.txt"), text)
    return {"name": name, "digest": text[:12]}


def assigned_resources(task: Task) -> dict:
    import ray

    return dict(ray.get_runtime_context().get_assigned_resources())


def diamond(fail: str | None = None, die_once: str | None = None) -> tuple[TaskGraph, dict[str, str]]:
    """a -> (b, c) -> d, plus e -> g and a lone f; returns the graph and name -> id."""
    g = TaskGraph()
    ids: dict[str, str] = {}

    def add(name, deps=(), **extra):
        params = {"name": name, "sleep": 0.05, **extra}
        if name == fail:
            params["fail"] = True
        if name == die_once:
            params["die_once"] = True
        ids[name] = g.add("toy", params, [ids[d] for d in deps])

    add("a")
    add("b", ["a"])
    add("c", ["a"], weight=2)
    add("d", ["b", "c"])
    add("e")
    add("f", sleep=0.2)
    add("g", ["e"])
    return g, ids


def expected_outputs(graph: TaskGraph) -> dict[str, str]:
    """The files the toy must leave, by a plain recursion (no executor, no toy call)."""
    memo: dict[str, str] = {}

    def out(tid: str) -> str:
        if tid not in memo:
            t = graph[tid]
            memo[tid] = _digest(t.params, [out(d) for d in t.deps])
        return memo[tid]

    return {f"{t.id}.txt": out(t.id) for t in graph.ordered()}


def outputs(folder) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(folder.iterdir()) if p.suffix == ".txt"}


def run_with(executor, graph: TaskGraph, folder) -> list[tuple[str, dict]]:
    folder.mkdir(exist_ok=True)
    calls: list[tuple[str, dict]] = []
    executor.run(graph.ordered(), functools.partial(toy, str(folder)), lambda t, r: calls.append((t.id, r)))
    return calls


# --- the contract (`shortcutlab.testing.check_executor`) over every registered executor ------------
EXECUTORS = [pytest.param(n, marks=pytest.mark.slow) if n == "ray" else n for n in executors.available()]


@pytest.mark.parametrize("name", EXECUTORS)
def test_every_registered_executor_keeps_the_contract(name, request):
    """Outputs equal to the plain recursion's, on_done once per task (dependencies first, in
    this process), a failure raising TaskFailed naming the task and cause with no dependant run."""
    if name == "ray":
        check_executor(request.getfixturevalue("ray_session"))  # the module's 2-CPU Ray
    else:
        check_executor(executors.get_class(name))


def test_the_local_pool_keeps_the_contract():
    check_executor(LocalExecutor(workers=2))


# --- LocalExecutor ---------------------------------------------------------------------------
def test_local_in_process_stops_at_the_failure(tmp_path):
    """In process (workers=1) the tasks run strictly in order: nothing after the failed one."""
    graph, ids = diamond(fail="b")
    calls: list[str] = []
    with pytest.raises(TaskFailed, match=f"toy task {ids['b']} failed: ValueError: planted failure in b"):
        LocalExecutor(workers=1).run(graph.ordered(), functools.partial(toy, str(tmp_path)), lambda t, r: calls.append(t.id))
    assert calls == [ids["a"]]


def test_local_refuses_a_task_before_its_dependency():
    graph, ids = diamond()
    tasks = graph.ordered()
    swapped = [tasks[1], tasks[0]] + tasks[2:]  # b before a
    with pytest.raises(ValueError, match=f"task {ids['b']} comes before its dependency {ids['a']}"):
        LocalExecutor().run(swapped, toy)


def test_local_refuses_an_unknown_dependency():
    graph, ids = diamond()
    without_a = [t for t in graph.ordered() if t.id != ids["a"]]
    with pytest.raises(ValueError, match=f"task {ids['b']} depends on {ids['a']}, which is not in the list"):
        LocalExecutor().run(without_a, toy)


@pytest.mark.parametrize("workers", [0, -1, 1.5, True, "2"])
def test_local_refuses_a_bad_worker_count(workers):
    with pytest.raises(ShortcutlabError, match="workers must be a positive integer"):
        LocalExecutor(workers=workers)


def test_get_executor_by_name():
    assert isinstance(get_executor("local", workers=2), LocalExecutor)
    with pytest.raises(ShortcutlabError, match="unknown executor 'dask'"):
        get_executor("dask")


SWEEP_YAML = """data:
  synthetic: {mechanisms: [color], fields_per_class: 4, crop_size: 16}
split: {protocol: factorial}
seeds: [0]
models:
  - {arch: test_resnet, epochs: 1}
"""


def test_executor_registry_rules_and_plugins(tmp_path, monkeypatch, capsys):
    """Executors share the plug-in registry's rules; a third-party executor joins through the
    entry-point group, `sweep --executor` offers it and hands it only the options it takes."""
    from shortcutlab.cli import main
    from shortcutlab.sweep.executors import ExecutorError

    assert {"local", "ray"} <= set(executors.available())
    with pytest.raises(ExecutorError, match=r"unknown executor 'rey'; did you mean 'ray'\? Available: local, ray"):
        get_executor("rey")
    with pytest.raises(ExecutorError, match="executor 'local' takes no parameter 'address'; it takes: workers"):
        get_executor("local", address="auto")
    with pytest.raises(ExecutorError, match="already registered by shortcutlab.sweep.executors.local.LocalExecutor"):
        executors.register("local")(type("Other", (), {"run": lambda self, tasks, fn, on_done=None: None}))
    with pytest.raises(ExecutorError, match="lacks run"):
        executors.register("idle")(type("Idle", (), {}))

    dist = tmp_path / "fake_exec-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-exec\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{executors.ENTRY_POINT_GROUP}]\nserial = fake_exec_mod:Serial\nbroken = fake_exec_mod:Missing\n")
    (tmp_path / "fake_exec_mod.py").write_text(
        "from shortcutlab.sweep import TaskFailed\n"
        "class Serial:\n"
        "    def __init__(self, workers=1):\n"
        "        self.workers = workers\n"
        "    def run(self, tasks, fn, on_done=None):\n"
        "        for t in tasks:\n"
        "            try:\n"
        "                r = fn(t)\n"
        "            except Exception as e:\n"
        "                raise TaskFailed(t, e) from e\n"
        "            if on_done:\n"
        "                on_done(t, r)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.warns(UserWarning, match="'broken'"):
            loaded = executors.load_entry_points(force=True)
        assert loaded == ["serial"] and "serial" in executors.available()
        check_executor(executors.get_class("serial"))
        # the CLI offers it and hands it --workers (run_sweep replaced: only the executor matters)
        made = []
        monkeypatch.setattr("shortcutlab.sweep.runner.run_sweep", lambda cfg, out, ex, progress, **kw: made.append(ex) or
                            {"n_tasks": 0, "done_before": {}, "n_models": 0, "seconds": 0.0})
        config = tmp_path / "sweep.yaml"
        config.write_text(SWEEP_YAML)
        sweep = ["sweep", str(config), "--out", str(tmp_path / "out"), "--quiet"]
        assert main([*sweep, "--executor", "serial", "--workers", "3"]) == 0
        assert len(made) == 1 and type(made[0]).__name__ == "Serial" and made[0].name == "serial" and made[0].workers == 3
        capsys.readouterr()
        assert main([*sweep, "--executor", "serial", "--address", "auto"]) == 2
        assert capsys.readouterr().err.strip() == "shortcutlab sweep: error: --address is for --executor ray"
        assert main([*sweep, "--executor", "ray", "--workers", "2"]) == 2
        assert capsys.readouterr().err.strip() == "shortcutlab sweep: error: --workers is for --executor local or serial"
        assert len(made) == 1
    finally:
        executors.unregister("serial")
    assert "serial" not in executors.available()


def test_registering_the_ray_executor_imports_no_ray():
    """`import shortcutlab.sweep` registers 'ray' and the CLI lists it without importing Ray."""
    import subprocess
    import sys

    code = ("import sys; from shortcutlab.cli import build_parser; build_parser(); "
            "from shortcutlab.sweep import executors; executors.get_class('ray'); print('ray' in sys.modules)")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=root), timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "False"


# --- RayExecutor (one local 2-CPU Ray for the module) ----------------------------------------
@pytest.fixture(scope="module")
def ray_session():
    ray = pytest.importorskip("ray")
    from shortcutlab.sweep.executors.ray import RayExecutor

    with RayExecutor(num_cpus=2, num_gpus=1) as ex:  # the executor's own local start
        assert ray.is_initialized()
        yield ex
    assert not ray.is_initialized(), "the executor did not shut down the Ray it started"


def ray_executor(**kw):
    from shortcutlab.sweep.executors.ray import RayExecutor

    return RayExecutor(**kw)


@pytest.mark.slow
def test_ray_matches_local_outputs_and_on_done_calls(ray_session, tmp_path):
    graph, ids = diamond()
    local = run_with(LocalExecutor(workers=1), graph, tmp_path / "local")
    pool = run_with(LocalExecutor(workers=2), graph, tmp_path / "pool")
    on_ray = run_with(ray_session, graph, tmp_path / "ray")
    expected = expected_outputs(graph)
    assert outputs(tmp_path / "local") == outputs(tmp_path / "pool") == outputs(tmp_path / "ray") == expected
    key = lambda calls: sorted(calls, key=lambda c: c[0])  # noqa: E731
    assert key(on_ray) == key(local) == key(pool)
    position = {tid: i for i, (tid, _) in enumerate(on_ray)}
    for t in graph.ordered():
        assert all(position[d] < position[t.id] for d in t.deps)
    import ray

    assert ray.is_initialized()  # run() leaves a connection it did not open


@pytest.mark.slow
def test_ray_failure_names_the_task_and_the_original_cause(ray_session, tmp_path):
    import ray

    graph, ids = diamond(fail="b")
    out = tmp_path / "out"
    out.mkdir()
    calls: list[str] = []
    with pytest.raises(TaskFailed) as info:
        ray_session.run(graph.ordered(), functools.partial(toy, str(out)), lambda t, r: calls.append(t.id))
    e = info.value
    assert e.task.id == ids["b"]
    assert type(e.cause) is ValueError  # unwrapped: not a RayTaskError
    assert not isinstance(e.cause, ray.exceptions.RayTaskError)
    assert str(e) == f"toy task {ids['b']} failed: ValueError: planted failure in b"
    assert isinstance(e.__cause__, ray.exceptions.RayTaskError)  # the remote traceback, for debugging
    assert ids["d"] not in calls and not (out / f"{ids['d']}.txt").exists()
    assert sorted(calls) == sorted(p.stem for p in out.glob("*.txt"))


@pytest.mark.slow
def test_ray_retries_a_task_whose_worker_died(ray_session, tmp_path):
    from shortcutlab.sweep.executors.ray import WorkerDied

    graph, ids = diamond(die_once="c")
    calls = run_with(ray_executor(max_retries=1), graph, tmp_path / "out")
    assert (tmp_path / "out" / f"{ids['c']}.died").exists()  # the first attempt did die
    assert outputs(tmp_path / "out") == expected_outputs(graph)
    assert sorted(tid for tid, _ in calls) == sorted(ids.values())

    graph, ids = diamond(die_once="c")
    out = tmp_path / "again"
    out.mkdir()
    calls = []
    with pytest.raises(TaskFailed) as info:
        ray_executor(max_retries=0).run(graph.ordered(), functools.partial(toy, str(out)), lambda t, r: calls.append(t.id))
    e = info.value
    assert e.task.id == ids["c"] and isinstance(e.cause, WorkerDied)
    assert "died" in str(e) and "max_retries=0" in str(e) and "\n" not in str(e)
    assert ids["d"] not in calls and not (out / f"{ids['d']}.txt").exists()


@pytest.mark.slow
def test_ray_reserves_each_tasks_resources(ray_session):
    g = TaskGraph()
    g.add("two_cpus", {}, resources={"cpu": 2})
    g.add("gpu", {}, resources={"cpu": 1, "gpu": 1})
    results = {}
    ray_session.run(g.ordered(), assigned_resources, lambda t, r: results.__setitem__(t.kind, r))
    assert results["two_cpus"] == {"CPU": 2.0}
    assert results["gpu"] == {"CPU": 1.0, "GPU": 1.0}


@pytest.mark.slow
def test_ray_refuses_a_task_no_node_can_hold_before_running_anything(ray_session, tmp_path):
    from shortcutlab.sweep.executors.ray import RayExecutorError

    graph, ids = diamond()
    big = graph.add("train", {"name": "big"}, deps=[ids["a"]], resources={"cpu": 1, "gpu": 2})
    with pytest.raises(RayExecutorError) as info:
        run_with(ray_session, graph, tmp_path / "out")
    message = str(info.value)
    assert f"train task {big} needs 1 CPU, 2 GPU" in message and "1 GPU" in message and "\n" not in message
    assert outputs(tmp_path / "out") == {}  # refused before anything was submitted


@pytest.mark.slow
def test_ray_names_a_task_function_the_workers_cannot_import(ray_session, tmp_path, monkeypatch):
    import sys

    from shortcutlab.sweep.executors.ray import WorkerSetupError

    (tmp_path / "late_tasks.py").write_text("def work(task):\n    return {}\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # after Ray started: its workers do not see it
    monkeypatch.delitem(sys.modules, "late_tasks", raising=False)
    import late_tasks

    g = TaskGraph()
    tid = g.add("train", {"seed": 1})
    with pytest.raises(TaskFailed) as info:
        ray_session.run(g.ordered(), late_tasks.work)
    assert isinstance(info.value.cause, WorkerSetupError)
    message = str(info.value)
    assert f"train task {tid} failed" in message and "No module named 'late_tasks'" in message
    assert "runtime_env" in message and "\n" not in message
    sys.modules.pop("late_tasks", None)


_CONNECTING_DRIVER = """
import functools, json, sys
import ray
from shortcutlab.sweep.executors.ray import RayExecutor
from test_sweep_executors import diamond, toy
graph, ids = diamond()
calls = []
RayExecutor(address=sys.argv[1]).run(graph.ordered(), functools.partial(toy, sys.argv[2]), lambda t, r: calls.append(t.id))
print(json.dumps({"calls": calls, "connected_after": ray.is_initialized()}))
"""


@pytest.mark.slow
def test_ray_connects_to_a_running_cluster_and_leaves_it_running(ray_session, tmp_path):
    """A second driver joins the module's Ray by its address, as `--address HOST:PORT` does."""
    import subprocess
    import sys

    import ray

    address = ray.get_runtime_context().gcs_address
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]))
    proc = subprocess.run([sys.executable, "-c", _CONNECTING_DRIVER, address, str(out)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    graph, ids = diamond()
    assert sorted(report["calls"]) == sorted(ids.values()) and report["connected_after"] is False
    assert outputs(out) == expected_outputs(graph)
    assert ray.get(ray.put(1)) == 1  # the cluster it joined is still up


# --- issue 20: no orphans. A pool worker exits when its parent dies, even by SIGKILL, and
# takes its own children with it. Checked on real processes through /proc (Linux).
def sleeper(folder: str, task: Task) -> dict:
    """A task that records its pid and that of a child process it starts, then sleeps."""
    import multiprocessing

    child = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(120,))
    child.start()
    write_text(os.path.join(folder, f"{task.id}.pids"), f"{os.getpid()} {child.pid}")
    time.sleep(120)
    return {}


def _running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (a zombie has exited: only its reaping,
    which is init's business once the parent is gone, is pending)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


POOL_SCRIPT = """
import functools, sys
sys.path.insert(0, {tests!r})
from shortcutlab.sweep import LocalExecutor, TaskGraph
from test_sweep_executors import sleeper
g = TaskGraph()
tasks = [g[g.add("sleep", {{"i": i}})] for i in range(2)]
LocalExecutor(workers=2).run(tasks, functools.partial(sleeper, {folder!r}))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads the process table from /proc")
def test_pool_workers_and_their_children_exit_when_the_parent_is_sigkilled(tmp_path):
    import signal
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = POOL_SCRIPT.format(tests=os.path.join(root, "tests"), folder=str(tmp_path))
    env = dict(os.environ, PYTHONPATH=root)
    parent = subprocess.Popen([sys.executable, "-c", script], env=env, stderr=subprocess.PIPE)
    pids: list[int] = []
    try:
        deadline = time.time() + 120
        while time.time() < deadline and parent.poll() is None:
            files = [f for f in os.listdir(tmp_path) if f.endswith(".pids")]
            if len(files) == 2:
                pids = [int(p) for f in files for p in (tmp_path / f).read_text().split()]
                break
            time.sleep(0.1)
        assert parent.poll() is None, parent.stderr.read().decode()[-800:]
        assert len(pids) == 4 and all(_running(p) for p in pids)  # two workers, each with a child, all mid-task
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.time() + 10  # the watch polls every 0.5 s; PR_SET_PDEATHSIG is immediate on Linux
        while time.time() < deadline and any(_running(p) for p in pids):
            time.sleep(0.1)
        assert [p for p in pids if _running(p)] == []
    finally:
        for p in [parent.pid, *pids]:
            if _running(p):
                os.kill(p, signal.SIGKILL)


def test_watch_parent_ends_a_process_whose_parent_is_gone():
    # the portable half alone (no prctl): a process whose recorded parent is not its parent
    # ends itself within a poll, with exit status 1
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    from shortcutlab.sweep.executors import local as executors

    proc = ctx.Process(target=_watch_then_sleep, args=(os.getpid() + 10**6,))
    proc.start()
    proc.join(60)
    alive = proc.is_alive()
    if alive:
        proc.kill()
    assert not alive and proc.exitcode == 1
    assert executors.PARENT_POLL_S <= 1


def _watch_then_sleep(parent_pid: int) -> None:
    from shortcutlab.sweep.executors import local as executors

    executors._set_pdeathsig = lambda: None
    executors._watch_parent(parent_pid, poll_s=0.05)
    time.sleep(60)
