"""The PyTorch adapter: modules equal torch's own on the same weights, gradients reach the store once per
unique row, a DLRM trains as with torch's modules and optimizers, and bad input changes nothing."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ectable  # noqa: E402
from ectable import InvalidRequest  # noqa: E402
from ectable.testing import dlrm as D  # noqa: E402
from ectable.torch import Embedding, EmbeddingBag, EmbeddingBagCollection, Jagged, SparseOptimizer  # noqa: E402

ROWS = {"a": 1000, "b": 500, "c": 200}
DIM = 8
LR = 0.05


@pytest.fixture(autouse=True, scope="module")
def compile_in_the_calling_thread():
    """Inductor compiles in the thread that calls it: with a cold cache (a fresh machine) it would otherwise
    start a pool of compile threads that outlives the module."""
    import torch._inductor.config as inductor
    with inductor.patch(compile_threads=1):
        yield


@pytest.fixture
def cluster():
    with ectable.LocalCluster(nodes=5, code="xor", k=4, processes=False) as c:
        client = c.connect()
        yield client
        client.close()


def _table(client, name="t", rows=100, dim=DIM, optimizer="sgd", lr=0.5):
    client.create_table(name, rows, dim, optimizer=optimizer, lr=lr)
    return torch.from_numpy(client.get(name, np.arange(rows)))


def _reference_bag(weight, **kwargs):
    return torch.nn.EmbeddingBag.from_pretrained(weight.clone(), freeze=False, **kwargs)


BAG_CASES = [
    ("sum", dict(input=[1, 2, 2, 5, 7, 1, 99], offsets=[0, 3, 3])),
    ("mean", dict(input=[1, 2, 2, 5, 7, 1, 99], offsets=[0, 3, 3])),
    ("max", dict(input=[1, 2, 2, 5, 7, 1, 99], offsets=[0, 3, 5])),
    ("sum", dict(input=[1, 2, 2, 5, 7, 1], offsets=[0, 2], per_sample_weights=[0.5, 1, 2, -1, 0.25, 3])),
    ("mean", dict(input=[[1, 2, 3], [3, 3, 0]])),
    ("max", dict(input=[[1, 2, 3], [3, 3, 0]])),
]


@pytest.mark.parametrize("mode,case", BAG_CASES)
def test_embedding_bag_equals_torch_forward_and_gradient(cluster, mode, case):
    weight = _table(cluster)
    mine, ref = EmbeddingBag(cluster, "t", mode=mode), _reference_bag(weight, mode=mode)
    args = {k: torch.tensor(v, dtype=torch.float32 if k == "per_sample_weights" else torch.int64)
            for k, v in case.items()}
    out, expect = mine(**args), ref(**args)
    assert torch.equal(out, expect)
    upstream = torch.randn_like(out)
    (out * upstream).sum().backward()
    (expect * upstream).sum().backward()
    [grad] = mine.sink.take()
    dense = torch.zeros_like(weight)
    dense[torch.from_numpy(grad.ids)] = torch.from_numpy(grad.grads)
    assert torch.equal(dense, ref.weight.grad)


def test_include_last_offset_and_padding_idx_as_torch(cluster):
    weight = _table(cluster)
    for kwargs in ({"include_last_offset": True}, {"padding_idx": 2}, {"padding_idx": -98, "mode": "sum"}):
        mine, ref = EmbeddingBag(cluster, "t", **kwargs), _reference_bag(weight, **kwargs)
        inp, offsets = torch.tensor([1, 2, 2, 5, 7, 1]), torch.tensor([0, 2, 6] if "include_last_offset" in kwargs else [0, 2])
        out, expect = mine(inp, offsets), ref(inp, offsets)
        assert torch.equal(out, expect)
        out.sum().backward()
        expect.sum().backward()
        [grad] = mine.sink.take()
        assert torch.equal(torch.from_numpy(grad.grads), ref.weight.grad[torch.from_numpy(grad.ids)])


def test_embedding_any_shape_and_padding_row_takes_no_gradient(cluster):
    weight = _table(cluster)
    mine, ref = Embedding(cluster, "t", padding_idx=3), torch.nn.Embedding.from_pretrained(weight.clone(), freeze=False,
                                                                                          padding_idx=3)
    for ids in ([[1, 3], [3, 9]], [[[4]]], [7, 7, 7], 5):
        inp = torch.tensor(ids)
        out, expect = mine(inp), ref(inp)
        assert out.shape == inp.shape + (DIM,) and torch.equal(out, expect)
    inp = torch.tensor([[1, 3], [3, 9]])
    mine(inp).pow(2).sum().backward()
    ref.weight.grad = None
    ref(inp).pow(2).sum().backward()
    [grad] = mine.sink.take()
    assert torch.equal(torch.from_numpy(grad.grads), ref.weight.grad[torch.from_numpy(grad.ids)])
    assert not grad.grads[list(grad.ids).index(3)].any()


def test_the_store_steps_every_row_once_like_torch_optimizers(cluster):
    """SGD and Adagrad from the adapter: the same float32 steps as torch's optimizers on dense weights (bit
    for bit as SGD and the fused Adagrad; torch's default Adagrad kernel rounds its division differently)."""
    for optimizer, make, exact in (("sgd", lambda p: torch.optim.SGD(p, lr=0.3), True),
                                   ("adagrad", lambda p: torch.optim.Adagrad(p, lr=0.3, eps=1e-8, fused=True), True),
                                   ("adagrad", lambda p: torch.optim.Adagrad(p, lr=0.3, eps=1e-8), False)):
        name = f"{optimizer}-{exact}"
        weight = _table(cluster, name=name, optimizer=optimizer, lr=0.3)
        mine, ref = EmbeddingBag(cluster, name, mode="sum"), _reference_bag(weight, mode="sum")
        opt, ref_opt = SparseOptimizer(mine), make(ref.parameters())
        gen = torch.Generator().manual_seed(1)
        for _ in range(5):
            inp = torch.randint(0, 100, (40,), generator=gen)
            offsets = torch.arange(0, 40, 4)
            target = torch.randn(10, DIM, generator=gen)
            ((mine(inp, offsets) - target) ** 2).sum().backward()
            ((ref(inp, offsets) - target) ** 2).sum().backward()
            opt.step()
            ref_opt.step()
            ref_opt.zero_grad()
        np.testing.assert_allclose(cluster.get(name, np.arange(100)), ref.weight.detach().numpy(), rtol=0,
                                   atol=0 if exact else 1e-6)


