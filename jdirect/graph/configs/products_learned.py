"""ogbn-products-sized graph without features (`products-featureless`: the
`products` preset's nodes, edges, labels and splits): each node's input is a
learned 128-dim float32 embedding (1.25 GB, and 2.5 GB of lazy Adam
moments; on a GPU with room for them, in device memory: `embedding_memory`
auto; `--embedding-memory host` keeps them in host memory), trained row-wise
inside each step. The other settings
are `products`'; the MLP baseline learns embeddings too, so the gap between
the two is what the neighbourhoods give."""

from jdirect.graph.training import TrainConfig


def get_config() -> TrainConfig:
    return TrainConfig(dataset="products-featureless", embedding_dim=128,
                       embedding_optimizer="adam", embedding_lr=1e-2, batch_size=1024, epochs=6,
                       eval_max=20_000)
