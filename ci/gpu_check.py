#!/usr/bin/env python3
"""make gpu-check: impl's Triton kernels compiled on a CUDA GPU, at realistic sizes.

Never required by CI: without a CUDA GPU it says so and exits 0. With one it
1. runs the kernel tests marked `gpu` (pytest -m gpu, kernels compiled);
2. measures the device's copy bandwidth (a 1 GiB device-to-device copy);
3. runs every kernel at realistic sizes (the builders of
   harness/attention/kernel_cases.py, as the CPU tests use at small sizes),
   checks each output (attention against the float64 reference and against
   torch's SDPA on the same keys and values gathered densely; the cache kernels
   exactly against plain tensor indexing), and times it;
4. where vLLM's own Triton unified attention imports, times and compares it too.
It stays well under 8 minutes on one H100/H200-class GPU.

Output (stdout; the full format, with every column, in specs/ATTENTION.md):
a header line `kvconform gpu-check: <device>, torch <v>, triton <v>; copy
bandwidth <X> GB/s`, a column-title line, one row per check with the columns
kernel, case, dtype, ms, GB/s, %copy, TFLOP/s, err vs, max_abs, worst/tol,
result, and a last line `<N> checks, <F> failed, <S> skipped; <T> s`.

- ms: median of 20 timed runs after 3 warm-ups (CUDA events);
- GB/s: bytes the kernel must move (KV read once, inputs read, outputs written)
  divided by the time; %copy: that bandwidth as a share of the measured copy
  bandwidth (the roofline of a memory-bound kernel);
- TFLOP/s: attention's 4 * q * kv * head_size flops per head over the time;
- err vs: what the output was compared with; max_abs and worst/tol as in
  specs/attention_tolerances.yaml (worst element's error / its tolerance,
  <= 1 passes); result: ok, FAIL, timing (a baseline, not checked) or
  skipped (reason).
Exit code: 0 all ok (or no GPU), 1 a check failed. `--json PATH` also writes
the rows as JSON. `--device cpu --tiny` runs the same script interpreted at
toy sizes (tests/ci/test_gpu_check.py uses it to keep the script working).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--tiny", action="store_true", help="toy sizes (for the CPU smoke test)")
    p.add_argument("--json", help="also write the rows here")
    p.add_argument("--no-pytest", action="store_true", help="skip the pytest -m gpu run")
    return p.parse_args()


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None:
    # Compiled kernels on the GPU; the interpreter for the CPU smoke run. Must
    # be chosen before any kernel module is imported.
    os.environ["TRITON_INTERPRET"] = "1" if ARGS.device == "cpu" else "0"

import torch  # noqa: E402


@dataclass(slots=True)
class Row:
    kernel: str
    case: str
    dtype: str
    ms: float | None = None
    gbps: float | None = None
    pct_copy: float | None = None
    tflops: float | None = None
    against: str = "-"
    max_abs: float | None = None
    worst_ratio: float | None = None
    result: str = "ok"


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_row(r: Row) -> None:
    print(f"{r.kernel:<20} {r.case:<34} {r.dtype:<9} {_fmt(r.ms, '.3f'):>8} "
          f"{_fmt(r.gbps, '.1f'):>8} {_fmt(r.pct_copy, '.1f'):>6} {_fmt(r.tflops, '.1f'):>7}  "
          f"{r.against:<10} {_fmt(r.max_abs, '.3e'):>10} {_fmt(r.worst_ratio, '.2f'):>9}  "
          f"{r.result}", flush=True)


def timed_ms(fn, device: str, warmup: int = 3, iters: int = 20) -> float:
    for _ in range(warmup):
        fn()
    if device != "cuda":
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def copy_bandwidth(device: str, nbytes: int) -> float:
    """GB/s of a device-to-device copy (bytes read + bytes written)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = timed_ms(lambda: dst.copy_(src), device)
    return 2 * nbytes / ms / 1e6


class Checker:
    def __init__(self, device: str, tiny: bool) -> None:
        self.device, self.tiny, self.rows = device, tiny, []
        self.copy_gbps = copy_bandwidth(device, (16 << 20) if tiny else (1 << 30))

    def add(self, row: Row, nbytes: int | None = None, flops: float | None = None) -> None:
        if row.ms is not None and nbytes:
            row.gbps = nbytes / row.ms / 1e6
            row.pct_copy = 100 * row.gbps / self.copy_gbps
        if row.ms is not None and flops:
            row.tflops = flops / row.ms / 1e9
        self.rows.append(row)
        print_row(row)

    def sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()


# -- the checks -------------------------------------------------------------------------