def test_collection_reads_and_writes_every_table_in_one_round_trip(cluster, monkeypatch):
    weights = {t: _table(cluster, name=t, rows=50) for t in ("x", "y")}
    ebc = EmbeddingBagCollection(cluster, {"f1": "x", "f2": "y", "f3": "x"}, mode="sum")
    calls = {"get_many": 0, "apply_gradient_many": 0}
    for name in calls:
        real = getattr(cluster, name)
        monkeypatch.setattr(cluster, name, lambda *a, _real=real, _name=name: calls.__setitem__(_name, calls[_name] + 1)
                            or _real(*a))
    features = Jagged(["f1", "f2", "f3"], torch.tensor([1, 2, 3, 4, 4, 5, 1, 1, 9]),
                      lengths=torch.tensor([2, 1, 0, 3, 2, 1]), weights=torch.arange(9, dtype=torch.float32))
    out = ebc(features)
    ref = {f: _reference_bag(weights[t], mode="sum") for f, t in ebc.tables.items()}
    expect = {"f1": ref["f1"](torch.tensor([1, 2, 3]), torch.tensor([0, 2]), torch.tensor([0., 1, 2])),
              "f2": ref["f2"](torch.tensor([4, 4, 5]), torch.tensor([0, 0]), torch.tensor([3., 4, 5])),
              "f3": ref["f3"](torch.tensor([1, 1, 9]), torch.tensor([0, 2]), torch.tensor([6., 7, 8]))}
    assert set(out) == set(expect) and all(torch.equal(out[f], expect[f]) for f in out)
    sum(o.sum() for o in out.values()).backward()
    SparseOptimizer(ebc).step()
    assert calls == {"get_many": 1, "apply_gradient_many": 1}
    # f1 and f3 share table x: row 1 got both gradients (weights 0 + 6 + 7) in one step
    np.testing.assert_array_equal(cluster.get("x", [1]), (weights["x"][1] - 0.5 * 13).numpy()[None])


