"""Link prediction's decoders and `LinkModel`: any encoder of the registry
(`models.build`, its output a node embedding) and a decoder that scores a
pair of embeddings.

A new decoder is a class here plus one line in `DECODERS`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from .base import GNNModel, Keep, linear


class DotDecoder(nnx.Module):
    """score(u, v) = <h_u, h_v> (the graph autoencoder's, Kipf & Welling 2016)."""

    def __init__(self, dim: int, *, rngs: nnx.Rngs):
        del dim, rngs

    def __call__(self, h_src: jax.Array, h_dst: jax.Array) -> jax.Array:
        """float32[...]: scores of rows `h_src`, `h_dst` [..., dim] (broadcast)."""
        return (h_src * h_dst).sum(-1)


class MLPDecoder(nnx.Module):
    """score(u, v) = w2 . relu(W1 (h_u * h_v) + b1) + b2: an MLP over the
    pair's elementwise product (OGB's link examples' `LinkPredictor`),
    symmetric in u and v."""

    def __init__(self, dim: int, *, rngs: nnx.Rngs):
        self.hidden = linear(dim, dim, rngs=rngs)
        self.out = linear(dim, 1, rngs=rngs)

    def __call__(self, h_src: jax.Array, h_dst: jax.Array) -> jax.Array:
        """float32[...]: scores of rows `h_src`, `h_dst` [..., dim] (broadcast)."""
        return self.out(jax.nn.relu(self.hidden(h_src * h_dst)))[..., 0]


# Name (the CLI's --decoder) -> class.
DECODERS: dict[str, type] = {"dot": DotDecoder, "mlp": MLPDecoder}


class LinkModel(nnx.Module):
    """An encoder (a `GNNModel` whose outputs are embeddings) and a decoder.

    `__call__(x, batch, keep)` is the encoder's on the node batch of a
    `sampling.LinkBatch` (the embeddings of its seeds, the distinct
    endpoints); `score(h_src, h_dst)` the decoder's. Dropout and layer-wise
    inference see the encoder (`encoder`, `dropout_spec`, `rate`).
    """

    def __init__(self, encoder: GNNModel, decoder: str, *, seed: int):
        if decoder not in DECODERS:
            raise ValueError(f"unknown decoder {decoder!r}; choose from {', '.join(DECODERS)}")
        self.encoder = encoder
        self.decoder = DECODERS[decoder](encoder.dims[-1], rngs=nnx.Rngs(seed + 1))
        self.rate = encoder.rate

    def dropout_spec(self, batch: Any) -> Keep:
        """The encoder's dropout on the node batch of `batch`."""
        return self.encoder.dropout_spec(batch.nodes)

    def __call__(self, x: jax.Array, batch: Any, keep: Keep | None = None) -> jax.Array:
        """float32[seeds, dim]: embeddings of `batch.nodes`' seeds from rows
        `x` of `batch.input_nodes`."""
        return self.encoder(x, batch.nodes, keep)

    def score(self, h_src: jax.Array, h_dst: jax.Array) -> jax.Array:
        """The decoder's scores (logits) of embedding pairs."""
        return self.decoder(h_src.astype(jnp.float32), h_dst.astype(jnp.float32))
