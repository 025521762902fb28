"""Sequence parallelism on the CPU: gloo, 2-4 processes, against one process and the float64 oracle.

Each spawn runs every case in its processes (starting processes is the cost): uneven slices, a
slice of one row and an empty one, both masks and per-head γ, initial and final state, forward and
every gradient."""
import os
import tempfile
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from leetrepro import causal_linear_decoder, reference, rel_error
from leetrepro.distributed import causal_linear_decoder_sp, local_state

from conftest import make_inputs, random_gammas

# (lengths of the ranks' slices, batch, heads, r, d)
CASES = {2: [((37, 50), 2, 3, 8, 5), ((1, 64), 1, 2, 4, 4)],
         3: [((20, 1, 33), 2, 2, 6, 7), ((16, 0, 16), 1, 3, 4, 4)],
         5: [((9, 0, 1, 17, 30), 2, 2, 5, 3)]}


def _case(lengths, batch, heads, r, d, dtype, decay, with_s0, with_final, method, seed):
    n = sum(lengths)
    B, C, V = make_inputs(batch, heads, n, r, d, dtype=dtype, seed=seed)
    g = random_gammas(heads, seed, low=0.3) if decay else None
    gen = torch.Generator().manual_seed(seed + 7)
    S0 = torch.randn(batch, heads, r, d, generator=gen, dtype=torch.float64) if with_s0 else None
    dO = torch.randn(batch, heads, n, d, generator=gen, dtype=torch.float64)
    dS = torch.randn(batch, heads, r, d, generator=gen, dtype=torch.float64)
    return B, C, V, g, S0, dO, dS


def _grads(fn, B, C, V, g, S0, dO, dS, with_final, scale_final=1.0):
    leaves = [t.detach().clone().requires_grad_() for t in (B, C, V)]
    s0 = None if S0 is None else S0.detach().clone().requires_grad_()
    res = fn(*leaves, g, initial_state=s0, output_final_state=with_final)
    out, fin = res if with_final else (res, None)
    loss = (out.double() * dO).sum()
    if with_final:
        loss = loss + scale_final * (fin.double() * dS).sum()
    loss.backward()
    grads = [t.grad for t in leaves] + ([s0.grad] if s0 is not None else [])
    return out.detach(), (None if fin is None else fin.detach()), grads


def _in_group(rank, world, init, failures, body):
    """``body()`` in rank ``rank`` of a gloo group of ``world``, then a barrier; a failure put
    on ``failures`` with its rank and traceback (the spawner reports them)."""
    try:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
        body()
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        failures.put(f"rank {rank}: {traceback.format_exc()}")
        raise