def test_accumulation_and_zero_grad_follow_torch(cluster):
    weight = _table(cluster)
    mine, ref = EmbeddingBag(cluster, "t", mode="sum"), _reference_bag(weight, mode="sum")
    opt, ref_opt = SparseOptimizer(mine), torch.optim.SGD(ref.parameters(), lr=0.5)
    inp, offsets = torch.tensor([1, 2, 3, 1]), torch.tensor([0, 2])
    mine(inp, offsets).sum().backward()
    opt.zero_grad()  # dropped, as torch's zero_grad drops .grad
    for scale in (1.0, 3.0):  # two backward passes accumulate
        (mine(inp, offsets) * scale).sum().backward()
        (ref(inp, offsets) * scale).sum().backward()
    opt.step()
    ref_opt.step()
    np.testing.assert_array_equal(cluster.get("t", np.arange(100)), ref.weight.detach().numpy())


def test_apply_in_backward_sends_each_backward_pass_once(cluster, monkeypatch):
    weight = _table(cluster)
    a = EmbeddingBag(cluster, "t", mode="sum", apply_in_backward=True)
    b = Embedding(cluster, "t", apply_in_backward=True)
    sent = []
    real = cluster.apply_gradient_many
    monkeypatch.setattr(cluster, "apply_gradient_many", lambda batch: sent.append(batch) or real(batch))
    inp = torch.tensor([1, 2, 2, 5])
    loss = a(inp, torch.tensor([0, 2])).sum() + b(inp).sum()
    np.testing.assert_array_equal(cluster.get("t", [1]), weight[[1]].numpy())  # nothing sent in forward
    loss.backward()
    assert len(sent) == 1  # both lookups of the table: one step per unique row
    expect = weight.clone()
    counts = torch.bincount(torch.cat([inp, inp]), minlength=100).to(torch.float32)
    expect -= 0.5 * counts[:, None]
    np.testing.assert_array_equal(cluster.get("t", np.arange(100)), expect.numpy())
    with pytest.raises(InvalidRequest, match="apply their own"):
        SparseOptimizer([a, b])


def test_no_grad_and_inference_write_nothing(cluster, monkeypatch):
    _table(cluster)
    mine = EmbeddingBag(cluster, "t", mode="sum")
    monkeypatch.setattr(cluster, "apply_gradient_many", lambda *a: pytest.fail("evaluation wrote"))
    for context in (torch.no_grad, torch.inference_mode):
        with context():
            out = mine(torch.tensor([1, 2]), torch.tensor([0]))
        assert not out.requires_grad
    assert mine.sink.take() == []


def test_autocast_gradients_reach_the_store_in_float32(cluster):
    weights = {f: _table(cluster, name=f, rows=n, optimizer="adagrad", lr=LR) for f, n in ROWS.items()}
    nets = {"mine": D.model(EmbeddingBagCollection(cluster, list(ROWS)), list(ROWS), DIM),
            "ref": D.model(D.LocalBags({f: w.numpy() for f, w in weights.items()}), list(ROWS), DIM)}
    ref_opt = torch.optim.Adagrad(nets["ref"].embeddings.parameters(), lr=LR, eps=1e-8)
    sparse = {"mine": SparseOptimizer(nets["mine"]), "ref": ref_opt}
    dense = {k: torch.optim.SGD([p for n, p in net.named_parameters() if not n.startswith("embeddings")], lr=LR)
             for k, net in nets.items()}
    for x, features, y in D.batches(3, 5, 32, ROWS):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            losses = [D.train_step(nets[k], dense[k], sparse[k], x, features, y) for k in ("mine", "ref")]
        assert losses[0] == losses[1]
    for f, n in ROWS.items():
        np.testing.assert_allclose(cluster.get(f, np.arange(n)), nets["ref"].embeddings.bags[f].weight.detach(),
                                   rtol=0, atol=1e-6)


