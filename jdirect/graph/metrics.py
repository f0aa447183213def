"""The names of the figures that the trainer and every benchmark report.

One set, so that a figure means the same in a metrics file, a benchmark's
JSON and benchmarks/RESULTS.md. Times are seconds; "epoch" is one pass over
the training nodes. A benchmark that reports the median of several epochs
says so in its own docstring; the name keeps its meaning.

`check(record)` refuses a name that is not here: a new figure gets a name
and a meaning in `METRICS` first.
"""

from __future__ import annotations

from typing import Any, Mapping

# How an accuracy was measured: a run's or a record's "protocol" maps each
# accuracy it reports to one of these.
FULL = "full split, full neighbourhoods (layer-wise inference)"
SAMPLED = "sampled neighbours (the training fanouts), at most eval_max nodes"

METRICS: dict[str, str] = {
    # The trainer, per epoch (Trainer.train_epoch) and per run (Trainer.fit).
    "epoch": "the epoch's index, from 0",
    "loss": "mean cross-entropy over the epoch's training seeds (link task: over its scored "
            "pairs, or its BPR pairs)",
    "train_acc": "accuracy over the epoch's training seeds, as trained on (dropout on; link "
                 "task: share of scored pairs on the right side, or BPR pairs won)",
    "val_acc": "per epoch: accuracy on the validation nodes after the epoch, sampled (at "
               "most eval_max nodes; None: not measured, as in a run of one epoch with "
               "full_eval); per run: the best epoch's model on every validation node, full "
               "neighbourhoods (None: none; the run's `protocol` says which)",
    "test_acc": "accuracy on the test nodes of the best epoch's model: every test node with "
                "full neighbourhoods (layer-wise inference), or sampled without full_eval "
                "(None: none; the run's `protocol` says which)",
    "sampled_test_acc": "test_acc measured as in training: sampled neighbours, at most "
                        "eval_max nodes (None: not measured: a run of one epoch with "
                        "full_eval, whose test_acc is the full split's)",
    "sampled_val_acc": "the validation accuracy measured as in training: sampled "
                       "neighbours, at most eval_max nodes",
    "full_eval_layers": "per layer of the full-split evaluation's layer-wise inference, "
                        "input side first: its seconds (s), link bytes (link_gb) and where it "
                        "read its edges (edges: inference.Report.edges)",
    "protocol": "per accuracy of a run, how it was measured; best_epoch: which epoch's model "
                "is evaluated",
    # The link task (tasks/ranking.py: OGB's evaluators), of the validation
    # (val_) and test (test_) edges, each positive against its source's
    # fixed negatives, embeddings with full neighbourhoods.
    **{f"{part}_{name}": f"{meaning} ({'validation' if part == 'val' else 'test'} edges)"
       for part in ("val", "test") for name, meaning in (
           ("mrr", "mean reciprocal rank of each positive among its source's negatives, ties "
                   "counted half (OGB's _eval_mrr)"),
           ("hits@20", "share of positives scored above the 20th best of all negatives "
                       "(OGB's _eval_hits)"),
           ("hits@50", "hits@K with K = 50"),
           ("hits@100", "hits@K with K = 100"),
           ("auc", "ROC-AUC of positives against all negatives (scikit-learn's roc_auc_score)"),
           ("ap", "average precision of the same (scikit-learn's average_precision_score)"))},
    "epochs": "epochs the run trained (min_steps can raise it above the configuration's)",
    "best_epoch": "the epoch whose model is evaluated: the best validation accuracy's (the "
                  "last without validation nodes, or with a learned embedding, which "
                  "changes in place; the run's protocol says which; -1 before any)",
    "epoch_s": "wall time of one training epoch, end to end: from its first dispatch to its "
               "metrics read back (what a user waits for)",
    "epochs_s": "epoch_s of each timed epoch, in order (a list)",
    "batches": "optimizer steps in one epoch",
    "cpu_sample_s": "CPU sampler: worker-seconds spent sampling in the epoch (summed over "
                    "workers, so it can exceed epoch_s)",
    "stage_s": "CPU sampler: worker-seconds spent staging rows (the host source's gather and "
               "copy)",
    "wait_s": "CPU sampler: seconds the training loop waited for its next batch",
    "cache_hits": "rows of the feature source the epoch's training batches read from the "
                  "device cache (summed over devices; padding not counted; a learned "
                  "embedding's reads and writes are not counted; a partitioned cache's: "
                  "rows of the reading device's own slice)",
    "peer_rows": "rows of a partitioned cache (jdirect-partitioned) that the epoch's training "
                 "batches received from the device holding them (summed over devices; padding "
                 "not counted)",
    "peer_gb": "peer_rows x the decoded row's bytes, 1e9: the rows' payload between devices "
               "(NVLink between GPUs), not the exchange's fixed-size buffers",
    "pcie_rows": "rows of the feature source the epoch's training batches read over PCIe "
                 "(cache misses; summed over devices; the host source's staged rows and a "
                 "learned embedding's rows are not counted). This and cache_hits are summed "
                 "in float32 on the device: exact up to 2**24 rows an epoch, within ~1e-4 "
                 "relative beyond",
    "pcie_gb": "pcie_rows x the stored row's bytes (an int8 row's packed d + 4), 1e9: the "
               "rows' payload over PCIe, not the link's transactions",
    "learned_rows": "rows of the learned table (--embedding-dim) the epoch's training steps "
                    "read and wrote back: each step's input nodes (padding not counted); "
                    "summed in float32 on the device, as pcie_rows",
    "learned_gb": "learned_rows x a row's bytes with its sparse optimizer's slots (float32), "
                  "1e9: what the steps read, and then wrote, of the learned table each way "
                  "(over PCIe where the table is in host memory)",
    "link_gbps": "host -> device copy rate of a GPU's link, GB/s: a pinned 64 MB array "
                 "copied to the device, measured once per process (jdirect.environment."
                 "link_gbps; absent on the CPU backend)",
    "link_floor_s": "the epoch's link floor: pcie_gb over link_gbps times the devices (each "
                    "has its own link), the least time its PCIe rows can take; the epoch "
                    "cannot run faster than this nor than its compute, of which the trainer "
                    "knows nothing (absent where link_gbps or pcie_gb is)",
    "devices": "devices trained on, over all processes",
    "processes": "processes of the run",
    "steps_per_call": "optimizer steps per dispatch (the device sampler's loop; 1 with the "
                      "CPU sampler)",
    # Benchmarks: one epoch split into parts, each timed alone.
    "sample_epoch_s": "one epoch's sampling alone, every batch waited for "
                      "(benchmarks/sampler.py)",
    "batch_ms": "one batch sampled and waited for on its own, milliseconds (median)",
    "epoch_batch_ms": "sample_epoch_s per batch, milliseconds",
    "presampled_s": "an epoch over device-resident batches sampled beforehand, steps "
                    "dispatched back to back: feature read + update",
    "device_sample_s": "device sampler alone over the epoch's batches",
    "gather_s": "feature read alone over the epoch's batches",
    "compute_s": "update alone over the epoch's batches (rows already on the device)",
    "idle_s": "epoch_s - (device_sample_s + gather_s + compute_s): > 0 the GPU waited, "
              "< 0 overlap",
    "input_rows": "unique input rows of the epoch's batches (each batch's once)",
    "feature_gb": "bytes of those rows, 1e9",
    "read_gbps": "feature_gb / epoch_s: the feature-read rate the epoch sustained",
    "pcie_floor_s": "link_floor_s of every input row: feature_gb over link_gbps, as if "
                    "nothing were cached",
    "vs_device": "epoch_s over the device source's epoch_s with the same sampler",
    "gather_gbps": "feature_gb / gather_s: the rate of the feature read alone",
    "floor_s": "what the epoch can take at best: the larger of the device source's epoch_s "
               "with the same sampler (all in GPU memory) and its link_floor_s, both of the "
               "same run",
    "vs_floor": "epoch_s over floor_s",
    "val_acc_seeds": "val_acc of each training seed, in order (a list; the record's val_acc "
                     "is their mean)",
    "val_acc_std": "standard deviation of val_acc_seeds",
    "acc_delta_pts": "val_acc minus float32 rows' val_acc of the same run, in points",
    "speedup": "the one-device epoch_s over this run's",
}


def link_floor(pcie_gb: float | None, link_gbps: float | None,
               links: int = 1) -> float | None:
    """link_floor_s: `pcie_gb` (GB over PCIe, summed over devices) at
    `link_gbps` on each of `links` links; None without either figure (the
    CPU backend, or a source that counts no PCIe rows)."""
    if pcie_gb is None or not link_gbps:
        return None
    return pcie_gb / (link_gbps * links)


def check(record: Mapping[str, Any], *, labels: tuple[str, ...] = ()) -> Mapping[str, Any]:
    """`record` itself, once every key is a name of METRICS or one of
    `labels` (a benchmark's own settings columns, e.g. "sampler", "mode").

    Raises:
      KeyError: a key that is neither (the message names it).
    """
    unknown = [k for k in record if k not in METRICS and k not in labels]
    if unknown:
        raise KeyError(f"metric names {unknown} are not in jdirect.graph.metrics.METRICS")
    return record
