"""Link prediction on the ogbl-citation2-shaped preset: GraphSAGE with
neighbour sampling and a dot-product decoder, each validation and test
edge ranked against 1,000 fixed negatives of its source (OGB's protocol).
Published ogbl-citation2 test MRR: GraphSAGE with neighbour sampling
0.8044, MLP 0.2904."""

from jdirect.graph.training import TrainConfig


def get_config() -> TrainConfig:
    return TrainConfig(dataset="citation2", task="link", model="sage", fanouts=(15, 10, 5),
                       batch_size=4096, hidden=256, dropout=0.0, lr=1e-3, epochs=3,
                       negatives=1, eval_negatives=1000)