def _worker_cases(rank, world):
    """The operator over the ranks (:data:`CASES`' slices, one of a row and an empty one among
    them): both masks and per-head γ, initial and final states, float64 and float32; O, S_N and
    every gradient against the oracle on the whole sequence; an initial state off rank 0
    refused."""
    seed = 0
    for lengths, batch, heads, r, d in CASES[world]:
        lo, hi = sum(lengths[:rank]), sum(lengths[:rank + 1])
        for dtype, method, tol in ((torch.float64, "auto", 1e-12), (torch.float32, "LA_torch", 1e-5)):
            for decay, with_s0, with_final in ((False, False, False), (True, True, True),
                                               (True, False, True), (False, True, False)):
                seed += 1
                B, C, V, g, S0, dO, dS = _case(lengths, batch, heads, r, d, dtype, decay,
                                               with_s0, with_final, method, seed)
                want_o, want_s, want_g = _grads(reference, B, C, V, g, S0, dO, dS, with_final)
                sl = slice(lo, hi)
                # each rank's copy of S_N enters the loss once, so the gradients add up to
                # world copies: the oracle's loss counts it world times
                want_g2 = _grads(reference, B, C, V, g, S0, dO, world * dS, with_final)[2] \
                    if with_final else want_g

                def sp(b, c, v, gg, initial_state, output_final_state):
                    return causal_linear_decoder_sp(
                        b[:, :, sl], c[:, :, sl], v[:, :, sl], gg,
                        initial_state=initial_state if rank == 0 else None,
                        output_final_state=output_final_state, method=method)

                got_o, got_s, got_g = _grads(sp, B, C, V, g, S0, dO[:, :, sl], dS, with_final)
                label = f"rank {rank} {lengths} {dtype} decay={decay} s0={with_s0} final={with_final}"
                checks = [("O", got_o, want_o[:, :, sl])]
                if with_final:
                    checks.append(("S_N", got_s, want_s))
                # dB, dC, dV: this rank's rows of the whole sequence's gradients
                for name, got, want in zip(("dB", "dC", "dV"), got_g[:3], want_g2[:3]):
                    checks.append((name, got[:, :, sl], want[:, :, sl]))
                for name, got, want in checks:
                    if want.numel() == 0:
                        assert got.numel() == 0, (label, name)
                        continue
                    err = rel_error(got, want)
                    assert err <= tol, f"{label}: {name} relative error {err:.2e} > {tol:.0e}"
                if with_s0 and rank == 0:  # rank 0's dS0 is already the whole gradient
                    err = rel_error(got_g[3], want_g2[3])
                    assert err <= tol, f"{label}: dS0 relative error {err:.2e} > {tol:.0e}"
    # initial_state off rank 0 is an error (raised before any collective)
    if rank == 1:
        B, C, V = make_inputs(1, 1, 3, 2, 2)
        with pytest.raises(ValueError, match="rank 0"):
            causal_linear_decoder_sp(B, C, V, initial_state=torch.zeros(1, 1, 2, 2))


def _gated_worker_cases(rank, world):
    """Per-token gates over the ranks: each passes its rows of g; O, S_N and the gradients of
    B, C, V, g and S0 against the float64 oracle on the whole sequence."""
    seed = 100
    for lengths, batch, heads, r, d in CASES[world]:
        lo, hi = sum(lengths[:rank]), sum(lengths[:rank + 1])
        sl = slice(lo, hi)
        for dtype, method, tol in ((torch.float64, "auto", 1e-12),
                                   (torch.float32, "LA_torch", 1e-5)):
            for decay, with_s0, with_final in ((False, True, True), (True, False, True),
                                               (True, True, False)):
                seed += 1
                B, C, V, gam, S0, dO, dS = _case(lengths, batch, heads, r, d, dtype, decay,
                                                 with_s0, with_final, method, seed)
                gates = -torch.rand(batch, heads, sum(lengths), dtype=torch.float64,
                                    generator=torch.Generator().manual_seed(seed)) * 0.6
                leaves = [t.detach().clone().to(dtype).requires_grad_() for t in (B, C, V)]
                g_leaf = gates.detach().clone().requires_grad_()
                s0 = None if S0 is None else S0.detach().clone().requires_grad_()
                res = causal_linear_decoder_sp(
                    *(t[:, :, sl] for t in leaves), gam, g=g_leaf[:, :, sl],
                    initial_state=s0 if rank == 0 else None,
                    output_final_state=with_final, method=method)
                out, fin = res if with_final else (res, None)
                loss = (out.double() * dO[:, :, sl]).sum()
                if with_final:
                    loss = loss + (fin.double() * dS).sum()
                loss.backward()
                ref = [t.detach().clone().requires_grad_() for t in (B, C, V, gates)]
                r0 = None if S0 is None else S0.detach().clone().requires_grad_()
                want = reference(*ref[:3], gam, g=ref[3], initial_state=r0,
                                 output_final_state=True)
                # (each rank's copy of S_N enters its loss once: world copies in all)
                wloss = (want[0] * dO).sum() + \
                    ((world * (want[1] * dS).sum()) if with_final else 0)
                wloss.backward()
                label = f"rank {rank} {lengths} {dtype} gates decay={decay} s0={with_s0}"
                checks = [("O", out, want[0][:, :, sl])]
                if with_final:
                    checks.append(("S_N", fin, want[1]))
                for name, got, w in zip(("dB", "dC", "dV", "dg"),
                                        [t.grad for t in leaves] + [g_leaf.grad], ref):
                    checks.append((name, got[:, :, sl], w.grad[:, :, sl]))
                if with_s0 and rank == 0:
                    checks.append(("dS0", s0.grad, r0.grad))
                for name, got, w in checks:
                    if w.numel() == 0:
                        continue
                    err = rel_error(got, w)
                    if name == "dg":  # (a slice's dg may be exactly 0: the first row's
                        # gate decays only the initial state; relative to the whole's)
                        err = (got.double() - w).norm().item() / ref[3].grad.norm().item()
                    assert err <= tol, f"{label}: {name} relative error {err:.2e} > {tol:.0e}"


