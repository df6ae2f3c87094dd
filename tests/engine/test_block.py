"""Blocks of nodes (gossip/core/block.py): routing plans, and block rounds equal to the per-node math."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import torch

import topologies
from gossip.algorithms import make_algorithm
from gossip.core.algorithm import Algorithm
from gossip.core.requirements import Graph, Requirements
from gossip.core.routing import MixPlan
from gossip.engine import Engine


def _irregular() -> topologies.Topology:
    g = nx.star_graph(5)  # node 0 has 5 neighbors, the others 1
    g.add_edges_from([(1, 2), (3, 4), (5, 6), (6, 0)])
    return topologies.Topology(g)


def test_plan_slots_list_each_nodes_in_neighbors_in_sorted_order():
    topo = _irregular()
    ids = list(range(topo.n))
    plan = MixPlan.build(topo, ids, lambda j: True, torch.device("cpu"))
    seen: dict[int, list[tuple[int, float]]] = {i: [] for i in ids}
    for src, dst, w in plan.slots:
        rows = dst.tolist() if dst is not None else ids
        for r, s, wt in zip(rows, src.tolist(), w.tolist()):
            seen[ids[r]].append((plan.sender_of[s], wt))
    for i in ids:
        view = topo.view(i)
        assert seen[i] == list(zip(view.in_neighbors, view.in_weights))
    assert plan.self_weight.tolist() == [topo.view(i).self_weight for i in ids]
    assert not plan.remote_in and not plan.remote_out


def test_plan_routes_remote_edges_to_staging_rows_after_the_blocks_own():
    topo = _irregular()
    ids = [0, 1, 2]  # this process hosts nodes 0..2; the rest are remote
    plan = MixPlan.build(topo, ids, lambda j: j in ids, torch.device("cpu"))
    remote_in = sorted((j, i) for i in ids for j in topo.view(i).in_neighbors if j not in ids)
    assert [(j, i) for j, i, _ in plan.remote_in] == remote_in
    assert [row for _, _, row in plan.remote_in] == list(range(3, 3 + len(remote_in)))
    remote_out = sorted((i, j) for i in ids for j in topo.view(i).out_neighbors if j not in ids)
    assert [(ids[r], j) for r, j in plan.remote_out] == remote_out
    assert plan.out_degree == [len(topo.view(i).out_neighbors) for i in ids]


@pytest.mark.parametrize(("alg", "spec", "hp"), [
    ("gossip", "none", {"gamma": 1.0}),
    ("gossip", "topk:0.2", {"gamma": 0.5}),
    ("choco", "topk:0.2", {"gamma": 0.3}),
    ("choco", "sign", {"gamma": 0.3}),
])
def test_block_round_equals_the_per_node_update_on_an_irregular_graph(alg, spec, hp):
    """One round of the block engine against a per-node loop of the same update (float64)."""
    topo = _irregular()
    gen = torch.Generator().manual_seed(3)
    X0 = torch.randn(topo.n, 30, generator=gen, dtype=torch.float64)
    eng = Engine(make_algorithm(alg, **hp), topo, lambda i: X0[i], compressor=spec)
    comp = eng.block.compressor
    X, W = X0.clone(), topo.dense()
    x_hat, s = torch.zeros_like(X), torch.zeros_like(X)
    for _ in range(3):
        eng.step()
        if alg == "gossip":
            Q = torch.stack([comp.decode(comp.encode(X[i])) for i in range(topo.n)])
            X = X + hp["gamma"] * (torch.from_numpy(W) @ Q - Q)
        else:
            X = X + hp["gamma"] * (s - x_hat)
            Q = torch.stack([comp.decode(comp.encode(X[i] - x_hat[i])) for i in range(topo.n)])
            x_hat = x_hat + Q
            s = s + torch.from_numpy(W) @ Q
        np.testing.assert_allclose(eng.block.x.numpy(), X.numpy(), rtol=1e-12, atol=1e-12)


def test_node_models_are_views_of_the_block():
    topo = topologies.build("ring", 5)
    eng = Engine(make_algorithm("choco"), topo, lambda i: torch.full((4,), float(i)),
                 compressor="topk:2")
    eng.run(3)
    for r, i in enumerate(eng.block.ids):
        assert eng.nodes[i].x.data_ptr() == eng.block.x[r].data_ptr()
        assert eng.nodes[i].state["x_hat"].data_ptr() == eng.block.state["x_hat"][r].data_ptr()


class _ChangesXBeforeMixing(Algorithm):
    """Sends x with 'none' (from x's own memory), then scales x before decoding: a bug."""

    name = "changes-x-before-mixing"

    def setup(self, block):
        block.workspace["acc"] = torch.zeros_like(block.x)

    def step(self, block):
        inbox = yield block.encode(block.x)
        block.x.mul_(0.5)
        block.mix_into(block.workspace["acc"], inbox, inbox)


def test_decoding_a_model_sent_in_place_after_it_changed_is_refused():
    from gossip.errors import ContractError, NodeError

    eng = Engine(_ChangesXBeforeMixing(), topologies.build("ring", 4), lambda i: torch.ones(5),
                 compressor="none")
    with pytest.raises((ContractError, NodeError), match="changed after its message was sent"):
        eng.step()
    Engine(_ChangesXBeforeMixing(), topologies.build("ring", 4), lambda i: torch.ones(5),
           compressor="topk:0.4").step()  # a message of its own rows: x may change


def test_models_go_out_with_none_from_their_own_memory():
    """block.x sits in message rows: gossip with 'none' sends the models without copying them,
    byte for byte the single-message encoding."""
    topo = topologies.build("ring", 4)
    eng = Engine(make_algorithm("gossip"), topo, lambda i: torch.arange(6.0) + i, compressor="none")
    seen = []
    original = eng.transport.start_rows

    def capture(rows, plan, seq, round_):
        seen.append((rows.own.data_ptr(), rows.mine().clone(), eng.block.x.clone()))
        return original(rows, plan, seq, round_)

    eng.transport.start_rows = capture
    eng.step()
    own_ptr, sent, x = seen[0]
    assert own_ptr + 8 == eng.block.x.data_ptr()  # the header bytes, then the model itself
    comp = eng.block.compressor
    for r in range(4):
        assert torch.equal(sent[r], comp.encode(x[r]).to_bytes())


def test_pack_frames_each_nodes_messages_and_checks_every_part():
    """Two tensors as one message a node, byte for byte the per-node pack of the two
    encodings; a received row whose second part is corrupt is refused naming its sender."""
    from types import SimpleNamespace

    from gossip.compress import make
    from gossip.core.block import Block
    from gossip.errors import RowsError

    topo = topologies.build("ring", 6)
    ids = [0, 1, 2]
    plan = MixPlan.build(topo, ids, lambda j: j in ids, torch.device("cpu"))
    gen = torch.Generator().manual_seed(5)
    X = torch.randn(3, 11, generator=gen, dtype=torch.float64)
    Y = torch.randn(3, 7, generator=gen, dtype=torch.float64)
    block = Block([SimpleNamespace(id=i) for i in ids], X, make("sign"), lambda: make("topk:3"))
    block.begin_round(1, plan)
    msg = block.pack([block.encode(X), block.encode(Y, block.stream_compressor("y"))])
    a, b = msg.parts
    sign, topk = make("sign"), make("topk:3")
    for r in range(3):
        assert torch.equal(a.mine()[r], sign.encode(X[r]).to_bytes())
        assert torch.equal(b.mine()[r], topk.encode(Y[r]).to_bytes())
        parts = [sign.encode(X[r]).to_bytes(), topk.encode(Y[r]).to_bytes()]
        header = torch.tensor([2, parts[0].numel(), parts[1].numel()]).view(torch.uint8)
        assert torch.equal(msg.mine()[r], torch.cat([header, *parts]))
    out = torch.zeros_like(Y)
    block.decode_add(out, b)
    assert torch.equal(out[1], topk.decode(topk.encode(Y[1])))
    remote = msg.received()
    remote.copy_(msg.mine()[0].expand_as(remote))  # well-formed received rows
    block.check_received(msg)
    remote[1, msg.nbytes - b.nbytes] ^= 0xFF  # the second part's header, in remote row 1
    sender, receiver, _ = plan.remote_in[1]
    with pytest.raises(RowsError, match=f"from node {sender} to node {receiver}"):
        block.check_received(msg)


def test_model_rows_and_received_rows_gather_together():
    """A node with one local and one remote in-neighbor: the model's message rows (wider than
    a staging row) and the received rows are gathered as one."""
    from types import SimpleNamespace

    from gossip.compress import make
    from gossip.core.block import Block

    topo = topologies.build("ring", 6)
    ids = [0, 1, 2]
    nodes = [SimpleNamespace(id=i, state={}) for i in ids]
    block = Block(nodes, None, make("none"), lambda: make("none"))
    block.x = block.message_tensor(5, torch.float64, torch.device("cpu"))
    block.x.copy_(torch.arange(15.0).view(3, 5))
    block.begin_round(1, MixPlan.build(topo, ids, lambda j: j in ids, torch.device("cpu")))
    rows = block.encode(block.x)
    assert rows.own.data_ptr() + 8 == block.x.data_ptr()  # sent from the model itself
    rows.received().copy_(make("none").encode(torch.full((5,), 100.0, dtype=torch.float64))
                          .to_bytes().expand(2, -1))
    out = torch.zeros(3, 5, dtype=torch.float64)
    block.mix_into(out, None, rows)
    W = topo.dense()
    for r, i in enumerate(ids):
        expect = sum(W[i, j] * (100.0 if j not in ids else float(5 * j)) for j in (i - 1, i + 1))
        assert float(out[r, 0]) == pytest.approx(expect)


class _ArcEcho(Algorithm):
    """A toy per-arc round: node i sends ``1000 i + j`` (d entries) to each out-neighbor j and
    keeps, for each arc it receives, the decoded message (to check the routing)."""

    name = "arc-echo"
    requires = Requirements(graph=Graph(static=False))

    def step(self, block):
        route = block.arc_plan()
        d = block.x.shape[1]
        X = torch.tensor([[1000.0 * i + j] * d for i, j in route.arcs], dtype=block.x.dtype)
        rows = block.encode(X, route=route)
        yield rows
        got = block.decode_received(X.new_zeros(len(route.incoming), d), rows)
        self.received = dict(zip(route.incoming, got[:, 0].tolist(), strict=True))


@pytest.mark.parametrize("spec", ["none", "topk:0.5"])
def test_arc_phase_routes_one_message_per_arc_and_counts_its_bytes(spec):
    topo = topologies.build("erdos-renyi:p=0.4", 7, seed=2)
    echo = _ArcEcho()
    eng = Engine(echo, topo, lambda i: torch.zeros(4, dtype=torch.float64), compressor=spec)
    eng.step()
    arcs = {(j, i) for i in range(7) for j in topo.view(i).in_neighbors}
    assert set(echo.received) == arcs
    assert all(v == 1000.0 * j + i for (j, i), v in echo.received.items())
    per_msg = eng.block.compressor.encode(torch.ones(4, dtype=torch.float64)).nbytes
    sent = eng.transport.bytes_sent
    assert all(sent[i] == per_msg * len(topo.view(i).out_neighbors) for i in range(7))


def test_arc_plan_of_a_partial_block_splits_own_incoming_and_remote_arcs():
    from gossip.core.routing import ArcPlan

    arcs = [(0, 1), (1, 0), (1, 2), (2, 1), (2, 3), (3, 2), (0, 3), (3, 0)]
    plan = ArcPlan.build(arcs, [1, 2], torch.device("cpu"))
    assert plan.arcs == [(1, 0), (1, 2), (2, 1), (2, 3)]
    assert plan.incoming == [(0, 1), (2, 1), (1, 2), (3, 2)]
    assert plan.remote_in == [(0, 1, 4), (3, 2, 5)]
    assert plan.remote_out == [(0, 0), (3, 3)]
    assert plan.in_src.tolist() == [4, 2, 1, 5] and plan.in_dst.tolist() == [0, 0, 1, 1]
    assert plan.senders == [1, 1, 2, 2] and plan.sender_of == [1, 1, 2, 2, 0, 3]


class _ArcCounter(Algorithm):
    """Per-arc state: each arc's row counts the rounds (to check the per-node mirrors)."""

    name = "arc-counter"

    def setup(self, block):
        block.arc_state["count"] = block.x.new_zeros(len(block.arc_plan().arcs), 2)

    def step(self, block):
        block.arc_state["count"].add_(1.0)
        yield from ()


def test_arc_state_rows_are_each_nodes_out_arcs_in_its_state():
    topo = topologies.build("erdos-renyi:p=0.5", 6, seed=1)
    eng = Engine(_ArcCounter(), topo, lambda i: torch.zeros(3))
    eng.run(2)
    arcs = eng.block.arc_plan().arcs
    for i, nd in eng.nodes.items():
        rows = [a for a, (s, _) in enumerate(arcs) if s == i]
        assert nd.state["count"].shape == (len(topo.view(i).out_neighbors), 2)
        assert nd.state["count"].data_ptr() == eng.block.arc_state["count"][rows[0]].data_ptr()
        assert torch.equal(nd.state["count"], torch.full((len(rows), 2), 2.0))


class _ArcLists(Algorithm):
    """Per-arc state as lists of tensors, one entry per neighbor (``{j}`` keys)."""

    name = "arc-lists"

    def setup(self, block):
        arcs = block.arc_plan().arcs
        rows = torch.tensor([[float(i), float(j)] for i, j in arcs], dtype=block.x.dtype)
        block.arc_state["F{j}"] = [rows.clone(), rows[:, :1].clone().view(-1, 1, 1)]
        block.arc_state["G"] = [rows.clone()]

    def step(self, block):
        yield from ()


def test_arc_state_lists_and_per_neighbor_keys():
    """A list entry gives each node a list of its arcs' rows; a key with {j} one entry per
    neighbor j (checkpoints restore them in place, as lists)."""
    topo = topologies.build("erdos-renyi:p=0.5", 6, seed=1)
    eng = Engine(_ArcLists(), topo, lambda i: torch.zeros(3))
    eng.step()
    for i, nd in eng.nodes.items():
        nbrs = topo.view(i).out_neighbors
        assert {k for k in nd.state if k.startswith("F")} == {f"F{j}" for j in nbrs}
        for j in nbrs:
            a, b = nd.state[f"F{j}"]
            assert a.tolist() == [float(i), float(j)] and b.shape == (1, 1) and float(b) == i
        (g,) = nd.state["G"]
        assert g.tolist() == [[float(i), float(j)] for j in nbrs]
    nd = eng.nodes[0]
    j = topo.view(0).out_neighbors[0]
    saved = {0: {k: [t.clone() for t in v] for k, v in nd.state.items()}}
    saved[0][f"F{j}"][0].fill_(7.0)
    from gossip.engine.engine import _load_node_state

    _load_node_state(nd, saved[0])
    arcs = eng.block.arc_plan().arcs
    assert eng.block.arc_state["F{j}"][0][arcs.index((0, j))].tolist() == [7.0, 7.0]


def test_a_nodes_saved_state_holds_its_own_rows_only():
    """Row views of a block are saved on their own storage: torch.save writes a view's whole
    storage, which would put all 64 nodes' tensors into every node's blob."""
    import io

    eng = Engine(make_algorithm("choco", gamma=0.3), topologies.build("ring", 64),
                 lambda i: torch.randn(1000, dtype=torch.float64), compressor="topk:0.1")
    eng.run(2)
    blob = eng.node_state_dicts()[5]
    buf = io.BytesIO()
    torch.save(blob, buf)
    own = (1 + len(blob["state"])) * 1000 * 8  # x and each state row, float64
    assert own <= buf.tell() < own + 20_000
    assert torch.equal(blob["x"], eng.nodes[5].x)


@pytest.mark.parametrize("alg, spec, hp", [
    ("gossip", "none", {}), ("choco", "fp16", {"gamma": 0.3}), ("choco", "sign", {"gamma": 0.3}),
    ("choco", "qsgd:4", {"gamma": 0.3}), ("dcd", "topk:0.01", {}), ("deepsqueeze", "sign", {}),
])
def test_long_rows_decode_message_by_message_with_the_batched_bits(alg, spec, hp, monkeypatch):
    """Rows of at least LOOP_FROM entries are encoded and mixed one message at a time from views
    of the staging rows (no gather copy): the same bits as the batched block round."""
    import gossip.core.block
    from gossip.compress import dispatch

    monkeypatch.setattr(dispatch, "JIT", False)  # the numpy loop (tests/compress/test_fused.py: the kernel)
    d = dispatch.LOOP_FROM + 5
    topo = _irregular()

    def run() -> list[torch.Tensor]:
        eng = Engine(make_algorithm(alg, **hp), topo,
                     lambda i: torch.randn(d, generator=torch.Generator().manual_seed(i)),
                     compressor=spec, dtype=torch.float64, seed=3)  # a float32 model's
        for _ in range(3):  # channels sum in float64 from messages decoded once (test_precision.py)
            eng.step()
        return [eng.block.x.clone(), *(t.clone() for t in eng.block.state.values())]

    calls = []
    decode = gossip.core.block.Block._decode_add

    def counted(self, comp, out, msgs, *args, **kwargs):
        calls.append(msgs.shape[0])  # messages per decode call
        return decode(self, comp, out, msgs, *args, **kwargs)

    monkeypatch.setattr(gossip.core.block.Block, "_decode_add", counted)
    looped = run()
    assert calls.count(1) >= 2 * topo.graph.number_of_edges()  # each received message alone
    monkeypatch.setattr(dispatch, "LOOP_FROM", 1 << 40)
    batched = run()
    assert all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(looped, batched))