def check_reshape_and_cache(c: Checker, dtype: torch.dtype, kv_cache_dtype: str) -> None:
    from impl.kernels.reshape_and_cache import cache_torch_dtype, reshape_and_cache
    from impl.kv_cache_tensors import (
        KVCacheLayout,
        KVCacheShape,
        allocate_kv_cache,
        plan_kv_cache_tensors,
    )

    tokens, heads, head, bs = (64, 2, 32, 16) if c.tiny else (16384, 8, 128, 16)
    num_blocks = 2 * tokens // bs + 1
    shape = KVCacheShape(bs, heads, head, cache_torch_dtype(kv_cache_dtype, dtype))
    plan = plan_kv_cache_tensors(["l"], num_blocks, shape, KVCacheLayout.LBNHC)
    cache = allocate_kv_cache(plan, num_blocks, shape, KVCacheLayout.LBNHC, c.device, 0.0)["l"]
    key = torch.randn(tokens, heads, head, device=c.device).to(dtype)
    value = torch.randn(tokens, heads, head, device=c.device).to(dtype)
    slots = torch.randperm(num_blocks * bs - bs, device=c.device)[:tokens] + bs
    slots[::97] = -1
    scale = torch.tensor([0.5], device=c.device)

    def run():
        reshape_and_cache(key, value, cache.key, cache.value, slots, kv_cache_dtype, scale, scale)

    row = Row("reshape_and_cache", f"{tokens} tok, {heads}x{head}, bs{bs} "
              f"{kv_cache_dtype}", str(dtype).removeprefix("torch."), against="indexing")
    run()
    c.sync()
    keep = slots >= 0
    want = key[keep]
    if kv_cache_dtype != "auto":
        from harness.attention.reference import quantize

        want = (quantize(want, kv_cache_dtype, 0.5) / 0.5).to(shape.dtype)
    got = cache.key[slots[keep] // bs, slots[keep] % bs]
    err = (got.double() - want.double()).abs().max().item()
    row.max_abs, row.worst_ratio = err, 0.0 if err == 0 else float("inf")
    row.result = "ok" if err == 0 else "FAIL"
    row.ms = timed_ms(run, c.device)
    moved = 2 * tokens * heads * head * (dtype.itemsize + shape.dtype.itemsize)
    c.add(row, moved)


def attention_cases(tiny: bool):
    from harness.attention.kernel_cases import AttentionCase

    if tiny:
        return [AttentionCase("decode", (1, 1), (40, 17), block_size=16),
                AttentionCase("mixed", (1, 9, 20), (33, 9, 50), block_size=16,
                              sliding_window=24)]
    h, hk, d = 32, 8, 128
    return [
        AttentionCase("decode 128x4096", (1,) * 128, (4096,) * 128, h, hk, d, 16),
        AttentionCase("decode 64x2048 win1024", (1,) * 64, (2048,) * 64, h, hk, d, 16,
                      sliding_window=1024),
        AttentionCase("prefill 8x2048", (2048,) * 8, (2048,) * 8, h, hk, d, 16),
        AttentionCase("chunked 4x(512 of 3072)+64 dec", (512,) * 4 + (1,) * 64,
                      (3072,) * 4 + (1500,) * 64, h, hk, d, 32),
    ]


def check_attention(c: Checker, case) -> None:
    from harness.attention.compare import error_stats
    from harness.attention.kernel_cases import build_case
    from harness.attention.reference import reference_attention
    from harness.attention.tolerances import tolerance
    from impl.kernels.unified_attention import unified_attention

    p = build_case(case, c.device)
    b = p.batch
    out = torch.full_like(p.query, float("nan"))
    dt = str(case.dtype).removeprefix("torch.")
    label = f"{case.name}, {case.num_heads}/{case.num_kv_heads}x{case.head_size}"

    def run():
        unified_attention(p.query, p.cache.key, p.cache.value, out, b.query_start_loc,
                          b.seq_lens, b.block_table, case.scale, case.sliding_window,
                          b.max_query_len)

    run()
    c.sync()
    tol = tolerance(case.dtype, "reference")
    ref = reference_attention(p.query, p.mirror, b, case.scale, case.sliding_window)
    s = error_stats(out, ref, tol)
    row = Row("unified_attention", label, dt, against="reference", max_abs=s.max_abs,
              worst_ratio=s.worst_ratio, result="ok" if s.ok else "FAIL")
    row.ms = timed_ms(run, c.device)
    kv_bytes, flops = _attention_work(case)
    c.add(row, kv_bytes, flops)

    dense = _dense_sdpa(p, case)
    s = error_stats(out, dense(torch.float32), tol)
    c.add(Row("unified_attention", label, dt, against="sdpa", max_abs=s.max_abs,
              worst_ratio=s.worst_ratio, result="ok" if s.ok else "FAIL"))
    row = Row("torch_sdpa (dense)", label, dt, result="timing")
    row.ms = timed_ms(lambda: dense(case.dtype), c.device)
    c.add(row, kv_bytes, flops)
    _vllm_triton(c, p, case, label, ref, kv_bytes, flops)


def _attention_work(case) -> tuple[int, float]:
    """Bytes a paged attention must move and its flops."""
    item = case.dtype.itemsize
    kv, flops = 0, 0.0
    for q, s in zip(case.query_lens, case.seq_lens):
        visible = min(s, case.sliding_window + q - 1) if case.sliding_window else s
        kv += 2 * visible * case.num_kv_heads * case.head_size * item
        # causal: query i sees context + i + 1 keys (capped by the window)
        pairs = sum(min(s - q + i + 1, case.sliding_window or s) for i in range(q))
        flops += 4.0 * pairs * case.head_size * case.num_heads
    qo = 2 * sum(case.query_lens) * case.num_heads * case.head_size * item
    return kv + qo, flops


def _dense_sdpa(p, case):
    """torch SDPA over each sequence's keys and values gathered densely (no
    paging): returns a function of the compute dtype giving the output."""
    import torch.nn.functional as F

    b = p.batch
    qsl, lens = b.query_start_loc.tolist(), b.seq_lens.tolist()
    seqs = []
    for i, s in enumerate(lens):
        q_len = qsl[i + 1] - qsl[i]
        pos = torch.arange(s, device=p.query.device)
        blocks = b.block_table[i].long()[pos // case.block_size]
        k = p.cache.key[blocks, pos % case.block_size]
        v = p.cache.value[blocks, pos % case.block_size]
        qp = torch.arange(s - q_len, s, device=pos.device)[:, None]
        mask = pos[None, :] <= qp
        if case.sliding_window:
            mask &= qp - pos[None, :] < case.sliding_window
        # Keys outside every window may be null blocks (NaN): zero them.
        seen = mask.any(0)
        k = torch.where(seen[:, None, None], k, 0)
        v = torch.where(seen[:, None, None], v, 0)
        seqs.append((qsl[i], qsl[i + 1], k, v, mask))

    def run(dtype):
        out = torch.empty(p.query.shape, dtype=dtype, device=p.query.device)
        for start, end, k, v, mask in seqs:
            q = p.query[start:end].to(dtype).transpose(0, 1)[None]
            o = F.scaled_dot_product_attention(
                q, k.to(dtype).transpose(0, 1)[None], v.to(dtype).transpose(0, 1)[None],
                attn_mask=mask[None, None], scale=case.scale, enable_gqa=True)
            out[start:end] = o[0].transpose(0, 1)
        return out

    return run


def _vllm_triton(c: Checker, p, case, label, ref, kv_bytes, flops) -> None:
    """vLLM's Triton unified attention on the same cache, where it imports."""
    if c.device != "cuda":
        return
    from harness.attention.compare import error_stats
    from harness.attention.tolerances import tolerance
    from harness.backends.vllm_triton_attention import vllm_unified_attention

    dt = str(case.dtype).removeprefix("torch.")
    out = torch.empty_like(p.query)

    def run():
        vllm_unified_attention(p.query, p.cache.key, p.cache.value, out, p.batch, case.scale,
                               case.sliding_window)

    try:
        run()
        c.sync()
    except Exception as e:  # not importable here, or its signature moved
        c.add(Row("vllm unified_attn", label, dt,
                  result=f"skipped ({type(e).__name__}: {str(e).splitlines()[0][:60]})"))
        return
    s = error_stats(out, ref, tolerance(case.dtype, "reference"))
    row = Row("vllm unified_attn", label, dt, against="reference", max_abs=s.max_abs,
              worst_ratio=s.worst_ratio, result="ok" if s.ok else "FAIL (vLLM's)")
    row.ms = timed_ms(run, c.device)
    c.add(row, kv_bytes, flops)


def check_copy_blocks(c: Checker, dtype: torch.dtype) -> None:
    from impl.kernels.copy_blocks import copy_blocks

    layers, blocks, bs, heads, head, pairs = (2, 16, 16, 2, 32, 4) if c.tiny else \
        (32, 4096, 16, 8, 128, 512)
    keys = [torch.randn(blocks, bs, heads, head, device=c.device).to(dtype)
            for _ in range(layers)]
    values = [torch.randn_like(k) for k in keys]
    perm = torch.randperm(blocks, device=c.device)
    mapping = torch.stack([perm[:pairs], perm[pairs:2 * pairs]], 1)
    want = [k[mapping[:, 0]].clone() for k in keys]
    copy_blocks(keys, values, mapping)
    c.sync()
    ok = all(torch.equal(k[mapping[:, 1]], w) for k, w in zip(keys, want))
    row = Row("copy_blocks", f"{layers} layers, {pairs} pairs, bs{bs} {heads}x{head}",
              str(dtype).removeprefix("torch."), against="indexing",
              max_abs=0.0 if ok else None, worst_ratio=0.0 if ok else None,
              result="ok" if ok else "FAIL")
    row.ms = timed_ms(lambda: copy_blocks(keys, values, mapping), c.device)
    c.add(row, 2 * 2 * layers * pairs * bs * heads * head * dtype.itemsize)


def check_swap_blocks(c: Checker, dtype: torch.dtype) -> None:
    from impl.kernels.swap_blocks import swap_blocks

    blocks, bs, heads, head, pairs = (16, 16, 2, 32, 4) if c.tiny else (2048, 16, 8, 128, 256)
    gpu = torch.randn(blocks, bs, heads, head, device=c.device).to(dtype)
    host = torch.zeros(blocks, bs, heads, head, dtype=dtype)
    mapping = torch.stack([torch.arange(pairs), torch.arange(pairs) + pairs], 1)
    swap_blocks(gpu, host, mapping)  # out
    back = torch.zeros_like(gpu)
    swap_blocks(host, back, torch.stack([mapping[:, 1], mapping[:, 0]], 1))  # in
    c.sync()
    ok = torch.equal(back[:pairs], gpu[:pairs]) and torch.equal(host[pairs:2 * pairs].to(c.device),
                                                                gpu[:pairs])
    row = Row("swap_blocks", f"{pairs} blocks out+in, bs{bs} {heads}x{head}",
              str(dtype).removeprefix("torch."), against="indexing",
              result="ok" if ok else "FAIL")

    def run():
        swap_blocks(gpu, host, mapping)
        swap_blocks(host, back, torch.stack([mapping[:, 1], mapping[:, 0]], 1))

    row.ms = timed_ms(run, c.device)
    c.add(row, 2 * 2 * pairs * bs * heads * head * dtype.itemsize)


def run_pytest_gpu() -> bool:
    env = dict(os.environ, TRITON_INTERPRET="0")
    print("pytest -m gpu tests/impl/kernels (compiled kernels)", flush=True)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu",
                        "tests/impl/kernels"], cwd=ROOT, env=env, timeout=240)
    return r.returncode in (0, 5)  # 5: nothing collected


