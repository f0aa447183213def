"""Recommendation on a synthetic user-item graph (`recsys`: 6,000 users,
2,000 items, power-law popularity and activity, `data.recsys`): LightGCN
over no given features, each user's and item's input a learned 64-wide
row (`--embedding-dim`, lazy Adam: the BPR loss's mean over a batch gives
each row a small gradient, which Adam's scale-free step moves and
Adagrad's, from its 0.1 initial accumulator, barely does), trained with
the BPR loss against 4 sampled items a positive; each held-out (user,
item) ranked against 100 items the user never interacted with (MRR,
Hits@K; OGB's per-source protocol). The baseline (`--baseline`) is an MLP
on the same learned rows. Trains in seconds on a CPU; `--dataset
recsys-large` is the 300M-row version whose rows outgrow the GPU (kept in
host memory)."""

from jdirect.graph.training import TrainConfig


def get_config() -> TrainConfig:
    return TrainConfig(dataset="recsys", task="link", edge_split="bipartite", model="lightgcn",
                       fanouts=(10, 10), features="none", embedding_dim=64, hidden=64,
                       embedding_optimizer="adam", embedding_lr=1e-2, link_loss="bpr",
                       negatives=4, eval_negatives=100, batch_size=1024, dropout=0.0, lr=5e-3,
                       epochs=5)
