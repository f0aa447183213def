"""papers100M-sized graph without features (`papers100m-featureless`), each
node's input a learned 96-dim float32 embedding trained with row-wise
Adagrad: 111M x 96 x 4 B = 42.6 GB of rows and as much of Adagrad's
accumulator, 85.3 GB in all, more than an 80 GB GPU holds (issue 18's table
larger than the GPU). The tables live in host memory; jdirect's managed
memory may not exceed the GPU's free memory, so on an H100 (the CLI gives
JAX half of it) both are pinned (4 KB pages: the random-row rate of pinned
memory, not the link's, bounds the step). Host memory: the tables and the
graph's CSR (12.9 GB), ~100 GB, so a machine with 128 GB of RAM; a
checkpoint takes 85 GB of disk, and writing one keeps the last beside it:
170 GB (the lent nvidia-h100-x4 has 235 GB; `bash benchmarks/run.sh bigtable`).
The full-split evaluation is off: its layer tables of every node would not
fit beside them."""

from jdirect.graph.training import TrainConfig


def get_config() -> TrainConfig:
    return TrainConfig(dataset="papers100m-featureless", embedding_dim=96,
                       embedding_optimizer="adagrad", embedding_memory="host", batch_size=1024,
                       epochs=2, eval_max=50_000, full_eval=False)
