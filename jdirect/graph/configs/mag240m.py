"""MAG240M-shaped typed graph (`hetero.presets`: 121.8M papers with 768
bfloat16 features, 187 GB, 153 classes; 122.4M authors, 25.7K
institutions; writes, cites, affiliated_with and their reverses, ~3.6B
stored edges; author and institution rows derived as the OGB-LSC baseline
does): R-GraphSAGE with the paper table larger than a GPU's memory, read
from host memory. Published validation accuracies: R-GraphSAGE 0.6986,
GraphSAGE 0.6679, MLP 0.5267.

Full size needs ~400 GB of host memory (papers and derived authors in
bfloat16, CSRs): pass `--scale` (a share of every type's nodes) for the
host at hand, e.g. `--scale 0.25` on a 128 GB machine; a 512 GB one holds
it whole."""

from jdirect.graph.training import TrainConfig


def get_config() -> TrainConfig:
    # OGB-LSC's rgnn.py: 2 layers of fanout 25 and 15, batch 1024, hidden 1024.
    return TrainConfig(dataset="mag240m", fanouts=(25, 15), batch_size=1024, hidden=1024,
                       dropout=0.5, lr=1e-3, epochs=2, eval_max=20_000, full_eval=False)