def _ssd_worker_cases(rank, world):
    """Mamba-2's SSD over the ranks (``mamba_chunk_scan_combined_sp``): each rank its rows of x,
    dt, B, C and z, the shared A, D and dt_bias (their gradients summed over the ranks, as a
    replicated parameter's are), the initial state on rank 0, sequences packed by seq_idx (one
    starting at a rank's first row, one running across ranks); y, the final state and every
    gradient against the single-process drop-in on the whole sequence."""
    from leetrepro.compat import mamba_chunk_scan_combined
    from leetrepro.distributed import mamba_chunk_scan_combined_sp
    lengths = {2: (23, 17), 3: (23, 1, 17)}[world]
    lo, hi = sum(lengths[:rank]), sum(lengths[:rank + 1])
    n, batch, heads, p, groups, dstate = sum(lengths), 2, 4, 6, 2, 5
    # (float64 inputs too: the step sizes and gates are float32, mamba_ssm's and the
    # drop-in's, so the slices' sums in another order agree to float32's precision)
    # packed sequences by seq_idx: row 0's change at 23 (a rank's first row), at 10 (inside a
    # rank); row 1's sequence from 10 to 24 across ranks (24: world 3's rank 2's first row)
    seq_idx = torch.zeros(batch, n, dtype=torch.int32)
    seq_idx[0, 10:], seq_idx[0, 23:], seq_idx[1, 10:], seq_idx[1, 24:] = 1, 2, 5, 6
    for dtype, method, tol, packed in ((torch.float64, "auto", 1e-6, False),
                                       (torch.float32, "LA_torch", 1e-5, False),
                                       (torch.float64, "auto", 1e-6, True)):
        extra = dict(seq_idx=seq_idx) if packed else {}
        gen = torch.Generator().manual_seed(40)
        x = torch.randn(batch, n, heads, p, generator=gen, dtype=torch.float64)
        dt = torch.randn(batch, n, heads, generator=gen, dtype=torch.float64) - 1
        A = -torch.rand(heads, generator=gen, dtype=torch.float64) * 2
        B, C = (torch.randn(batch, n, groups, dstate, generator=gen, dtype=torch.float64)
                for _ in range(2))
        D, bias = (torch.randn(heads, generator=gen, dtype=torch.float64) for _ in range(2))
        z = torch.randn(batch, n, heads, p, generator=gen, dtype=torch.float64)
        s0 = torch.randn(batch, heads, p, dstate, generator=gen, dtype=torch.float64)
        dy = torch.randn(batch, n, heads, p, generator=gen, dtype=torch.float64)
        dS = torch.randn(batch, heads, p, dstate, generator=gen, dtype=torch.float64)
        rows = dict(x=x, dt=dt, B=B, C=C, z=z)
        shared = dict(A=A, D=D, dt_bias=bias)
        cast = {k: v.to(dtype) for k, v in {**rows, **shared}.items()}
        mine = {k: (v[:, lo:hi] if k in rows else v).detach().clone().requires_grad_()
                for k, v in cast.items()}
        s0_mine = s0.to(dtype).requires_grad_() if rank == 0 else None
        y, fin = mamba_chunk_scan_combined_sp(
            mine["x"], mine["dt"], mine["A"], mine["B"], mine["C"], 64, D=mine["D"],
            z=mine["z"], dt_bias=mine["dt_bias"], initial_states=s0_mine,
            dt_softplus=True, return_final_states=True, method=method,
            **{k: v[:, lo:hi] for k, v in extra.items()})
        loss = (y.double() * dy[:, lo:hi]).sum() + \
            ((fin.double() * dS).sum() if rank == 0 else 0)
        loss.backward()
        for k in shared:
            dist.all_reduce(mine[k].grad)
        whole = {k: v.detach().clone().requires_grad_() for k, v in cast.items()}
        s0_whole = s0.to(dtype).requires_grad_()
        wy, wfin = mamba_chunk_scan_combined(
            whole["x"], whole["dt"], whole["A"], whole["B"], whole["C"], 64, D=whole["D"],
            z=whole["z"], dt_bias=whole["dt_bias"], initial_states=s0_whole,
            dt_softplus=True, return_final_states=True, method=method, **extra)
        ((wy.double() * dy).sum() + (wfin.double() * dS).sum()).backward()
        label = f"rank {rank} {dtype}" + (" packed" if packed else "")
        checks = [("y", y, wy[:, lo:hi]), ("final", fin, wfin)]
        checks += [(f"d{k}", mine[k].grad, whole[k].grad[:, lo:hi] if k in rows
                    else whole[k].grad) for k in cast]
        if rank == 0:
            checks.append(("dinitial_states", s0_mine.grad, s0_whole.grad))
        for name, got, want in checks:
            if want.numel():
                err = rel_error(got, want)
                assert err <= tol, f"{label}: {name} relative error {err:.2e} > {tol:.0e}"