def _train(client, optimizer, steps=50, compile_dense=False, kill=None):
    """Losses and final tables of a DLRM trained with ectable tables and, beside it, the same DLRM over torch's
    EmbeddingBag with `optimizer`'s torch counterpart; `kill(step)` may fail nodes in between."""
    for f, n in ROWS.items():
        client.create_table(f, n, DIM, optimizer=optimizer, lr=LR, eps=1e-8)
    weights = {f: client.get(f, np.arange(n)) for f, n in ROWS.items()}
    net = D.model(EmbeddingBagCollection(client, list(ROWS)), list(ROWS), DIM)
    ref = D.model(D.LocalBags(weights), list(ROWS), DIM)
    if compile_dense == "dense":
        for m in (net, ref):
            m.bottom, m.top = torch.compile(m.bottom), torch.compile(m.top)
    elif compile_dense == "whole":  # the ectable modules run eagerly inside the compiled model
        net = torch.compile(net)
    ref_sparse = D.torch_optimizer(optimizer, list(ref.embeddings.parameters()), LR)
    opts = [(torch.optim.SGD([p for n, p in m.named_parameters() if not n.startswith("embeddings")], lr=LR), s)
            for m, s in ((net, SparseOptimizer(net)), (ref, ref_sparse))]
    losses, ref_losses = [], []
    for step, (x, features, y) in enumerate(D.batches(1, steps, 64, ROWS)):
        if kill is not None:
            kill(step)
        losses.append(D.train_step(net, *opts[0], x, features, y))
        ref_losses.append(D.train_step(ref, *opts[1], x, features, y))
    tables = {f: client.get(f, np.arange(n)) for f, n in ROWS.items()}
    ref_tables = {f: ref.embeddings.bags[f].weight.detach().numpy() for f in ROWS}
    return losses, ref_losses, tables, ref_tables


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "rowwise_adagrad"])
def test_dlrm_trains_as_with_torch_modules(cluster, optimizer):
    losses, ref_losses, tables, ref_tables = _train(cluster, optimizer)
    # to a millionth, not to six printed digits: a loss a few ulps away can print otherwise (0.5991385579 and
    # 0.5991384983 on a CPU with AVX-512, where the adagrads' float32 rows differ from torch's by an ulp or two)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-6, atol=0)
    for f in ROWS:  # sgd: the same float32 operations as torch's
        np.testing.assert_allclose(tables[f], ref_tables[f], rtol=0, atol=0 if optimizer == "sgd" else 1e-6)
    assert any(not np.array_equal(tables[f], _initial(cluster, f)) for f in ROWS)


def _initial(client, table):
    spec = ectable.TableSpec.from_config(client.tables()[table])
    from ectable.testing.reference import ReferenceTable
    return ReferenceTable(spec).get(np.arange(spec.num_rows))


def test_dlrm_with_compiled_dense_layers(cluster):
    losses, ref_losses, tables, ref_tables = _train(cluster, "rowwise_adagrad", steps=10, compile_dense="dense")
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)
    for f in ROWS:
        np.testing.assert_allclose(tables[f], ref_tables[f], rtol=0, atol=1e-6)


def test_dlrm_compiled_whole(cluster):
    """torch.compile of the whole model: the dense part is compiled (fused differently from eager torch,
    hence the looser bound), the ectable modules stay eager and train their tables."""
    losses, ref_losses, tables, ref_tables = _train(cluster, "rowwise_adagrad", steps=10, compile_dense="whole")
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-4)
    for f in ROWS:
        np.testing.assert_allclose(tables[f], ref_tables[f], rtol=0, atol=1e-4)
        assert not np.array_equal(tables[f], _initial(cluster, f))


