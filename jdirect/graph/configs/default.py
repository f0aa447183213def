"""The README's main job: the embedded `small` graph (20,000 nodes), features
in host memory read by jdirect.gather; about a minute on 2 CPU cores.

Also the configuration of graphs read from files (`--dataset ogb` or
`reddit` without `--config`). `batch="auto"` trains a graph whose step
fits `training.full_batch.FULL_BATCH_BYTES` full-batch (the citation graphs:
Cora, Citeseer), so the best epoch is chosen by the exact validation
accuracy; `small` and larger graphs sample (docs/real-graphs.md). min_steps
makes a full batch's 8 epochs 100 steps (one an epoch), said in the log;
an explicit --epochs is run as given."""

from jdirect.graph.training import TrainConfig


def get_config() -> TrainConfig:
    return TrainConfig(dataset="small", batch_size=256, epochs=8, min_steps=100, batch="auto")
