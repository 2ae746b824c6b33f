"""
The fused head's softmax pass as Triton kernels (head_kernel=True; the feature is fused_ce's, in
speedgpt/features/fused_ce.py). The pass turns a chunk of logits (n, V) into each row's loss and softmax - one-hot,
the gradient of the logits. With fp8_head it is scaled and cast to float8 e5m2 in the two layouts the gradient
matmuls need: row-major for grad_h = g @ w, and transposed for grad_w = g.T @ h (torch._scaled_mm takes K-major
operands only on Hopper); without, it is stored once, row-major, in the logits' dtype (bfloat16), since a bf16
matmul takes either layout. Without this flag torch.compile fuses the same math into one reduction kernel that
walks each row twice (and, in FP8, writes the transposed copy one byte per row); the roofline of a step
(BENCHMARKS.md) puts it well above its memory floor. Here:

  row_stats  one program per block of rows: an online logsumexp over the vocabulary, then the row's loss
             lse - logit[y]; reads the logits once.
  grad       one program per (rows, vocabulary) tile: softmax - one-hot from the row's lse, times `scale`;
             FP8: cast to e5m2 and stored as is into g8 and transposed into g8t, each a run of whole rows;
             else stored into g in its dtype. The programs walk the vocabulary first, so the logits are read
             and g written in long runs. grad_fp8 and grad_rows are this kernel autotuned over tile shapes
             of their own (the transposed store wants square tiles, the row-major one wide ones).

Each is autotuned over a few tile shapes on its first call. softmax_grad_fp8 and softmax_grad are torch custom
ops, so torch.compile keeps each as one opaque call. Needs Triton and a CUDA GPU (check() refuses the flag
otherwise), and check() runs every tile shape once against the PyTorch math on the GPU at hand (verify), so a
Triton that miscompiles one stops the run before it starts; tests/test_gpu.py compares them with the PyTorch ops of
fused_ce.head_ce_chunk.
"""
import itertools

import torch

from speedgpt import refuse_unready_kernel

# in the kernels: exp(x) = 2 ** (x * log2(e)), 1.4426950408889634 (exp2 is the GPU's native exponential), and
# ln(s) = log2(s) * ln(2), 0.6931471805599453 (literals: a kernel reads no global of the module)

# tile shapes tried on the first call (triton.autotune): (BLOCK_M, BLOCK_V, num_warps, variant).
# row_stats' variant: 0 keeps one running max and sum per row (a reduction across the tile at every step),
# 1 one per element of the tile (two exponentials per logit, one reduction at the end). grad_fp8's: 1 walks
# the vocabulary first, 0 the rows first. How each shape measured: benchmarks/results/softmax_pass_h200.md.
# grad_fp8 is compiled without Triton's assumption that n is a multiple of 16 (do_not_specialize). With it,
# Triton vectorizes the transposed store: the 8-bit tile goes through shared memory and byte permutes into
# 16-byte stores, and ptxas 12.8 and 12.9 (the ones Triton 3.6 bundles, ptxas and ptxas-blackwell) mis-lower
# that code: at 128 x 64 with 4 warps, about 3 bytes in 8 of the transposed copy are foreign, at every row count
# tried, the same with the float32 tile transposed before the cast; ptxas 13.0 compiles the same kernel right,
# and compute-sanitizer's racecheck finds no hazard (triton-lang/triton#11111; benchmarks/fp8_transpose_store.py
# reproduces it). Unspecialized, the transposed copy is stored byte by byte, right with every ptxas, at a cost
# measured in benchmarks/results/roofline_notes.md ("The softmax pass: grad_fp8's transposed copy"). verify() and
# tests/test_gpu.py watch for a return.
# Neither kernel specializes on vocab (it only masks), so verify() at one vocabulary runs the binaries of all.
STATS_CONFIGS = ((8, 256, 8, 0), (1, 4096, 8, 0), (4, 256, 4, 1), (2, 1024, 8, 1))
# grad_fp8's second shape is 32 x 64 at 8 warps: Triton 3.9 lays 64 x 64 at 4 warps out with byte permutes (3.6
# does not), and this one has none under either (tests/test_softmax_pass.py compiles each shape for sm_90 to see).
GRAD_CONFIGS = ((128, 64, 4, 1), (32, 64, 8, 1))
ROWS_CONFIGS = ((8, 512, 4, 1), (16, 256, 4, 1), (4, 1024, 8, 1))    # grad into one row-major (bf16) copy