def test_a_node_killed_mid_training_changes_nothing():
    with ectable.LocalCluster(nodes=5, code="xor", k=4, spares=1, processes=False) as c:
        client = c.connect()
        plain = _train(client, "adagrad", steps=30)
        client.close()
    with ectable.LocalCluster(nodes=5, code="xor", k=4, spares=1, processes=True) as c:
        client = c.connect()
        killed = []
        def kill(step):
            if step == 12:
                c.kill(2)
                killed.append(step)
        run = _train(client, "adagrad", steps=30, kill=kill)
        client.close()
    assert killed and run[0] == plain[0]  # the loss curve, bit for bit
    for f in ROWS:
        np.testing.assert_array_equal(run[2][f], plain[2][f])


def test_bad_input_is_refused_and_changes_nothing(cluster):
    weight = _table(cluster)
    mine = EmbeddingBag(cluster, "t", mode="mean")
    ebc = EmbeddingBagCollection(cluster, ["t"])
    cases = [
        (lambda: mine(torch.tensor([1.0, 2.0]), torch.tensor([0])), "int64 or int32"),
        (lambda: mine(torch.tensor([1, 2], dtype=torch.int8), torch.tensor([0])), "int64 or int32"),
        (lambda: mine(torch.tensor([1, 100]), torch.tensor([0])), "out of range"),
        (lambda: mine(torch.tensor([-1, 2]), torch.tensor([0])), "out of range"),
        (lambda: mine(torch.tensor([1, 2])), "needs offsets"),
        (lambda: mine(torch.tensor([[1, 2]]), torch.tensor([0])), "takes none"),
        (lambda: mine(torch.tensor([1, 2]), torch.tensor([0.0])), "int64 or int32"),
        (lambda: mine(torch.tensor([1, 2]), torch.tensor([1])), "rise from 0"),
        (lambda: mine(torch.tensor([1, 2]), torch.tensor([0, 2, 1])), "rise from 0"),
        (lambda: mine(torch.tensor([1, 2]), torch.tensor([0, 3])), "at most"),
        (lambda: mine(torch.tensor([1, 2]), [0]), "1-D int64"),
        (lambda: mine(torch.tensor([1, 2]), torch.tensor([0]), torch.ones(2)), "mode='sum'"),
        (lambda: EmbeddingBag(cluster, "t", mode="sum")(torch.tensor([1, 2]), torch.tensor([0]), [1.0, 2.0]),
         "float tensor"),
        (lambda: mine([1, 2], torch.tensor([0])), "1-D or 2-D tensor"),
        (lambda: EmbeddingBag(cluster, "nope"), "unknown table"),
        (lambda: EmbeddingBag(cluster, "t", mode="median"), "mode must be"),
        (lambda: Embedding(cluster, "t", padding_idx=100), "padding_idx"),
        (lambda: EmbeddingBagCollection(cluster, "t"), "list of table names"),
        (lambda: ebc(Jagged(["t"], torch.tensor([1, 2]), offsets=torch.tensor([0, 3]))), "rise from 0"),
        (lambda: ebc(Jagged(["t"], torch.tensor([1, 2]), offsets=torch.tensor([0.0, 2.0]))), "int64 or int32"),
        (lambda: ebc(Jagged(["u"], torch.tensor([1]), lengths=torch.tensor([1]))), "no table here"),
        (lambda: ebc(Jagged(["t", "t"], torch.tensor([1, 2]), lengths=torch.tensor([1, 1]))), "distinct"),
        (lambda: ebc(Jagged(["t"], torch.tensor([[1, 2]]), offsets=torch.tensor([0, 2]))), "1-D tensor"),
        (lambda: ebc({"t": [1, 2]}), "jagged batch"),
        (lambda: SparseOptimizer(torch.nn.Linear(2, 2)), "no ectable module"),
        (lambda: SparseOptimizer([object()]), "takes torch modules"),
    ]
    for call, message in cases:
        with pytest.raises(InvalidRequest, match=message):
            call()
    bag = EmbeddingBag(cluster, "t", mode="sum")
    opt = SparseOptimizer(bag)
    (bag(torch.tensor([1, 2]), torch.tensor([0])) * float("inf")).sum().backward()
    with pytest.raises(InvalidRequest, match="non-finite"):
        opt.step()
    np.testing.assert_array_equal(cluster.get("t", np.arange(100)), weight.numpy())


