"""Training tasks: what a run learns, behind one interface (`base.Task`).

`TASKS` maps a task's name (the CLI's --task) to its opener, `(graph,
cfg) -> task`; the task says which seeds a batch has, builds the model and
gives the loss the step programs trace. A new task is one file in this
package plus one line in `TASKS`.
"""

from __future__ import annotations

from typing import Any, Callable

from ..data.csr import Graph
from .base import Task
from .link import LinkTask, open_link
from .node import NodeTask

NODE = NodeTask()


def _link(graph: Graph, cfg: Any) -> Task:
    return open_link(graph, edge_split=cfg.edge_split, negatives=cfg.negatives,
                     bias=cfg.negative_sampler, loss=cfg.link_loss, decoder=cfg.decoder,
                     eval_negatives=cfg.eval_negatives, metric=cfg.link_metric, seed=cfg.seed)


# Name -> (graph, TrainConfig) -> the task.
TASKS: dict[str, Callable[[Graph, Any], Task]] = {
    "node": lambda graph, cfg: NODE,
    "link": _link,
}

__all__ = ["LinkTask", "NODE", "NodeTask", "TASKS", "Task", "open_link"]