def _block_worker_cases(rank, world):
    """A Mamba-2 block over the ranks (``Mamba2Block.forward(u, group=)``): each rank its rows of
    u, a slice shorter than the convolution's window among them; the output, u's gradient and
    every parameter's (summed over the ranks) against the block on the whole sequence."""
    from leetrepro.models import Mamba2Block
    lengths = {2: (23, 2), 3: (20, 1, 19)}[world]
    lo, hi = sum(lengths[:rank]), sum(lengths[:rank + 1])
    torch.manual_seed(0)
    block = Mamba2Block(16, d_state=4, headdim=8, ngroups=2, method="LA_torch").double()
    gen = torch.Generator().manual_seed(3)
    u = torch.randn(2, sum(lengths), 16, generator=gen, dtype=torch.float64)
    dy = torch.randn(2, sum(lengths), 16, generator=gen, dtype=torch.float64)
    mine = u[:, lo:hi].clone().requires_grad_()
    out = block(mine, group=dist.group.WORLD)
    (out * dy[:, lo:hi]).sum().backward()
    got = {name: p.grad.clone() for name, p in block.named_parameters()}
    for g in got.values():
        dist.all_reduce(g)
    block.zero_grad()
    whole = u.clone().requires_grad_()
    want = block(whole)
    (want * dy).sum().backward()
    assert rel_error(out, want[:, lo:hi]) <= 1e-6, rel_error(out, want[:, lo:hi])
    assert rel_error(mine.grad, whole.grad[:, lo:hi]) <= 1e-6
    for name, p in block.named_parameters():
        assert rel_error(got[name], p.grad) <= 1e-6, (name, rel_error(got[name], p.grad))


#: what the processes of each world size check, in one spawn (starting processes is the cost)
EVERY = (_worker_cases, _gated_worker_cases, _ssd_worker_cases, _block_worker_cases)
# (five ranks: more than four, and not a power of two; the gathers have no rule by the world's
# size. Eight ran here too, eight processes on CI's two cores: 30 s and the other worker slowed)
SUITES = {2: EVERY, 3: EVERY, 5: EVERY[:1]}


def _every_suite(rank, world, init, failures):
    _in_group(rank, world, init, failures, lambda: [cases(rank, world) for cases in SUITES[world]])