class _ExactAverage(Algorithm):
    """One exact phase through a channel of its own compressor, whatever the run's."""

    name = "exact-average-test"
    requires = Requirements()

    def step(self, block):
        from gossip.compress import make
        from gossip.core.channel import Channel

        ch = Channel(block, "exact", compressor=make("none"))
        inbox = yield ch.send(block.x)
        ch.mix(inbox, into=(None, block.workspace.setdefault("acc", torch.zeros_like(block.x))),
               add=False)
        block.x.copy_(block.workspace["acc"])


def test_a_channel_sends_with_its_own_compressor_when_given_one():
    """``Channel(compressor=...)``: the run compresses with top-k, the channel's phase is exact,
    so one round is ``x ← W x`` to the bit of the dense product's rounding."""
    from gossip.compress import make
    from gossip.core.channel import Channel
    from gossip.errors import ConfigError

    topo = topologies.build("ring", 6)
    X = torch.randn(6, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    eng = Engine(_ExactAverage(), topo, lambda i: X[i], compressor="topk:0.2")
    eng.step()
    W = torch.tensor(np.array(topo.W), dtype=torch.float64)
    assert torch.allclose(eng.block.x, W @ X, rtol=0, atol=1e-15)
    with pytest.raises(ConfigError, match="not both"):
        Channel(eng.block, "exact", compressor=make("none"), own_compressor=True)