_kernels = {}                    # (stats, grad, rows configs) -> (row_stats, grad_fp8, grad_rows)


def check(cfg, device):
    """Raise ValueError naming the way out unless head_kernel=True can run: Triton on a CUDA GPU, and every tile
    shape right there (verify). fused_ce.check refuses it without fused_ce first."""
    if cfg.head_kernel:
        refuse_unready_kernel("head_kernel", device, verify, "add --head_kernel=False")


_verified = {}                   # device -> verify's answer, once per process


def verify(device, n=1024, V=50304, vocab=50257):
    """Run every tile shape the kernels may pick (STATS_CONFIGS x GRAD_CONFIGS, then ROWS_CONFIGS: the binaries
    training uses, row counts a multiple of 16) on random logits of `n` rows (V columns, the first vocab real) and
    compare with reference(); return None, or a line saying what differs and at which shape. A Triton version can
    miscompile a shape (3.6 did: see the comment on GRAD_CONFIGS) and the gradients would be silently wrong,
    so check() refuses the flag instead. Leaves the global RNG as it was; the compiled kernels are the ones
    autotuning reuses."""
    if device in _verified:
        return _verified[device]
    row_stats, grad_fp8, grad_rows = kernels()
    gen = torch.Generator(device).manual_seed(0)
    logits = (4 * torch.randn(n, V, device=device, generator=gen)).bfloat16()
    y = torch.randint(0, vocab, (n,), device=device, generator=gen)
    y[::7] = -1
    y[1] = vocab - 1
    ref = reference(logits, y, vocab, 57344.0)
    ref_rows = reference(logits, y, vocab, 1.0, torch.bfloat16)[:2]
    problem = None
    # each shape launched as triton.autotune launches it (its Config's arguments), so the binaries are its own
    shapes = [(s, g, True) for s, g in itertools.product(zip(STATS_CONFIGS, row_stats.configs),
                                                         zip(GRAD_CONFIGS, grad_fp8.configs))]
    shapes += [((STATS_CONFIGS[0], row_stats.configs[0]), g, False) for g in zip(ROWS_CONFIGS, grad_rows.configs)]
    for (stats, s_config), (grad, g_config), fp8 in shapes:
        want = ref if fp8 else ref_rows
        out = [torch.full_like(t.view(torch.uint8), 0xFF).view(t.dtype) for t in want]    # NaN: unwritten shows
        lse = torch.empty_like(out[0])
        row_stats.fn[(-(-n // stats[0]),)](logits, y, out[0], lse, n, V, vocab, **s_config.all_kwargs())
        g, gt = (out[1].view(torch.uint8), out[2].view(torch.uint8)) if fp8 else (out[1], out[1])
        (grad_fp8 if fp8 else grad_rows).fn[(-(-n // grad[0]) * -(-V // grad[1]),)](
            logits, y, lse, g, gt, n, V, vocab, 57344.0 if fp8 else 1.0, FP8=fp8, **g_config.all_kwargs())
        problem = compare(out, want)
        if problem:
            import triton
            problem = f"Triton {triton.__version__} compiled the softmax pass's kernels wrongly on this GPU " \
                      f"(tile shapes {stats} and {grad}: {problem})"
            break
    del logits, ref, ref_rows, out
    torch.cuda.empty_cache()
    _verified[device] = problem
    return problem


def compare(out, ref):
    """None if the kernels' (loss, g8, g8t) are reference()'s: losses to 1e-5, the float8 bytes equal but
    where exp's rounding crosses an e5m2 rounding boundary (then one step apart, at most 1 in 10,000), the
    transposed copy exactly the row-major one. For the row-major pass, (loss, g) in bfloat16 (or the logits'
    dtype), g within one step of that dtype. Otherwise what differs, in a few words."""
    if not torch.allclose(out[0], ref[0], rtol=1e-5, atol=1e-5):
        return f"{(~torch.isclose(out[0], ref[0], rtol=1e-5, atol=1e-5)).sum().item()} row losses differ"
    if len(ref) == 2:
        a, b = out[1].float(), ref[1].float()
        step = torch.finfo(ref[1].dtype).eps * torch.maximum(a.abs(), b.abs()) + 2.0 ** -126
        bad = ~((a - b).abs() <= step)                       # NaN (unwritten) is bad too
        return f"{bad.sum().item()} values of g more than one step off" if bad.any() else None
    for name, got, want in (("g8", out[1], ref[1]), ("g8t", out[2], ref[2])):
        a, b = got.float(), want.float()
        differ = (a != b) | a.isnan()
        if differ.float().mean() > 1e-4:
            return f"{100 * differ.float().mean().item():.2g}% of the bytes of {name} differ"
        step = torch.clamp(0.25 * torch.maximum(a.abs(), b.abs())[differ], min=2.0 ** -16)   # one e5m2 step
        if not ((a - b).abs()[differ] <= step).all():
            return f"values of {name} more than one float8 step off"
    if not torch.equal(out[2].view(torch.uint8), out[1].view(torch.uint8).t()):
        return "the transposed copy is not the row-major one transposed"
    return None


def kernels(stats_configs=STATS_CONFIGS, grad_configs=GRAD_CONFIGS, rows_configs=ROWS_CONFIGS):
    """Build (once per set of configs) and return (row_stats, grad_fp8, grad_rows), each a triton.autotune over
    its configs (grad_fp8 and grad_rows: the one grad kernel, FP8=True / False); benchmarks/softmax_pass.py passes
    one config at a time to time each shape."""
    key = (stats_configs, grad_configs, rows_configs)
    if key in _kernels:
        return _kernels[key]
    import triton
    import triton.language as tl

    def config(m, v, w, variant):
        return triton.Config({"BLOCK_M": m, "BLOCK_V": v, "VARIANT": variant}, num_warps=w)

    @triton.autotune([config(*c) for c in key[0]], key=["n", "V"])
    @triton.jit(do_not_specialize=["vocab"])
    def row_stats(logits, y, loss, lse, n, V, vocab, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr,
                  VARIANT: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        rmask = rows < n
        base = logits + rows.to(tl.int64)[:, None] * V
        # the vocabulary in full tiles (no column mask) and then one last tile, masked at vocab: only there
        # can a running max still be -inf (which the where()s keep from making nan)
        full = vocab // BLOCK_V * BLOCK_V
        if VARIANT == 1:
            mm = tl.full((BLOCK_M, BLOCK_V), float("-inf"), tl.float32)  # per element of the tile
            ss = tl.zeros((BLOCK_M, BLOCK_V), tl.float32)
            for v0 in range(0, full, BLOCK_V):
                x = tl.load(base + (v0 + tl.arange(0, BLOCK_V))[None, :], mask=rmask[:, None])
                x = x.to(tl.float32) * 1.4426950408889634
                m_new = tl.maximum(mm, x)
                ss = ss * tl.exp2(mm - m_new) + tl.exp2(x - m_new)
                mm = m_new
            cols = full + tl.arange(0, BLOCK_V)
            x = tl.load(base + cols[None, :], mask=rmask[:, None] & (cols < V)[None, :])
            x = tl.where((cols < vocab)[None, :], x.to(tl.float32) * 1.4426950408889634, float("-inf"))
            m_new = tl.maximum(mm, x)
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
            ss = ss * tl.exp2(mm - m_ref) + tl.exp2(x - m_ref)
            mm = m_new
            m = tl.max(mm, 1)
            m_ref = tl.where(m == float("-inf"), 0.0, m)
            s = tl.sum(ss * tl.exp2(mm - m_ref[:, None]), 1)
        else:
            m = tl.full((BLOCK_M,), float("-inf"), tl.float32)       # running max of x * log2(e)
            s = tl.zeros((BLOCK_M,), tl.float32)                     # running sum of 2 ** (x * log2(e) - m)
            for v0 in range(0, full, BLOCK_V):
                x = tl.load(base + (v0 + tl.arange(0, BLOCK_V))[None, :], mask=rmask[:, None])
                x = x.to(tl.float32) * 1.4426950408889634
                m_new = tl.maximum(m, tl.max(x, 1))
                s = s * tl.exp2(m - m_new) + tl.sum(tl.exp2(x - m_new[:, None]), 1)
                m = m_new
            for v0 in range(full, vocab, BLOCK_V):                  # the last tile, if any
                cols = v0 + tl.arange(0, BLOCK_V)
                x = tl.load(base + cols[None, :], mask=rmask[:, None] & (cols < V)[None, :])
                x = tl.where((cols < vocab)[None, :], x.to(tl.float32) * 1.4426950408889634, float("-inf"))
                m_new = tl.maximum(m, tl.max(x, 1))
                m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # all -inf so far: keep s = 0
                s = s * tl.exp2(m - m_ref) + tl.sum(tl.exp2(x - m_ref[:, None]), 1)
                m = m_new
        row_lse = (m + tl.log2(s)) * 0.6931471805599453
        t = tl.load(y + rows, mask=rmask, other=-1)
        x_t = tl.load(logits + rows.to(tl.int64) * V + tl.maximum(t, 0), mask=rmask, other=0.0).to(tl.float32)
        tl.store(loss + rows, tl.where(t != -1, row_lse - x_t, 0.0), mask=rmask)
        tl.store(lse + rows, row_lse, mask=rmask)

    @triton.jit(do_not_specialize=["n", "vocab"])
    def grad(logits, y, lse, g, gt, n, V, vocab, scale, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr,
             VARIANT: tl.constexpr, FP8: tl.constexpr):
        pid = tl.program_id(0)
        if VARIANT == 0:
            n_mblocks = tl.cdiv(n, BLOCK_M)
            pm, pv = pid % n_mblocks, pid // n_mblocks
        else:                                                             # the vocabulary varies fastest
            n_vblocks = tl.cdiv(V, BLOCK_V)
            pm, pv = pid // n_vblocks, pid % n_vblocks
        rows = pm * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = pv * BLOCK_V + tl.arange(0, BLOCK_V)
        r, c = rows[:, None], cols[None, :]
        # masked at V (a multiple of 16), not at vocab: the loads stay vectorized; vocab is applied after
        x = tl.load(logits + r.to(tl.int64) * V + c, mask=(r < n) & (c < V))
        x = tl.where(c < vocab, x.to(tl.float32), float("-inf"))
        t = tl.load(y + r, mask=r < n, other=-1).to(tl.int32)
        lse2 = tl.load(lse + r, mask=r < n, other=0.0) * 1.4426950408889634
        p = tl.exp2(x * 1.4426950408889634 - lse2)                        # softmax; 0 at padded columns
        p = tl.where(c == t, p - 1.0, p)
        p = tl.where(t != -1, p * scale, 0.0)                             # |p| <= scale: no saturation
        if FP8:         # g, gt: uint8 views of the float8 outputs (n, V) and (V, n)
            b = p.to(tl.float8e5, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)
            tl.store(g + r.to(tl.int64) * V + c, b, mask=(r < n) & (c < V))
            tl.store(gt + cols.to(tl.int64)[:, None] * n + rows[None, :], tl.trans(b),
                     mask=(cols < V)[:, None] & (rows < n)[None, :])
        else:           # g (n, V) in its own dtype; gt unused
            tl.store(g + r.to(tl.int64) * V + c, p.to(g.dtype.element_ty), mask=(r < n) & (c < V))

    grad_fp8 = triton.autotune([config(*c) for c in key[1]], key=["n", "V"])(grad)
    grad_rows = triton.autotune([config(*c) for c in key[2]], key=["n", "V"])(grad)

    _kernels[key] = row_stats, grad_fp8, grad_rows
    return _kernels[key]


def run(logits, y, vocab_size, scale, built=None, out=None, fp8=True):
    """The pass with `built` = kernels(...) (default: the autotuned STATS_CONFIGS, GRAD_CONFIGS and ROWS_CONFIGS),
    into `out` = (loss, g8, g8t), or (loss, g) when not fp8, when given (the tests fill them first, so that a value
    the kernels do not write shows); see softmax_grad_fp8 and, for fp8=False, softmax_grad."""
    row_stats, grad_fp8, grad_rows = built or kernels()
    logits, y = logits.contiguous(), y.contiguous()
    n, V = logits.shape
    loss = torch.empty(n, dtype=torch.float32, device=logits.device) if out is None else out[0]
    if out is not None:
        g = out[1:]
    elif fp8:
        g = (torch.empty((n, V), dtype=torch.float8_e5m2, device=logits.device),
             torch.empty((V, n), dtype=torch.float8_e5m2, device=logits.device))
    else:
        g = (torch.empty_like(logits),)
    lse = torch.empty_like(loss)
    row_stats[lambda a: (-(-n // a["BLOCK_M"]),)](logits, y, loss, lse, n, V, vocab_size)
    g_args = (g[0].view(torch.uint8), g[1].view(torch.uint8)) if fp8 else (g[0], g[0])
    (grad_fp8 if fp8 else grad_rows)[lambda a: (-(-n // a["BLOCK_M"]) * -(-V // a["BLOCK_V"]),)](
        logits, y, lse, *g_args, n, V, vocab_size, scale, FP8=fp8)
    return (loss, *g)


def reference(logits, y, vocab_size, scale, dtype=torch.float8_e5m2):
    """softmax_grad_fp8's math in PyTorch ops (fused_ce.head_ce_chunk's, which torch.compile fuses without
    this flag): the reference of the GPU tests and of benchmarks/softmax_pass.py. Same arguments and returns;
    dtype=torch.bfloat16 (and scale 1) gives softmax_grad's (loss, g) and g's transpose."""
    lf = logits.float()
    col = torch.arange(lf.size(1), device=lf.device)
    lf = lf.masked_fill(col >= vocab_size, float("-inf"))
    lse = torch.logsumexp(lf, dim=-1)
    valid = y != -1
    loss = torch.where(valid, lse - lf.gather(1, y.clamp(min=0)[:, None])[:, 0], 0.0)
    g = (torch.exp(lf - lse[:, None]) - (col == y[:, None]).float()) * valid[:, None] * scale
    return loss, g.to(dtype), g.t().to(dtype).contiguous()


@torch.library.custom_op("speedgpt::softmax_grad_fp8", mutates_args=())
def softmax_grad_fp8(logits: torch.Tensor, y: torch.Tensor, vocab_size: int,
                     scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The FP8 head's softmax pass. logits (n, V) bfloat16 (or float16 / float32) on a CUDA GPU; y (n,) int64
    targets, -1 ignored; the softmax in float32 over the first vocab_size columns (the rest are padding).
    Returns (loss (n,) float32: lse - logit[y], 0 for an ignored row; g8 (n, V) and g8t (V, n), both
    row-major float8 e5m2: (softmax - one-hot) * scale, zero rows for ignored targets, zero padded columns).
    scale <= 57344 (e5m2's largest finite), since |softmax - one-hot| <= 1. The math of
    fused_ce.head_ce_chunk's PyTorch ops; its float8 bytes may differ from theirs where exp's rounding
    crosses a float8 rounding boundary."""
    return run(logits, y, vocab_size, scale)


@softmax_grad_fp8.register_fake
def _(logits, y, vocab_size, scale):
    n, V = logits.shape
    return (logits.new_empty(n, dtype=torch.float32), logits.new_empty((n, V), dtype=torch.float8_e5m2),
            logits.new_empty((V, n), dtype=torch.float8_e5m2))


@torch.library.custom_op("speedgpt::softmax_grad", mutates_args=())
def softmax_grad(logits: torch.Tensor, y: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The bf16 head's softmax pass: softmax_grad_fp8's arguments without the scale, and (loss, g) with g (n, V)
    = softmax - one-hot in the logits' dtype, row-major (rounded once from float32, as the PyTorch ops do)."""
    return run(logits, y, vocab_size, 1.0, fp8=False)


@softmax_grad.register_fake
def _(logits, y, vocab_size):
    return logits.new_empty(logits.size(0), dtype=torch.float32), torch.empty_like(logits)