# every world size runs in the full lane (the quick lane checks one process without a group,
# below)
@pytest.mark.slow
@pytest.mark.parametrize("world", sorted(SUITES))
def test_sequence_parallel_equals_one_process_and_the_oracle(world):
    """The operator with γ or the 0-1 mask, with per-token gates, Mamba-2's SSD and a Mamba-2
    block over ``world`` gloo processes (the last three at 2 and 3 processes), each against the
    float64 oracle or one process on the whole sequence (each suite's docstring says how)."""
    _spawn(_every_suite, world)


def _spawn(worker, world):
    ctx = mp.get_context("spawn")
    failures = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        init = "file://" + os.path.join(tmp, "rendezvous")
        try:
            mp.start_processes(worker, args=(world, init, failures), nprocs=world,
                               start_method="spawn")
        except Exception as exc:
            msgs = []
            while not failures.empty():
                msgs.append(failures.get())
            pytest.fail("\n".join(msgs) or str(exc))


def test_one_process_without_a_group_is_the_operator():
    B, C, V = make_inputs(2, 3, 45, 6, 7, dtype=torch.float64, seed=4)
    g = random_gammas(3, 4)
    S0 = torch.randn(2, 3, 6, 7, dtype=torch.float64)
    out, s = causal_linear_decoder_sp(B, C, V, g, initial_state=S0, output_final_state=True)
    want, want_s = causal_linear_decoder(B, C, V, g, initial_state=S0, output_final_state=True)
    assert rel_error(out, want) < 1e-13 and rel_error(s, want_s) < 1e-13


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("decay", [False, True])
def test_local_state_is_the_final_state(reverse, decay):
    B, C, V = make_inputs(2, 3, 70, 5, 6, dtype=torch.float64, seed=9)
    g = random_gammas(3, 9) if decay else None
    rows = C.flip(2) if reverse else C
    vals = V.flip(2) if reverse else V
    _, want = reference(B, rows, vals, g, output_final_state=True)
    assert rel_error(local_state(C, V, g, reverse=reverse), want) < 1e-13


def _bench_worker(rank, world, init, argv, failures):
    try:
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
        host, port = init.replace("tcp://", "").split(":")
        os.environ.update(MASTER_ADDR=host, MASTER_PORT=port)
        from leetrepro.bench import sp
        assert sp.main(argv) == 0
    except Exception:
        failures.put(f"rank {rank}: {traceback.format_exc()}")


def _run_bench(argv, world=2):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    failures = mp.get_context("spawn").SimpleQueue()
    mp.spawn(_bench_worker, args=(world, f"tcp://127.0.0.1:{port}", argv, failures), nprocs=world)
    assert failures.empty(), failures.get()