def main() -> int:
    args = ARGS
    if args.device == "cuda" and not torch.cuda.is_available():
        print("kvconform gpu-check: no CUDA GPU here; nothing to check (not required by CI)")
        return 0
    import triton

    t0 = time.perf_counter()
    torch.manual_seed(0)
    pytest_ok = True if (args.no_pytest or args.device != "cuda") else run_pytest_gpu()
    c = Checker(args.device, args.tiny)
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu (interpreter)"
    print(f"kvconform gpu-check: {name}, torch {torch.__version__}, triton "
          f"{triton.__version__}; copy bandwidth {c.copy_gbps:.1f} GB/s")
    print(f"{'kernel':<20} {'case':<34} {'dtype':<9} {'ms':>8} {'GB/s':>8} {'%copy':>6} "
          f"{'TFLOP/s':>7}  {'err vs':<10} {'max_abs':>10} {'worst/tol':>9}  result")
    dtypes = [torch.bfloat16] if args.tiny else [torch.bfloat16, torch.float16, torch.float32]
    for dt in dtypes:
        check_reshape_and_cache(c, dt, "auto")
    check_reshape_and_cache(c, torch.bfloat16, "fp8")
    for dt in dtypes:
        for case in attention_cases(args.tiny):
            check_attention(c, _with_dtype(case, dt))
    check_copy_blocks(c, torch.bfloat16)
    check_swap_blocks(c, torch.bfloat16)
    failed = sum(r.result.startswith("FAIL") and "vLLM's" not in r.result for r in c.rows)
    skipped = sum(r.result.startswith("skipped") for r in c.rows)
    if not pytest_ok:
        failed += 1
        print("pytest -m gpu: FAILED")
    print(f"{len(c.rows)} checks, {failed} failed, {skipped} skipped; "
          f"{time.perf_counter() - t0:.1f} s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"device": name, "copy_gbps": c.copy_gbps,
                       "rows": [asdict(r) for r in c.rows]}, f, indent=1)
    return 1 if failed else 0


def _with_dtype(case, dtype):
    from dataclasses import replace

    return replace(case, dtype=dtype)


if __name__ == "__main__":
    sys.exit(main())
