"""ogbn-mag-shaped typed graph (`hetero.presets`: 736K papers with 128
float32 features and 349 classes, 1.13M authors, 8.7K institutions, 60K
fields of study, 4 relations and their reverses; the featureless types'
rows derived): R-GraphSAGE (the sum across relations: R-GCN's form), the
paper table and the derived ones in host memory, sampling per relation
on the device. Published test accuracies to calibrate against: R-GCN with
neighbour sampling 0.4678, MLP 0.2692.

On a CPU, `--scale 0.01` (7.4K papers) trains in under a minute."""

from jdirect.graph.training import TrainConfig


def get_config() -> TrainConfig:
    # OGB's R-GCN example: 2 layers of fanout 25 and 20, batch 1024, hidden 64.
    return TrainConfig(dataset="mag", fanouts=(25, 20), batch_size=1024, hidden=64,
                       dropout=0.5, lr=1e-2, epochs=3, eval_max=20_000)
