"""Sweeps: many models, seeds, interventions and diagnostics from one config file.

A sweep is a graph of tasks (`graph.Task`: synthesise, split, train, diagnose, ...) with
content-addressed ids, so tasks shared by several grid points run once and a sweep started
again redoes only the tasks whose results are missing. Executors (`executors`) run the graph
in process, on a local process pool, or on a Ray cluster, with the same results.
"""

from shortcutlab.sweep.graph import Task, TaskGraph, task_id
from shortcutlab.sweep.executors import Executor, LocalExecutor, TaskFailed, get_executor

__all__ = ["Task", "TaskGraph", "task_id", "Executor", "LocalExecutor", "TaskFailed", "get_executor"]