def test_retained_graph_passes_accumulate_once_each(cluster):
    weight = _table(cluster)
    mine, ref = EmbeddingBag(cluster, "t", mode="sum"), _reference_bag(weight, mode="sum")
    opt, ref_opt = SparseOptimizer(mine), torch.optim.SGD(ref.parameters(), lr=0.5)
    inp, offsets = torch.tensor([1, 2, 3, 1]), torch.tensor([0, 2])
    for module in (mine, ref):
        loss = (module(inp, offsets) ** 2).sum()
        loss.backward(retain_graph=True)
        loss.backward()
    opt.step()
    ref_opt.step()
    np.testing.assert_array_equal(cluster.get("t", np.arange(100)), ref.weight.detach().numpy())


def test_an_empty_batch_reads_nothing(cluster):
    _table(cluster)
    ebc = EmbeddingBagCollection(cluster, ["t"])
    out = ebc(Jagged(["t"], torch.tensor([], dtype=torch.int64), lengths=torch.tensor([], dtype=torch.int64)))
    assert out["t"].shape == (0, DIM)


def test_int32_ids_and_a_batch_with_lengths_only(cluster):
    weight = _table(cluster)

    class Lengths:  # a duck-typed jagged batch with lengths() and no offsets()
        def keys(self):
            return ["t"]

        def values(self):
            return torch.tensor([1, 2, 2], dtype=torch.int32)

        def lengths(self):
            return torch.tensor([2, 1])

    out = EmbeddingBagCollection(cluster, ["t"])(Lengths())["t"]
    expect = _reference_bag(weight, mode="sum")(torch.tensor([1, 2, 2]), torch.tensor([0, 2]))
    assert torch.equal(out, expect)


def test_frozen_modules_record_nothing(cluster):
    _table(cluster)
    bag = EmbeddingBag(cluster, "t", mode="sum").requires_grad_(False)
    assert bag(torch.tensor([1, 2]), torch.tensor([0])).requires_grad is False
    assert bag.sink.take() == []


def test_apply_in_backward_goes_on_after_a_backward_pass_that_raised(cluster):
    weight = _table(cluster)
    bag = EmbeddingBag(cluster, "t", mode="sum", apply_in_backward=True)

    class Boom(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            raise RuntimeError("boom")

    boom = Boom.apply(torch.ones(1, requires_grad=True))  # made first, so its backward runs after the lookup's
    loss = bag(torch.tensor([1]), torch.tensor([0])).sum() * 2 + boom.sum()
    with pytest.raises(RuntimeError, match="boom"):
        loss.backward()
    np.testing.assert_array_equal(cluster.get("t", [1]), weight[[1]].numpy())  # the failed pass sent nothing
    bag(torch.tensor([2]), torch.tensor([0])).sum().backward()
    np.testing.assert_array_equal(cluster.get("t", [2]), (weight[2] - 0.5).numpy()[None])


def test_empty_inputs_give_empty_or_zero_results(cluster):
    _table(cluster)
    emb, bag = Embedding(cluster, "t"), EmbeddingBag(cluster, "t", mode="sum")
    assert emb(torch.zeros((2, 0), dtype=torch.int64)).shape == (2, 0, DIM)
    out = bag(torch.tensor([], dtype=torch.int64), torch.tensor([0, 0]))
    assert out.shape == (2, DIM) and not out.any()
    out.sum().backward()
    SparseOptimizer(bag).step()  # an empty gradient: nothing to apply
