"""seqpack.collective.encoder_route.plan_route, every rank of a round simulated in one process:
the all-to-alls its split sizes describe bring each image's patches to its encoder in
``encode_grids`` order, and each image's embeddings back to its home rank in local order
(hypothesis over grids, homes and encoders; the collectives themselves run in
tests/distributed/test_encoder_rebalance_dist.py)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from seqpack.collective.encoder_route import plan_route

MERGE = 2


def _all_to_all(sends: list[np.ndarray], send_splits: list[list[int]], recv_splits: list[list[int]]):
    """What each rank receives (rows by source rank) from ``sends`` split by ``send_splits``."""
    num_ranks = len(sends)
    chunks = [np.split(sends[s], np.cumsum(send_splits[s])[:-1]) for s in range(num_ranks)]
    out = []
    for r in range(num_ranks):
        parts = [chunks[s][r] for s in range(num_ranks)]
        assert [len(p) for p in parts] == recv_splits[r]  # both sides agree on every split
        out.append(np.concatenate(parts) if parts else np.zeros(0))
    return out


images = st.lists(
    st.tuples(st.integers(1, 2), st.integers(1, 3), st.integers(1, 3), st.integers(0, 2), st.integers(0, 2)),
    max_size=8,
)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 3), images)
def test_patches_reach_their_encoder_and_embeddings_come_home_in_order(num_ranks, rows):
    rows = [(t, MERGE * h, MERGE * w, home % num_ranks, enc % num_ranks) for t, h, w, home, enc in rows]
    grids = np.array([r[:3] for r in rows], dtype=np.int64).reshape(-1, 3)
    home = np.array([r[3] for r in rows], dtype=np.int64)
    order = np.argsort(home, kind="stable")  # the gather gives grids in rank order
    grids, home = grids[order], home[order]
    encoder = np.array([r[4] for r in rows], dtype=np.int64)[order]
    patches = grids.prod(axis=1)
    image_of_patch = np.repeat(np.arange(home.size), patches)  # each patch row names its image
    routes = [plan_route(grids, home, encoder, r, num_ranks, MERGE) for r in range(num_ranks)]

    local_pixels = [image_of_patch[np.isin(image_of_patch, np.flatnonzero(home == r))] for r in range(num_ranks)]
    sends = [local_pixels[r][routes[r].send_patch_rows] for r in range(num_ranks)]
    received = _all_to_all(sends, [x.send_patches for x in routes], [x.recv_patches for x in routes])
    encoded_images = []
    for r in range(num_ranks):
        mine = np.flatnonzero(encoder == r)
        mine = mine[np.lexsort((mine, home[mine]))]  # by home, then home's order
        encoded_images.append(mine)
        assert np.array_equal(routes[r].encode_grids, grids[mine])
        assert np.array_equal(received[r], np.repeat(mine, patches[mine]))  # whole images, in order

    embeds = patches // MERGE**2
    encoded = [np.repeat(ids, embeds[ids]) for ids in encoded_images]  # an embedding row names its image
    back = _all_to_all(encoded, [x.send_embeds for x in routes], [x.recv_embeds for x in routes])
    for r in range(num_ranks):
        local = np.flatnonzero(home == r)
        assert np.array_equal(back[r][routes[r].local_embed_rows], np.repeat(local, embeds[local]))
    assert sum(len(e) for e in encoded) == int(embeds.sum())  # every image encoded once
