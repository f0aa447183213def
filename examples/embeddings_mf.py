"""Matrix factorisation whose embedding tables live in host memory.

A seeded synthetic interaction set: users and items have hidden taste
vectors, and a (user, item) pair is a like (1) when their dot product is
positive. The model learns a user table and an item table of `--dim`
columns, both `jdirect.embeddings` tables in host memory: each step looks
up its rows (`jdirect.gather`), and the row-wise sparse Adam updates only
the rows (and moments) the batch touched, in place, in the same compiled
program. Held-out pairs measure it against chance (0.5).

  python examples/embeddings_mf.py            # 5,000 users, 2,000 items
  python examples/embeddings_mf.py --small    # a test's size, seconds
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jdirect import embeddings as emb
from jdirect.graph.cli_args import Parser, number


def interactions(users: int, items: int, pairs: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    """(user ids, item ids, likes): `pairs` random pairs, int32, int32, float32."""
    rng = np.random.default_rng(seed)
    taste_u, taste_i = rng.normal(size=(users, 8)), rng.normal(size=(items, 8))
    u = rng.integers(0, users, pairs, dtype=np.int32)
    i = rng.integers(0, items, pairs, dtype=np.int32)
    likes = ((taste_u[u] * taste_i[i]).sum(-1) > 0).astype(np.float32)
    return u, i, likes


opt = emb.sparse_adam(0.02)


@jax.jit
def train_step(user_table, item_table, user_state, item_state, u, i, likes):
    ru, ri = emb.lookup(user_table, u), emb.lookup(item_table, i)  # [batch, dim] each

    def loss_fn(ru, ri):
        return optax.sigmoid_binary_cross_entropy((ru * ri).sum(-1), likes).mean()

    loss, (gu, gi) = jax.value_and_grad(loss_fn, argnums=(0, 1))(ru, ri)
    user_table, user_state = opt.apply(user_table, user_state, u, gu, rows=ru)
    item_table, item_state = opt.apply(item_table, item_state, i, gi, rows=ri)
    return user_table, item_table, user_state, item_state, loss


@jax.jit
def right(user_table, item_table, u, i, likes):
    score = (emb.lookup(user_table, u) * emb.lookup(item_table, i)).sum(-1)
    return ((score > 0) == (likes > 0)).sum()


def main(argv: list[str] | None = None) -> None:
    p = Parser(description=__doc__.splitlines()[0],
               formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--small", action="store_true",
                   help="500 users, 200 items, 40,000 pairs (a test's size) instead of "
                        "5,000, 2,000, 600,000")
    p.add_argument("--dim", type=number(int, 1), default=8,
                   help="columns of each embedding table")
    p.add_argument("--epochs", type=number(int, 1), default=4,
                   help="passes over the training pairs")
    args = p.parse_args(argv)  # refusals in one line, as the command's
    users, items, pairs = (500, 200, 40_000) if args.small else (5_000, 2_000, 600_000)
    u, i, likes = interactions(users, items, pairs)
    test = pairs // 10  # the last tenth, held out
    batch = 1024
    print(f"{users:,} users, {items:,} items, {pairs - test:,} training pairs, "
          f"{likes.mean():.0%} likes")
    made = emb.create_table(users, args.dim, seed=1), emb.create_table(items, args.dim, seed=2)
    states = opt.init(made[0]), opt.init(made[1])  # Adam's moments, host tables too
    tables = (*made, *states)
    losses = []
    for epoch in range(args.epochs):
        order = np.random.default_rng(epoch).permutation(pairs - test)
        steps = []
        for start in range(0, len(order) - batch + 1, batch):  # whole batches: one compilation
            b = order[start:start + batch]
            *tables, loss = train_step(*tables, u[b], i[b], likes[b])
            steps.append(loss)
        losses.append(float(jnp.mean(jnp.stack(steps))))
        print(f"epoch {epoch}: loss {losses[-1]:.4f}")
    held = slice(pairs - test, pairs)
    accuracy = int(right(tables[0], tables[1], u[held], i[held], likes[held])) / test
    print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}, held-out accuracy {accuracy:.3f} "
          "(chance 0.500)")
    emb.close((made, states))  # the tables and moments made above; `tables` are their views


if __name__ == "__main__":
    main()
