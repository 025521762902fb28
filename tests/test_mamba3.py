"""Mamba-3's SISO drop-in (``compat.mamba3_siso_combined``) against the float64 recurrence
written from its definition (``reference.mamba3_reference``): outputs, final states and every
gradient, with and without states, grouped q/k heads, packed sequences, and its checks."""
import math

import pytest
import torch

from leetrepro import rel_error
from leetrepro.compat import mamba3_rows, mamba3_siso_combined
from leetrepro.reference import mamba3_reference

from conftest import quick_lane

NAMES = ("Q", "K", "V", "ADT", "DT", "Trap", "Q_bias", "K_bias", "Angles", "D", "Z")
TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def _inputs(batch=2, n=23, hqk=2, heads=4, p=8, dv=6, angles=3, states=False, cu=None, seed=1):
    """mamba_ssm's inputs in float64 (random, never zeros; dt a softplus, ADT ≤ 0, strong and
    weak decays), and the four input states per sequence with ``states``."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)
    DT = torch.nn.functional.softplus(r(batch, heads, n) - 1)
    ADT = -DT * torch.rand(heads, generator=g, dtype=torch.float64)[None, :, None] * 2
    args = dict(Q=r(batch, n, hqk, p) / p ** 0.5, K=r(batch, n, hqk, p) / p ** 0.5,
                V=r(batch, n, heads, dv), ADT=ADT, DT=DT, Trap=r(batch, heads, n),
                Q_bias=r(heads, p) / 3, K_bias=r(heads, p) / 3, Angles=r(batch, n, heads, angles),
                D=r(heads), Z=r(batch, n, heads, dv))
    count = batch if cu is None else cu.numel() - 1
    st = (r(count, heads, angles), r(count, heads, dv, p) / 3, r(count, heads, p) / 3,
          r(count, heads, dv)) if states else None
    return args, st


def _angle_error(a, b):
    """The largest difference of two angles, mod 2π."""
    d = torch.remainder(a.double() - b.double() + math.pi, 2 * math.pi) - math.pi
    return d.abs().max().item()


def _check(y, finals, want, want_finals, dtype):
    tol = TOL[dtype]
    assert y.dtype == dtype and torch.isfinite(y).all()
    assert rel_error(y.double(), want) <= tol, rel_error(y.double(), want)
    theta, ssm, k, v = finals
    assert theta.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert _angle_error(theta, want_finals[0]) <= 10 * tol
    assert ((theta >= 0) & (theta < 2 * math.pi)).all()  # (mod 2π, as mamba_ssm's)
    for name, got, w in (("ssm", ssm, want_finals[1]), ("k", k, want_finals[2]),
                         ("v", v, want_finals[3])):
        assert rel_error(got.double(), w) <= tol, (name, rel_error(got.double(), w))


@pytest.mark.parametrize("dtype, states, shape", quick_lane(
    [(torch.float32, True, {}), (torch.float64, False, {}),
     (torch.float32, False, dict(hqk=4, angles=4)), (torch.float64, True, dict(hqk=1, angles=1)),
     (torch.bfloat16, True, {}), (torch.float16, False, dict(n=70))], keep=(0, 1), unpack=True))
def test_the_drop_in_is_the_recurrence(dtype, states, shape):
    """Outputs and the four final states equal the float64 recurrence's within the contract:
    grouped q/k heads (nheads_qk 1, 2 or nheads), the angles over some or all of headdim_qk / 2,
    the states of a previous call carried in."""
    args, st = _inputs(states=states, **shape)
    args = {k: v.to(dtype) for k, v in args.items()}
    st = None if st is None else tuple(t.to(dtype) for t in st)
    y, *finals = mamba3_siso_combined(**args, Input_States=st, return_final_states=True)
    want, want_finals = mamba3_reference(**args, Input_States=st)
    _check(y, finals, want, want_finals, dtype)
    # (without the states asked for, ``auto`` may take another method: the same within the contract)
    assert rel_error(mamba3_siso_combined(**args, Input_States=st).double(), want) <= TOL[dtype]


def test_packed_sequences_are_each_their_own():
    """``cu_seqlens`` (an empty sequence among them): each sequence from its own states, equal
    to the recurrence, and to each sequence run alone."""
    cu = torch.tensor([0, 5, 5, 17, 23])
    args, st = _inputs(batch=1, states=True, cu=cu)
    y, *finals = mamba3_siso_combined(**args, Input_States=st, return_final_states=True,
                                      cu_seqlens=cu)
    want, want_finals = mamba3_reference(**args, Input_States=st, cu_seqlens=cu)
    _check(y, finals, want, want_finals, torch.float64)
    for i, (a, e) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        if a == e:  # (no rows: the states pass through)
            for got, given in zip(finals[1:], st[1:]):
                assert torch.allclose(got[i].double(), given[i].double())
            continue
        alone = mamba3_siso_combined(**mamba3_rows(args, slice(a, e)),
                                     Input_States=tuple(t[i:i + 1] for t in st))
        assert rel_error(alone, y[:, a:e]) <= 1e-12


def test_two_calls_with_the_states_passed_equal_one():
    """A prompt in two pieces, the states returned by the first given to the second (the angle,
    the SSM state and the last key and value): the same outputs as the whole."""
    args, _ = _inputs(n=31)
    whole = mamba3_siso_combined(**args)
    cut = 13
    y1, *states = mamba3_siso_combined(**mamba3_rows(args, slice(None, cut)),
                                       return_final_states=True)
    y2 = mamba3_siso_combined(**mamba3_rows(args, slice(cut, None)), Input_States=tuple(states))
    assert rel_error(torch.cat([y1, y2], 1), whole) <= 1e-12


@pytest.mark.parametrize("dtype, states, packed", quick_lane(
    [(torch.float64, True, False), (torch.float32, False, False), (torch.float64, True, True)],
    keep=(0,), unpack=True))
def test_every_gradient_is_the_recurrence_s(dtype, states, packed):
    """The gradient of every input (the four input states included) against float64 autograd
    through the recurrence, each within the contract (fp32: the gates' gradient's, 5e-5)."""
    cu = torch.tensor([0, 9, 23]) if packed else None
    args, st = _inputs(batch=1 if packed else 2, states=states, cu=cu)
    gen = torch.Generator().manual_seed(5)
    dy = torch.randn(args["V"].shape, generator=gen, dtype=torch.float64)
    dfin = None

    def run(fn, cast):
        leaves = {k: v.to(cast).requires_grad_() for k, v in args.items()}
        sts = None if st is None else tuple(t.to(cast).requires_grad_() for t in st)
        y, *fin = fn(**leaves, Input_States=sts, **({"cu_seqlens": cu} if cu is not None else {}),
                     **({"return_final_states": True} if fn is mamba3_siso_combined else {}))
        if fn is mamba3_reference:
            fin = fin[0]
        # (the SSM, k and v states' gradients too; the angle's is its own rows')
        loss = (y.double() * dy).sum() + sum((f.double() * w).sum() for f, w in zip(fin[1:], dfin))
        ins = list(leaves.values()) + (list(sts) if sts is not None else [])
        return torch.autograd.grad(loss, ins)
    count = 1 if packed else 2
    dfin = [torch.randn(count, *s, generator=gen, dtype=torch.float64)
            for s in ((4, 6, 8), (4, 8), (4, 6))]
    got = run(mamba3_siso_combined, dtype)
    want = run(mamba3_reference, torch.float64)
    names = list(NAMES) + (["angle state", "ssm state", "k state", "v state"] if states else [])
    tol = 1e-9 if dtype == torch.float64 else 5e-5
    for name, a, w in zip(names, got, want):
        assert torch.isfinite(a).all() and a.abs().sum() > 0, name
        assert rel_error(a.double(), w) <= tol, (name, rel_error(a.double(), w))


@pytest.mark.parametrize("dtype, packed", quick_lane(
    [(torch.bfloat16, True), (torch.float16, False)], keep=(0,), unpack=True))
def test_16bit_gradients_of_the_angles_and_steps_keep_the_contract(dtype, packed):
    """In 16 bits every gradient stays within 1e-2 of float64 autograd through the recurrence on
    the same rounded inputs, the Angles' and DT's included: their running sums add up whatever
    of each pair's two parts of dθ does not cancel (at 97 rows, before the rotated rows were
    held in float32 with their Jacobian at the rounded values, 1.5e-2 and 1.2e-2)."""
    cu = torch.tensor([0, 120, 121, 300]) if packed else None
    args, st = _inputs(batch=1 if packed else 2, n=300, hqk=2, heads=4, p=32, dv=16, angles=8,
                       states=True, cu=cu)
    dy = torch.randn(args["V"].shape, generator=torch.Generator().manual_seed(3),
                     dtype=torch.float64)
    extra = {} if cu is None else {"cu_seqlens": cu}

    def run(fn, cast):
        leaves = {k: v.to(dtype).to(cast).requires_grad_() for k, v in args.items()}
        y = fn(**leaves, Input_States=tuple(t.to(dtype).to(cast) for t in st), **extra)
        y = y[0] if isinstance(y, tuple) else y
        return torch.autograd.grad((y.double() * dy).sum(), list(leaves.values()))
    for name, a, w in zip(NAMES, run(mamba3_siso_combined, dtype),
                          run(mamba3_reference, torch.float64)):
        assert torch.isfinite(a).all() and rel_error(a.double(), w) <= 1e-2, \
            (name, rel_error(a.double(), w))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the kernels interpreted on CPU tensors "
                    "(a GPU host runs them in test_the_drop_in_on_the_gpu)")
@pytest.mark.slow  # (the interpreter: seconds a case)
@pytest.mark.parametrize("dtype, packed", [(torch.float32, False), (torch.float32, True),
                                           (torch.float16, True)])
def test_the_angles_and_gates_gradients_from_the_straddling_pairs(monkeypatch, dtype, packed):
    """Where the straddle kernel runs (here interpreted), the drop-in's backward is one node
    (``compat._TurnedOperator``): the operator in the inputs' dtype, ADT's and the Angles'
    gradients from the pairs straddling each row. Every gradient (the input states' too, with
    the final states' gradients given) against float64 autograd through the recurrence, fp32
    1e-5 and fp16 1e-2; packed with an empty first sequence; and the node taken."""
    from leetrepro import compat
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("LEETREPRO_ROWS_KERNEL", "1")
    taken = []
    forward = compat._TurnedOperator.forward  # (entered by its C entry: its forward counted)
    monkeypatch.setattr(compat._TurnedOperator, "forward",
                        staticmethod(lambda *a: taken.append(1) or forward(*a)))
    cu = torch.tensor([0, 0, 9, 9, 23]) if packed else None
    args, st = _inputs(batch=1 if packed else 2, states=True, cu=cu)
    gen = torch.Generator().manual_seed(5)
    dy = torch.randn(args["V"].shape, generator=gen, dtype=torch.float64)
    count = 4 if packed else 2
    dfin = [torch.randn(count, *shape, generator=gen, dtype=torch.float64)
            for shape in ((4, 6, 8), (4, 8), (4, 6))]
    extra = {} if cu is None else {"cu_seqlens": cu}

    def run(fn, cast, **options):
        leaves = {k: v.to(dtype).to(cast).requires_grad_() for k, v in args.items()}
        sts = tuple(t.to(dtype).to(cast).requires_grad_() for t in st)
        y, *fin = fn(**leaves, Input_States=sts, **extra, **options)
        fin = fin[0] if fn is mamba3_reference else fin
        loss = (y.double() * dy).sum() + sum((f.double() * w).sum()
                                              for f, w in zip(fin[1:], dfin))
        return torch.autograd.grad(loss, list(leaves.values()) + list(sts))
    got = run(mamba3_siso_combined, dtype, return_final_states=True, method="Chunk")
    assert taken
    want = run(mamba3_reference, torch.float64)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    names = list(NAMES) + ["angle state", "ssm state", "k state", "v state"]
    for name, a, w in zip(names, got, want):
        assert torch.isfinite(a).all() and rel_error(a.double(), w) <= tol, \
            (name, rel_error(a.double(), w))


def test_bad_inputs_are_refused_by_name():
    args, st = _inputs(states=True)
    bad = [
        (dict(K=args["K"][..., :6]), "Q and K must be"),
        (dict(V=args["V"][:, :, :3]), "nheads_qk dividing"),
        (dict(ADT=args["ADT"].abs() + 1), "ADT must be ≤ 0"),
        (dict(DT=args["DT"][..., :5]), "DT must be"),
        (dict(Trap=args["Trap"].transpose(1, 2)), "Trap must be"),
        (dict(Q_bias=args["Q_bias"][:2]), "Q_bias must be"),
        (dict(Angles=torch.zeros(2, 23, 4, 5, dtype=torch.float64)), "headdim_angles"),
        (dict(D=args["D"][:2]), "D must be"),
        (dict(Z=args["Z"][..., :2]), "Z must be"),
        (dict(chunk_size=0), "chunk_size"),
        (dict(Q=args["Q"].float()), "Q and K must share one dtype"),
    ]
    for change, match in bad:
        with pytest.raises((ValueError, TypeError), match=match):
            mamba3_siso_combined(**{**args, **change})
    with pytest.raises(ValueError, match="ssm state must be"):
        mamba3_siso_combined(**args, Input_States=(st[0], st[1][..., :3], st[2], st[3]))
    with pytest.raises(TypeError, match="all given"):
        mamba3_siso_combined(**args, Input_States=(st[0], None, st[2], st[3]))
    with pytest.raises(ValueError, match="batch of one"):
        mamba3_siso_combined(**args, cu_seqlens=torch.tensor([0, 23]))
    with pytest.raises(TypeError, match="cu_seqlens must be"):
        mamba3_siso_combined(**args, cu_seqlens=torch.tensor([0.0, 23.0]))


@pytest.mark.slow
@pytest.mark.parametrize("pairs", [False, True])
def test_the_drop_in_compiles_whole(monkeypatch, pairs):
    """``torch.compile(fullgraph=True)``: the same outputs, states and gradients, no graph
    break; ``pairs``: the backward from the straddling pairs (the kernels interpreted), through
    AOT autograd."""
    if pairs:
        if torch.cuda.is_available():
            pytest.skip("the kernels interpreted on CPU tensors")
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        monkeypatch.setenv("LEETREPRO_ROWS_KERNEL", "1")
    args, st = _inputs(batch=1, n=20, states=True)
    args = {k: v.float().requires_grad_() for k, v in args.items()}
    st = tuple(t.float() for t in st)
    torch._dynamo.reset()
    options = dict(Input_States=st, return_final_states=True, method="Chunk" if pairs else "auto")
    fn = torch.compile(lambda a: mamba3_siso_combined(**a, **options), fullgraph=True,
                       backend="aot_eager" if pairs else "eager")
    got = fn(args)
    want = mamba3_siso_combined(**args, **options)
    for a, w in zip(got, want):
        assert rel_error(a, w) <= 1e-6
    for a, w in zip(torch.autograd.grad(got[0].sum(), list(args.values())),
                    torch.autograd.grad(want[0].sum(), list(args.values()))):
        assert rel_error(a, w) <= 1e-6


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_drop_in_on_the_gpu(dtype):
    """On a GPU (the operator's kernels with gates, states and packed rows): outputs, states and
    every gradient against the float64 recurrence within the contract, bf16 1e-2 and fp32 1e-5
    (the drop-in asks the operator for exact products, tf32x3, unless told otherwise)."""
    cu = torch.tensor([0, 40, 41, 97])
    args, st = _inputs(batch=1, n=97, hqk=2, heads=8, p=64, dv=32, angles=16, states=True, cu=cu)
    gen = torch.Generator().manual_seed(7)
    dy = torch.randn(args["V"].shape, generator=gen, dtype=torch.float64)
    leaves = {k: v.to("cuda", dtype).requires_grad_() for k, v in args.items()}
    sts = tuple(t.to("cuda", dtype) for t in st)
    y, *fin = mamba3_siso_combined(**leaves, Input_States=sts, return_final_states=True,
                                   cu_seqlens=cu.cuda())
    grads = torch.autograd.grad((y.double() * dy.cuda()).sum(), list(leaves.values()))
    wide = {k: v.to(dtype).double().requires_grad_() for k, v in args.items()}
    want, want_fin = mamba3_reference(**wide, Input_States=tuple(t.to(dtype).double() for t in st),
                                      cu_seqlens=cu)
    want_grads = torch.autograd.grad((want * dy).sum(), list(wide.values()))
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
    assert rel_error(y.double().cpu(), want) <= tol
    assert rel_error(fin[1].double().cpu(), want_fin[1]) <= tol
    with torch.no_grad():  # (no gradient wanted: the operator in the inputs' dtype)
        y_inf, *fin_inf = mamba3_siso_combined(**leaves, Input_States=sts,
                                               return_final_states=True, cu_seqlens=cu.cuda())
    assert rel_error(y_inf.double().cpu(), want) <= tol
    assert _angle_error(fin_inf[0].cpu(), want_fin[0]) <= 10 * tol
    for got, w in zip(fin_inf[1:], want_fin[1:]):
        assert rel_error(got.double().cpu(), w) <= tol
    for name, a, w in zip(NAMES, grads, want_grads):
        assert torch.isfinite(a).all() and rel_error(a.double().cpu(), w) <= tol, name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_angles_gradient_keeps_the_contract_over_long_sequences():
    """bf16 at 65 536 rows (the bench's inputs, two heads): every gradient within 1e-2 of the
    float64 drop-in. The Angles' gradient is a running sum of terms that cancel, so the
    operator's rounding adds up along the rows: through tf32 products it read 1.3e-2 here."""
    from leetrepro.bench.ssd import mamba3_inputs
    torch.manual_seed(1)
    leaves, dy = mamba3_inputs(1, 65536, 2, 64, 128, 1, "cuda", True)
    wide = {k: v.detach().double().requires_grad_() for k, v in leaves.items()}
    for y, want in zip(_outputs_and_grads(leaves, dy), _outputs_and_grads(wide, dy.double())):
        assert torch.isfinite(y).all() and rel_error(y.double(), want) <= 1e-2


def _outputs_and_grads(leaves, dy, **options):
    y = mamba3_siso_combined(**leaves, **options)
    return [y, *torch.autograd.grad(y, list(leaves.values()), dy)]


def test_the_operator_takes_exact_products_unless_told(monkeypatch):
    """The drop-in asks the operator for ``MAMBA3_FP32_PRECISION`` (the test above: tf32's
    rounding adds up in the Angles' gradient) and, for 16-bit inputs, for the gates' gradient at
    ``MAMBA3_GATE_GRAD_PRECISION``; a caller's own choices pass through."""
    from leetrepro import compat
    seen = []
    real = compat.causal_linear_decoder
    monkeypatch.setattr(compat, "causal_linear_decoder", lambda *a, **kw: seen.append(
        (kw["fp32_precision"], kw.get("gate_grad_precision"))) or real(*a, **kw))
    args, _ = _inputs()
    mamba3_siso_combined(**args)
    mamba3_siso_combined(**args, fp32_precision="tf32")
    mamba3_siso_combined(**{k: v.to(torch.bfloat16) for k, v in args.items()})
    mamba3_siso_combined(**{k: v.to(torch.bfloat16) for k, v in args.items()},
                         gate_grad_precision="tf32x3")
    exact, gates = compat.MAMBA3_FP32_PRECISION, compat.MAMBA3_GATE_GRAD_PRECISION
    assert seen == [(exact, None), ("tf32", None), (exact, gates), (exact, "tf32x3")]
    assert exact != "tf32"


def _block(**kw):
    from leetrepro.models import Mamba3Block
    torch.manual_seed(0)
    blk = Mamba3Block(32, d_state=16, headdim=8, ngroups=2, **kw).double()
    with torch.no_grad():  # (weights off their initial ones: biases, norms and D not all ones)
        for p in (blk.B_bias, blk.C_bias, blk.D, blk.B_norm.weight, blk.C_norm.weight):
            p.add_(torch.randn_like(p) / 4)
    return blk


def test_a_mamba3_block_trains_and_decodes_what_it_prefills():
    """The block (float64): forward equals prefill's output; prefill of a prompt then one decode
    step a token over a state pool (at slots in another order) equals the forward of the whole;
    packed sequences equal each run alone; every parameter takes a gradient."""
    blk = _block()
    u = torch.randn(2, 19, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    whole = blk(u)
    out, states = blk.prefill(u[:, :12])
    assert rel_error(out, whole[:, :12]) <= 1e-12
    pools = blk.state_pools(5)
    pools = tuple(p.double() for p in pools)
    slots = torch.tensor([4, 1])
    for pool, s in zip(pools, states):
        pool[slots] = s.to(pool.dtype)
    steps = [blk.step(u[:, t], pools, slots) for t in range(12, 19)]
    assert rel_error(torch.stack(steps, 1), whole[:, 12:]) <= 1e-10
    assert torch.equal(pools[0][0], torch.zeros_like(pools[0][0]))  # (other slots untouched)
    cu = torch.tensor([0, 7, 19])
    packed = blk(torch.cat([u[:1, :7], u[1:, :12]], 1), cu_seqlens=cu)
    assert rel_error(packed[:, :7], blk(u[:1, :7])) <= 1e-12
    assert rel_error(packed[:, 7:], blk(u[1:, :12])) <= 1e-12
    whole.square().mean().backward()
    for name, p in blk.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def test_the_mamba3_block_names_its_own_bad_arguments():
    from leetrepro.models import Mamba3Block
    with pytest.raises(ValueError, match="multiple of headdim"):
        Mamba3Block(30, headdim=8)
    with pytest.raises(ValueError, match="ngroups 3 must divide"):
        Mamba3Block(32, headdim=8, ngroups=3)
    with pytest.raises(ValueError, match="rope_fraction"):
        Mamba3Block(32, headdim=8, rope_fraction=0.25)
    blk = _block()
    with pytest.raises(ValueError, match="one token per sequence"):
        blk.step(torch.randn(2, 1, 32, dtype=torch.float64), blk.state_pools(2), torch.arange(2))
    with pytest.raises(ValueError, match="four pools"):
        blk.step(torch.randn(2, 32, dtype=torch.float64), blk.state_pools(2)[:2], torch.arange(2))


def test_bench_ssd_times_the_drop_in_as_its_block_hands_it(monkeypatch):
    """``bench.ssd``'s Mamba-3 entries on the CPU at a tiny shape: the inputs as the block hands
    them, our entry's forward and backward (every gradient), and mamba_ssm's entry where its
    source is given (here a stand-in of the same signature: the drop-in itself)."""
    from leetrepro.bench import ssd
    leaves, dy = ssd.mamba3_inputs(1, 33, 4, 8, 16, 2, "cpu", grad=True, dtype=torch.float32)
    entries = ssd.mamba3_entries(mamba3_siso_combined, grad=True)
    assert set(entries) == {"ours", "mamba_ssm"}
    y = entries["ours"](leaves, dy)
    assert y.shape == (1, 33, 4, 8) and torch.isfinite(y).all()
    assert ssd.mamba3_floor_bytes(1, 33, 4, 8, 16, 2, True) == \
        3 * ssd.mamba3_floor_bytes(1, 33, 4, 8, 16, 2, False)


def test_bench_ssd_hands_over_each_pass_s_rows_as_it_measures_them(monkeypatch):
    """``bench.ssd``'s measurements come a pass at a time, so that a run cut short (mamba_ssm's
    autotuning can outrun a time limit) has written the passes it measured: the forward's rows
    are there before the backward is timed. (The timing itself stubbed: no GPU here.)"""
    from leetrepro.bench import ssd
    timed = []

    def fake(entries, args, reps, device, seed=0):
        timed.append(set(entries))
        return {"eager": {name: 1e-3 for name in entries}}, {}
    monkeypatch.setattr(ssd, "timed_entries", fake)
    parts = ssd.measure_mamba3(("tiny", 1, 33, 4, 8, 16, 2), "cpu", 1e12, 1, {}, None)
    first = next(parts)
    assert len(timed) == 1 and {row["pass"] for row in first} == {"fwd"}
    assert {row["pass"] for row in next(parts)} == {"fwd+bwd"} and len(timed) == 2


def test_bench_ssd_times_the_decode_step_against_its_floor(monkeypatch):
    """``bench.ssd``'s Mamba-3 decode rows on the CPU at a small batch (the timing stubbed after
    one real step, whose output is finite): one row a mode, the floor the states read and
    written plus the token's inputs and output."""
    from leetrepro.bench import ssd
    seen = []

    def fake(entries, args, reps, device, seed=0):
        seen.append(entries["ours"]())
        return {"eager": {"ours": 2e-3}}, {}
    monkeypatch.setattr(ssd, "timed_entries", fake)
    rows = ssd.measure_mamba3_decode(("tiny", 3, 4, 8, 16, 2), "cpu", 1e9, 1, {})
    assert seen[0].shape == (3, 4, 8) and torch.isfinite(seen[0].float()).all()
    (row,) = rows
    state = 4 * (4 * 4 + 8 * 16 * 4 + (16 + 8) * 2)
    token = 2 * 16 * 2 * 2 + 4 * (8 * 2 * 3 + 3 * 4 + 4 * 4)
    assert row["pass"] == "step" and \
        row["floor_ms"] == pytest.approx(3 * (2 * state + token) / 1e9 * 1e3)
    assert row["vs_floor"] == pytest.approx(2.0 / row["floor_ms"])


def test_bench_model_builds_the_mamba3_mixers():
    """``bench.model``'s Mamba-3 mixers: ours builds; mamba_ssm's is None without its source."""
    from leetrepro.bench import model
    cfg = dict(model.SIZES["125M"], dim=64, heads=2, mamba=dict(headdim=16, d_state=16, ngroups=1))
    make = model.mixer("Mamba-3 leetrepro", cfg, torch.device("cpu"))
    blk = make()
    assert blk(torch.randn(1, 9, 64)).shape == (1, 9, 64)


def _row_cases(batch, n, hqk, heads, p, a, dv, dtype, device):
    """``[(label, outputs' names, inputs' names, run)]`` for ``methods.mamba3_rows``' two
    passes, ``run()`` giving ``(outputs, every input's gradient)`` for fixed random output
    gradients: the turned rows (Q and K in ``dtype`` read by ``heads / hqk`` heads each,
    biases, θ as ``running_angles`` returns it and contiguous, w transposed), and the gated
    output with and without z (o float32 as the operator's output is viewed, v and z in
    ``dtype``)."""
    from leetrepro.methods import mamba3_rows as rows
    gen = torch.Generator().manual_seed(4)

    def r(*shape):
        return torch.randn(*shape, generator=gen).to(device)
    Q, K = (r(batch, n, hqk, p).to(dtype) for _ in range(2))
    theta = (r(batch, heads, a, n) * 3).permute(0, 3, 1, 2)
    w = torch.rand(batch, heads, n, generator=gen).to(device).transpose(1, 2)
    turned = (Q, K, r(heads, p), r(heads, p), theta, w)
    o = r(batch, heads, n, dv).transpose(1, 2)
    gated = (o, r(batch, n, heads, dv).to(dtype), r(batch, n, heads, dv).to(dtype),
             r(batch, heads, n).transpose(1, 2))

    def runner(fn, inputs, grads):
        def run():
            leaves = [None if t is None else t.clone().requires_grad_() for t in inputs]
            out = fn(*leaves)
            out = out if isinstance(out, tuple) else (out,)
            return out, torch.autograd.grad(out, [t for t in leaves if t is not None], grads)
        return run
    dy = r(batch, n, heads, dv).to(dtype)
    # (Angles shared by the heads, as the block expands them; DT a transposed view; packed:
    # four sequences, one of them without rows)
    cu = torch.tensor([0, n // 3, n // 3, n - 5, n], device=device)
    angles = (r(batch, n, 1, a) * 2, torch.rand(batch, n, heads, generator=gen).to(device)
              .transpose(1, 2), r(batch, heads, a))
    names = ("q", "key", "own"), ("Q", "K", "Q_bias", "K_bias", "theta", "w")
    grads = [r(batch, n, heads, p), r(batch, n, heads, p), r(batch, n, heads)]
    return [("turned rows", *names, runner(rows.turned_rows, turned, grads)),
            ("θ contiguous", *names,
             runner(rows.turned_rows, turned[:4] + (theta.contiguous(), w), grads)),
            ("angles", ("theta",), ("Angles", "DT", "theta0"),
             runner(lambda g, dt, th0: rows.angle_sums(g.expand(-1, -1, heads, -1), dt, th0),
                    angles, r(batch, n, heads, a))),
            ("packed angles", ("theta",), ("Angles", "DT", "theta0"),
             runner(lambda g, dt, th0: rows.angle_sums(g.expand(-1, -1, heads, -1), dt, th0, cu),
                    (angles[0][:1], angles[1][:1], r(4, heads, a)), r(1, n, heads, a))),
            ("gated output", ("y",), ("o", "v", "z", "w"), runner(rows.gated_output, gated, dy)),
            ("output without z", ("y",), ("o", "v", "w"),
             runner(rows.gated_output, (gated[0], gated[1], None, gated[3]), dy))]


def _kernels_against_pytorch(cases, set_kernels, out_tol, grad_tol, dtype):
    """Each case run with the kernels (``set_kernels(True)``) and with PyTorch's expressions:
    outputs and every gradient within the tolerances, finite, in the same dtypes; 16-bit outputs
    of 16-bit values equal in all but a few elements (a rounding may tip)."""
    for label, outs, ins, run in cases:
        set_kernels(True)
        got, got_grads = run()
        set_kernels(False)
        want, want_grads = run()
        for name, x, y in zip(outs, got, want):
            assert x.dtype == y.dtype and rel_error(x.double(), y.double()) <= out_tol, (label, name)
            if dtype != torch.float32 and name in ("q", "key", "y"):  # (16-bit values)
                assert (x != y).float().mean() < 0.01, (label, name)
        for name, x, y in zip(ins, got_grads, want_grads):
            assert x.dtype == y.dtype and torch.isfinite(x).all() and \
                rel_error(x.double(), y.double()) <= grad_tol, (label, name)


def _interpreted_kernels(monkeypatch, dtype):
    """Under Triton's interpreter, ``set_kernels(kernel)`` for :func:`_kernels_against_pytorch`:
    ``methods.mamba3_rows``' passes on their kernels (interpreted) or on PyTorch's expressions,
    checked to have switched."""
    from leetrepro.methods import mamba3_rows as rows
    monkeypatch.setenv("TRITON_INTERPRET", "1")

    def set_kernels(kernel):
        if kernel:
            monkeypatch.setenv("LEETREPRO_ROWS_KERNEL", "1")
        else:
            monkeypatch.delenv("LEETREPRO_ROWS_KERNEL", raising=False)
        assert rows._on_output_kernel(torch.empty(1, dtype=dtype)) == kernel
    return set_kernels


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_row_kernels_on_the_gpu(monkeypatch, dtype):
    """On a GPU (where bf16 rounds to nearest, as the interpreter does not) the turned rows' and
    the gated output's kernels against their PyTorch expressions at mamba_ssm's test heads
    (headdim_qk 128, 32 angles, q/k heads read by four heads each, headdim 64), rows not a
    multiple of any row block, θ and w as views: outputs and every gradient within 1e-5 in fp32
    (the kernels' cosines and sums against torch's), 1e-3 and 4e-3 in bf16 (a rounding's tip
    moves one element by 2^-8, and the angles' gradient, taken at the rounded values, with it)."""
    from leetrepro.methods import mamba3_rows as rows
    names = ("_on_kernel", "_on_output_kernel", "_on_angle_kernel")
    on = [getattr(rows, name) for name in names]

    def set_kernels(kernel):
        for name, fn in zip(names, on):
            monkeypatch.setattr(rows, name, fn if kernel else lambda *a: False)
    assert on[0](torch.empty(1, device="cuda", dtype=dtype), torch.empty(1, device="cuda"))
    cases = _row_cases(2, 333, 2, 8, 128, 32, 64, dtype, "cuda")
    tol = (1e-5, 1e-5) if dtype == torch.float32 else (4e-3, 1e-3)
    _kernels_against_pytorch(cases, set_kernels, *tol, dtype)


@pytest.mark.slow  # (opcheck's dozen calls: the quick lane keeps the drop-in's tests)
def test_the_row_ops_pass_opcheck():
    """The custom ops of ``methods.mamba3_rows`` (their PyTorch expressions here) against their
    fakes and schemas: θ and w as views, q/k heads read by two heads each, the rows in 16 bits
    wanted or not, the angles with and without a starting angle, packed or not (Angles shared
    by the heads), the gated output with and without z."""
    from leetrepro.methods import mamba3_rows as rows
    gen = torch.Generator().manual_seed(2)
    Q, K = (torch.randn(1, 7, 2, 8, generator=gen).half() for _ in range(2))
    qb, kb = torch.randn(4, 8, generator=gen), torch.randn(4, 8, generator=gen)
    theta = torch.randn(1, 4, 3, 7, generator=gen).permute(0, 3, 1, 2)
    w = torch.rand(1, 4, 7, generator=gen).transpose(1, 2)
    torch.library.opcheck(rows.mamba3_rotate, (Q, K, qb, kb, theta, w, True))
    torch.library.opcheck(rows.mamba3_rotate, (Q, K, qb, kb, theta, w))
    q, key, _ = rows.mamba3_rotate(Q, K, qb, kb, theta, w)
    dq, dkey = (torch.randn(1, 7, 4, 8, generator=gen) for _ in range(2))
    down = torch.randn(1, 7, 4, generator=gen)
    torch.library.opcheck(rows.mamba3_rotate_backward, (dq, dkey, down, q, key, K, kb, theta, w))
    torch.library.opcheck(rows.mamba3_rotate_backward,
                          (dq, dkey, down, q.half(), key.half(), K, kb, theta, w, False))
    o = torch.randn(1, 4, 7, 5, generator=gen).transpose(1, 2)
    v, z, dy = (torch.randn(1, 7, 4, 5, generator=gen).half() for _ in range(3))
    angles = torch.randn(1, 7, 1, 3, generator=gen).expand(-1, -1, 4, -1)
    dt = torch.rand(1, 4, 7, generator=gen)
    cu = torch.tensor([0, 3, 3, 7])
    for th0, packed in ((torch.randn(1, 4, 3, generator=gen), None), (None, None),
                        (torch.randn(3, 4, 3, generator=gen), cu)):
        torch.library.opcheck(rows.mamba3_angles, (angles, dt, th0, packed))
    torch.library.opcheck(rows.mamba3_angles_backward, (theta, angles, dt, None, 1))
    torch.library.opcheck(rows.mamba3_angles_backward, (theta, angles, dt, cu, 3))
    for zz in (z, None):
        torch.library.opcheck(rows.mamba3_gated_output, (o, v, zz, w))
        torch.library.opcheck(rows.mamba3_gated_output_backward, (dy, o, v, zz, w))
    # the pairs' sums (the straddle kernel, interpreted on the CPU), with states and without
    qt, kt = (torch.randn(1, 4, 70, 16, generator=gen) for _ in range(2))
    vt, dot = (torch.randn(1, 4, 70, 8, generator=gen) for _ in range(2))
    g = -torch.rand(1, 4, 70, generator=gen)
    s0, ds, sn = (torch.randn(1, 4, 16, 8, generator=gen) for _ in range(3))
    for states in ((s0, ds, sn), (None, None, None)):
        torch.library.opcheck(rows.mamba3_pair_sums, (qt, kt, vt, dot, g, *states, None, 3,
                                                      "ieee"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the kernel interpreted on CPU tensors: on a "
                    "GPU host Triton's driver is up already, and CPU tensors are refused")
@pytest.mark.slow  # (the interpreter; the quick lane keeps the PyTorch passes)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_row_kernels_are_their_pytorch_expressions(monkeypatch, dtype):
    """``methods.mamba3_rows`` (the turned rows and the gated output, one pass each way;
    interpreted here) against its PyTorch expressions: q/k heads read by two heads each, angles
    over part of the pairs (a tail unturned), rows not a multiple of any row block, θ, w and o
    read through transposed views, every gradient. (fp16: Triton's interpreter rounds to bf16
    by truncation, where a GPU rounds to nearest.)"""
    tol = (1e-6, 1e-5) if dtype == torch.float32 else (4e-3, 1e-3)
    _kernels_against_pytorch(_row_cases(2, 45, 2, 4, 12, 4, 5, dtype, "cpu"),
                             _interpreted_kernels(monkeypatch, dtype), *tol, dtype)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the kernel interpreted on CPU tensors: on a "
                    "GPU host Triton's driver is up already, and CPU tensors are refused")
@pytest.mark.slow  # (the interpreter)
def test_the_angles_split_among_programs_are_the_same_sums(monkeypatch):
    """Where fewer (batch rows × heads) than SMs walk the rows, the angles' kernels split the
    angles among more programs (ddt's parts summed after): packed and not, every gradient as
    PyTorch's expressions give them (interpreted; the SMs made many so that four angles split
    in two)."""
    from leetrepro.methods import mamba3_rows as rows
    monkeypatch.setattr(rows, "sm_count", lambda device: 10 ** 6)
    monkeypatch.setattr(rows, "ANGLE_MIN_BLOCK", 2)
    assert rows._angle_block(8, 4, "cpu") == 2
    cases = [c for c in _row_cases(2, 45, 2, 4, 12, 4, 5, torch.float32, "cpu")
             if "angles" in c[0]]
    assert len(cases) == 2
    _kernels_against_pytorch(cases, _interpreted_kernels(monkeypatch, torch.float32), 1e-6, 1e-5,
                             torch.float32)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the kernel interpreted on CPU tensors: on a "
                    "GPU host Triton's driver is up already, and CPU tensors are refused")
@pytest.mark.slow  # (the interpreter: seconds a case; the quick lane keeps the PyTorch step)
@pytest.mark.parametrize("dtype, rows", [(torch.float32, None), (torch.float16, None),
                                         (torch.float32, 2)])
def test_the_decode_step_kernel_is_the_recurrence(monkeypatch, dtype, rows):
    """``methods.mamba3_step`` (one token of the recurrence over a pool of states, one pass on a
    GPU; interpreted here) against its PyTorch expressions and against the block's forward:
    a prompt prefilled, then a decode step a token at slots out of order, the outputs and all
    four pools; q/k heads shared by two heads each, the angles over half the pairs; ``rows``:
    the state's rows a step of the program's loop (``STEP_ROWS``; None: all at once)."""
    from leetrepro.methods import mamba3_step as step
    monkeypatch.setattr(step, "STEP_ROWS", rows)
    blk = _block().float()
    gen = torch.Generator().manual_seed(8)
    u = torch.randn(2, 15, 32, generator=gen)
    whole = blk(u).double()
    _, states = blk.prefill(u[:, :9])
    slots = torch.tensor([3, 0])

    def decode():
        pools = blk.state_pools(4)
        for pool, s in zip(pools, states):
            pool[slots] = s.to(pool.dtype)
        if dtype != torch.float32:  # (16-bit rows: the block's projections in dtype)
            blk.to(dtype)
        outs = [blk.step(u[:, t].to(dtype), pools, slots) for t in range(9, 15)]
        blk.float()
        return torch.stack(outs, 1), pools
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delenv("LEETREPRO_ROWS_KERNEL", raising=False)
    assert not step.on_row_kernels(u, step.kernels)
    plain, plain_pools = decode()
    monkeypatch.setenv("LEETREPRO_ROWS_KERNEL", "1")
    assert step.on_row_kernels(u, step.kernels)
    got, got_pools = decode()
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert got.dtype == dtype and torch.isfinite(got).all()
    assert rel_error(got.double(), whole[:, 9:]) <= tol
    assert rel_error(plain.double(), whole[:, 9:]) <= tol
    for a, b in zip(got_pools, plain_pools):
        assert rel_error(a.double(), b.double()) <= tol
    assert torch.equal(got_pools[1][1], torch.zeros_like(got_pools[1][1]))  # (slot 1 untouched)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [None, 8])
def test_the_decode_step_kernel_on_the_gpu(dtype, rows, monkeypatch):
    """On a GPU the decode step's one pass (mamba_ssm's test heads: 128/64, 8 heads on 2 q/k
    heads) against its PyTorch expressions on the same pools, several tokens at slots out of
    order: outputs and every pool within the contract; the state's rows all at once and
    ``rows`` a loop step (``STEP_ROWS``)."""
    from leetrepro.methods import mamba3_step as step
    monkeypatch.setattr(step, "STEP_ROWS", rows)
    gen = torch.Generator().manual_seed(9)
    batch, heads, hqk, p, dv, a, slots_n = 3, 8, 2, 128, 64, 32, 5
    slots = torch.tensor([4, 0, 2], device="cuda")
    pools = [torch.randn(slots_n, heads, a, generator=gen),
             torch.randn(slots_n, heads, dv, p, generator=gen) / 8,
             torch.randn(slots_n, heads, p, generator=gen).to(dtype),
             torch.randn(slots_n, heads, dv, generator=gen).to(dtype)]
    pools = [t.cuda() for t in pools]
    mine = [t.clone() for t in pools]
    for _ in range(4):
        dt = torch.nn.functional.softplus(torch.randn(batch, heads, generator=gen) - 1)
        rows = dict(Q=torch.randn(batch, hqk, p, generator=gen) / 11,
                    K=torch.randn(batch, hqk, p, generator=gen) / 11,
                    V=torch.randn(batch, heads, dv, generator=gen), ADT=-dt, DT=dt,
                    Trap=torch.randn(batch, heads, generator=gen),
                    Q_bias=torch.randn(heads, p, generator=gen) / 4,
                    K_bias=torch.randn(heads, p, generator=gen) / 4,
                    Angles=torch.randn(batch, heads, a, generator=gen),
                    D=torch.randn(heads, generator=gen),
                    Z=torch.randn(batch, heads, dv, generator=gen))
        rows = {k: v.cuda().to(dtype if k in ("Q", "K", "V", "Z") else torch.float32)
                for k, v in rows.items()}
        got = step.mamba3_step(**rows, pools=tuple(mine), slots=slots)
        want = step._pytorch(**rows, pools=pools, slots=slots)
        tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
        assert torch.isfinite(got).all() and rel_error(got.double(), want.double()) <= tol
    for a_, b_ in zip(mine, pools):
        assert rel_error(a_.double(), b_.double()) <= tol


@pytest.mark.slow  # (thirty steps of a model: the quick lane keeps Mamba-2's)
def test_a_mamba3_language_model_learns_bytes():
    """``make train``'s Mamba-3 model: thirty AdamW steps on the CPU lower its byte loss."""
    from leetrepro.bench.lm import train
    from leetrepro.models.lm import Mamba3ByteLM, corpus
    df = train("mamba3", corpus(200000), steps=30, batch=4, seq_len=64, dim=32, layers=2,
               heads=2, lr=0.01, device="cpu", log_every=10)
    assert list(df.method.unique()) == ["mamba3"]
    assert df.loss.iloc[-1] < df.loss.iloc[0] and df.loss.iloc[-1] < 4.5
    assert Mamba3ByteLM(32, 1, 2).cfg["name"] == "byte-level Mamba-3, 1 layers × 32"