@pytest.mark.slow
def test_the_sp_benchmark_runs_to_the_end_on_any_memory_and_resumes(monkeypatch):
    """``bench.sp`` on two gloo ranks (its CPU smoke mode): cells that do not fit the memory cap
    are rows with ``status=oom`` (no crash), every row is on disk, time-major slices; ``--resume``
    at the same commit keeps them and measures only what is missing, also at a commit whose
    hash reads as a number (digits and one "e": pandas once read it as inf, and kept no row)."""
    import pandas as pd
    monkeypatch.setenv("LEETREPRO_COMMIT", "85379474e521")
    from leetrepro.bench.sp import cell_bytes
    with tempfile.TemporaryDirectory() as out:
        n = 256
        # a cap between the forward's estimate and the backward's on one rank's 128 rows: the
        # distributed forward runs, its backward and both single-GPU cells (256 rows) do not
        cap = (cell_bytes("fwd", n // 2, 4) + cell_bytes("fwd_bwd", n // 2, 4)) / 2 / 2 ** 30
        base = ["--out", out, "--ns", str(n), "--single-max-n", str(n), "--check-n", "64",
                "--reps", "1", "--dtype", "float32", "--method", "LA_torch", "--longest"]
        _run_bench(base + ["--max-gib", str(cap)])
        df = pd.read_csv(os.path.join(out, "sp.csv"))
        status = {(r.gpus, r["pass"]): r.status for _, r in df.iterrows()}
        assert status == {(1, "fwd"): "oom", (1, "fwd_bwd"): "oom", (2, "fwd"): "ok",
                          (2, "fwd_bwd"): "oom"}
        assert set(df.layout) == {"time-major"} and df[df.status == "ok"].ms.notna().all()
        _run_bench(base + ["--resume"])  # no cap: the cells that did not fit, again
        again = pd.read_csv(os.path.join(out, "sp.csv"))
        assert (again.status == "ok").all() and len(again) == 4
        # the measured row kept as it was, not measured again
        assert again[again.gpus == 2].iloc[0].ms == df[(df.gpus == 2) & (df.status == "ok")].ms.iloc[0]


def test_the_sp_benchmark_defaults_cover_every_host_size():
    """Weak scaling at 512 Ki, 1 Mi and 2 Mi tokens per GPU and strong scaling at 1 Mi on any P;
    the longest-sequence candidates run from 3 Mi to 1/2 Mi per GPU, largest first, so an 80 GB
    card (about 1.1 Mi per GPU by the estimate) finds one."""
    from leetrepro.bench.sp import cell_fits, default_ns, longest_candidates
    mi = 2 ** 20
    assert default_ns(2) == [mi, 2 * mi, 4 * mi]
    assert default_ns(4) == [mi, 2 * mi, 4 * mi, 8 * mi]
    assert default_ns(8) == [mi, 4 * mi, 8 * mi, 16 * mi]
    cands = longest_candidates(4)
    assert cands == sorted(cands, reverse=True) and cands[0] == 12 * mi and cands[-1] == 2 * mi
    h100_free = 79 * 2 ** 30
    fit = [n for n in cands if cell_fits("fwd_bwd", n // 4, 2, h100_free)]
    assert fit[0] == 4 * 9 * mi // 8  # 1.125 Mi per GPU: 8.3 tensors of 8 GiB per Mi, 75 GiB


def test_the_ssd_on_one_process_without_a_group_is_the_drop_in():
    """``mamba_chunk_scan_combined_sp`` without an initialised group runs on this process alone:
    the drop-in's output and final state, with sequences packed by seq_idx too; offsets
    (``cu_seqlens``) across ranks are refused by name."""
    from leetrepro.compat import mamba_chunk_scan_combined
    from leetrepro.distributed import mamba_chunk_scan_combined_sp
    gen = torch.Generator().manual_seed(41)
    x = torch.randn(1, 30, 4, 6, generator=gen)
    dt, A = torch.randn(1, 30, 4, generator=gen), -torch.rand(4, generator=gen)
    B, C = (torch.randn(1, 30, 2, 5, generator=gen) for _ in range(2))
    kw = dict(D=torch.ones(4), dt_softplus=True, return_final_states=True, method="LA_torch")
    y, fin = mamba_chunk_scan_combined_sp(x, dt, A, B, C, 64, **kw)
    wy, wfin = mamba_chunk_scan_combined(x, dt, A, B, C, 64, **kw)
    assert rel_error(y, wy) <= 1e-6 and rel_error(fin, wfin) <= 1e-6
    seq_idx = (torch.arange(30) >= 11).int()[None]
    y, fin = mamba_chunk_scan_combined_sp(x, dt, A, B, C, 64, seq_idx=seq_idx, **kw)
    wy, wfin = mamba_chunk_scan_combined(x, dt, A, B, C, 64, seq_idx=seq_idx, **kw)
    assert rel_error(y, wy) <= 1e-6 and rel_error(fin, wfin) <= 1e-6
    with pytest.raises(ValueError, match="cu_seqlens: sequences packed by offsets"):
        mamba_chunk_scan_combined_sp(x, dt, A, B, C, 64,
                                     cu_seqlens=torch.tensor([0, 11, 30], dtype=torch.int32))
