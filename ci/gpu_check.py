#!/usr/bin/env python3
"""make gpu-check: impl's Triton kernels against vLLM's own Triton kernels on a
CUDA GPU, the same inputs for both: error against float64 and time per call.

vLLM need not be installed: `make gpu-check` first copies vLLM's Triton
attention kernels out of the installed vLLM into .gpu-check/vllm_kernels
(ci/vllm_triton_bundle.py, well under 1 MiB), and this script imports them
from there (--vllm-kernels). On a GPU machine without vLLM, with the bundle
carried along:

    python3 ci/gpu_check.py --vllm-kernels .gpu-check/vllm_kernels

Without a GPU, `make gpu-check DRY=1` runs the same script on the CPU under
the Triton interpreter at toy sizes (--device cpu --tiny): the interpreter
computes bf16 wrongly, so the dry run's "bf16" cases compute in float32, and
it truncates fp32 -> fp8 casts, so vLLM's fp8 cache write is compared there
within one fp8 step; vLLM's reshape asks torch.cuda for the device's
capability, which the dry run answers as a Hopper GPU (9.0).

Checks, one row each, for impl and for vLLM:
- attention, decode (batches of B sequences of L tokens, one query each) and
  prefill (whole sequences of L tokens), L = 1k, 4k, 16k, 32k, bf16 with a
  bf16 and with an fp8 (e4m3, per-tensor scales) KV cache; both kernels read
  the same cache (written by impl's reshape_and_cache, checked against the
  mirror); the error against the float64 reference with the error model's
  allowance (specs/ATTENTION.md) on every decode row and on the last 256
  queries of every prefill sequence;
- reshape_and_cache: impl's and vLLM's writes of the same tokens compared
  byte for byte (max_abs: their largest difference), and timed;
- copy_blocks and swap_blocks (impl only; exact), and `pytest -m gpu`.

Columns: kernel, op, case, kv (cache dtype), ms (median of timed runs after
warm-ups, CUDA events), GB/s (bytes the kernel must move: keys and values read
once, queries read, outputs written), %copy (of a measured device-to-device
copy: the roofline of a memory-bound decode), TFLOP/s, max_abs (against
float64), worst/allowed (<= 1 passes), result (ok, FAIL, FAIL (vLLM's): vLLM
out of its allowance, reported and not counted). A last line:
`<N> checks, <F> failed; <T> s`. Exit 0 when every check of impl passed, 1
otherwise, 3 when vLLM's kernels do not import (no bundle, no vLLM).
`--json PATH` also writes the rows. Sized to finish in under 10 minutes on
one H100/H200-class GPU.
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


def _parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--tiny", action="store_true", help="toy sizes (the CPU dry run)")
    p.add_argument("--json", help="also write the rows here")
    p.add_argument("--vllm-kernels", metavar="DIR",
                   help="the bundle of vLLM's Triton kernels (ci/vllm_triton_bundle.py)")
    p.add_argument("--no-pytest", action="store_true", help="skip the pytest -m gpu run")
    return p.parse_args(argv)


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None:
    # Compiled kernels on the GPU; the interpreter for the CPU dry run. Must
    # be chosen before any kernel module is imported; the bundle must come
    # first on the path, before anything imports vllm.
    os.environ["TRITON_INTERPRET"] = "1" if ARGS.device == "cpu" else "0"
    if ARGS.vllm_kernels:
        sys.path.insert(0, os.path.abspath(ARGS.vllm_kernels))
    sys.path.insert(1 if ARGS.vllm_kernels else 0, ROOT)

import torch  # noqa: E402

from harness.core.exit_codes import ExitCode  # noqa: E402

BYTES_TOKENS = 1 << 18  # decode: sequences x length held constant (256k tokens)
PREFILL_ROWS_CHECKED = 256


@dataclass(slots=True)
class Row:
    kernel: str  # impl | vllm
    op: str
    case: str
    kv: str
    ms: float | None = None
    gbps: float | None = None
    pct_copy: float | None = None
    tflops: float | None = None
    max_abs: float | None = None
    worst_ratio: float | None = None
    result: str = "ok"


HEADER = (f"{'kernel':<6} {'op':<18} {'case':<28} {'kv':<9} {'ms':>8} {'GB/s':>8} "
          f"{'%copy':>6} {'TFLOP/s':>7} {'max_abs':>10} {'worst/allowed':>13}  result")


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_row(r: Row) -> None:
    print(f"{r.kernel:<6} {r.op:<18} {r.case:<28} {r.kv:<9} {_fmt(r.ms, '.3f'):>8} "
          f"{_fmt(r.gbps, '.1f'):>8} {_fmt(r.pct_copy, '.1f'):>6} {_fmt(r.tflops, '.1f'):>7} "
          f"{_fmt(r.max_abs, '.3e'):>10} {_fmt(r.worst_ratio, '.2f'):>13}  {r.result}",
          flush=True)


def timed_ms(fn, device: str, warmup: int = 2, iters: int = 10) -> float:
    if device != "cuda":  # the interpreter: one run, no warm-up (nothing to compile)
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    for _ in range(warmup):
        fn()
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


# -- attention: impl and vLLM on the same cache ----------------------------------------


@dataclass(frozen=True, slots=True)
class Shape:
    mode: str  # decode | prefill
    num_seqs: int
    length: int
    num_heads: int = 32
    num_kv_heads: int = 8
    head_size: int = 128
    block_size: int = 16

    @property
    def name(self) -> str:
        k = f"{self.length // 1024}k" if self.length >= 1024 else str(self.length)
        return f"{self.mode} {self.num_seqs}x{k} {self.num_heads}/{self.num_kv_heads}x" \
               f"{self.head_size}"


def shapes(tiny: bool) -> list[Shape]:
    if tiny:
        small = dict(num_heads=4, num_kv_heads=2, head_size=32)
        return [Shape("decode", 3, 200, **small), Shape("prefill", 2, 40, **small)]
    out = []
    for length in (1024, 4096, 16384, 32768):
        out.append(Shape("decode", BYTES_TOKENS // length, length))
        out.append(Shape("prefill", max(1, 16384 // length), length))
    return out


def _case(shape: Shape, dtype, kv: str):
    from harness.attention.kernel_cases import AttentionCase

    q = 1 if shape.mode == "decode" else shape.length
    return AttentionCase(shape.name, (q,) * shape.num_seqs, (shape.length,) * shape.num_seqs,
                         shape.num_heads, shape.num_kv_heads, shape.head_size,
                         shape.block_size, dtype, kv_cache_dtype=kv, spare_blocks=0)


def _work(shape: Shape, case) -> tuple[int, float]:
    """Bytes an attention call must move (keys and values read once, queries
    read, outputs written), and its flops (4 x query-key pairs x head size x
    heads; a prefill's queries see half the sequence on average)."""
    kv_item = 1 if case.kv_cache_dtype != "auto" else case.dtype.itemsize
    queries = sum(case.query_lens)
    kv = 2 * shape.num_seqs * shape.length * shape.num_kv_heads * shape.head_size * kv_item
    qo = 2 * queries * shape.num_heads * shape.head_size * case.dtype.itemsize
    per_seq = shape.length if shape.mode == "decode" else shape.length * (shape.length + 1) / 2
    return kv + qo, 4.0 * shape.num_seqs * per_seq * shape.head_size * shape.num_heads


def _kv_label(dtype, kv: str) -> str:
    from harness.attention.tolerances import dtype_name

    return dtype_name(dtype) if kv == "auto" else "fp8_e4m3"


def _checked_rows(p, shape: Shape):
    """(row index, sub-batch) of the queries compared with float64: every
    decode query; the last PREFILL_ROWS_CHECKED of every prefill sequence."""
    from impl.attention_batch import AttentionBatch

    b = p.batch
    if shape.mode == "decode":
        return torch.arange(p.query.shape[0]), b
    keep = min(PREFILL_ROWS_CHECKED, shape.length)
    qsl = b.query_start_loc.cpu()
    rows = torch.cat([torch.arange(int(qsl[i + 1]) - keep, int(qsl[i + 1]))
                      for i in range(shape.num_seqs)])
    sub_qsl = torch.arange(shape.num_seqs + 1, dtype=torch.int32) * keep
    sub = AttentionBatch(sub_qsl.to(b.seq_lens.device), b.seq_lens, b.block_table,
                         b.slot_mapping, keep, b.max_seq_len)
    return rows, sub


def check_attention_pair(c: Checker, shape: Shape, dtype, kv: str, vllm_attn) -> None:
    from harness.attention.compare import error_stats
    from harness.attention.kernel_cases import build_case
    from harness.attention.kinds import AttentionKind
    from harness.attention.reference import reference
    from harness.attention.tolerances import allowed, impl_path
    from impl.kernels.reshape_and_cache import reshape_and_cache
    from impl.kernels.unified_attention import unified_attention

    case = _case(shape, dtype, kv)
    p = build_case(case, c.device, write_new=False)
    b = p.batch
    reshape_and_cache(p.new_key, p.new_value, p.cache.key, p.cache.value, b.slot_mapping, kv,
                      p.k_scale, p.v_scale)
    rows, sub = _checked_rows(p, shape)
    ref = reference(p.query[rows.to(c.device)], p.mirror, sub, case.scale)
    nbytes, flops = _work(shape, case)
    kv_label = _kv_label(dtype, kv)
    label = shape.name
    kind = AttentionKind()

    def impl_call(out):
        unified_attention(p.query, p.cache.key, p.cache.value, out, b.query_start_loc,
                          b.seq_lens, b.block_table, case.scale, None, b.max_query_len, kv,
                          p.k_scale, p.v_scale)

    def vllm_call(out):
        vllm_attn(p.query, p.cache.key, p.cache.value, out, b, case.scale, kind, kv,
                  p.k_scale, p.v_scale)

    for name, call, path in (("impl", impl_call, impl_path()),
                             ("vllm", vllm_call, "vllm_triton")):
        row = Row(name, "attention", label, kv_label)
        out = torch.full_like(p.query, float("nan"))
        try:
            call(out)
            c.sync()
        except Exception as e:  # vLLM's kernel refusing a shape: reported, not hidden
            row.result = f"FAIL ({type(e).__name__}: {str(e).splitlines()[0][:60]})"
            if name == "vllm":
                row.result = row.result.replace("FAIL", "FAIL (vLLM's)", 1)
            c.add(row)
            continue
        s = error_stats(out[rows.to(c.device)], ref.out,
                        allowed(ref, dtype, path, kv_cache_dtype=kv))
        row.max_abs, row.worst_ratio = s.max_abs, s.worst_ratio
        row.result = "ok" if s.ok else ("FAIL" if name == "impl" else "FAIL (vLLM's)")
        row.ms = timed_ms(lambda call=call, out=out: call(out), c.device)
        c.add(row, nbytes, flops)


def check_reshape_pair(c: Checker, tokens: int, dtype, kv: str, vllm_reshape) -> None:
    from impl.kernels.reshape_and_cache import cache_torch_dtype, reshape_and_cache
    from impl.kv_cache_tensors import (
        KVCacheLayout,
        KVCacheShape,
        allocate_kv_cache,
        plan_kv_cache_tensors,
    )

    heads, head, bs = (2, 32, 16) if c.tiny else (8, 128, 16)
    num_blocks = 2 * tokens // bs + 1
    shape = KVCacheShape(bs, heads, head, cache_torch_dtype(kv, dtype))
    caches = []
    for _ in range(2):
        plan = plan_kv_cache_tensors(["l"], num_blocks, shape, KVCacheLayout.LBNHC)
        caches.append(allocate_kv_cache(plan, num_blocks, shape, KVCacheLayout.LBNHC,
                                        c.device, 0.0)["l"])
    key = torch.randn(tokens, heads, head, device=c.device).to(dtype)
    value = torch.randn(tokens, heads, head, device=c.device).to(dtype)
    slots = torch.randperm(num_blocks * bs - bs, device=c.device)[:tokens] + bs
    slots[::97] = -1
    scale = torch.tensor([0.5], device=c.device)
    kv_label = _kv_label(dtype, kv)
    calls = {
        "impl": lambda cache: reshape_and_cache(key, value, cache.key, cache.value, slots, kv,
                                                scale, scale),
        "vllm": lambda cache: vllm_reshape(key, value, cache.key, cache.value, slots, kv,
                                           scale, scale),
    }
    for name, cache in zip(calls, caches):
        calls[name](cache)
    c.sync()
    keep = slots >= 0
    mine = caches[0].key[slots[keep] // bs, slots[keep] % bs].float()
    theirs = caches[1].key[slots[keep] // bs, slots[keep] % bs].float()
    diff = (mine - theirs).abs().max().item()
    # The interpreter truncates fp32 -> fp8 casts inside vLLM's kernel (impl
    # rounds explicitly): one fp8 step (relative 2^-3) is what it may cost there.
    step = (mine.abs() * 2.0 ** -3).max().item() if (kv != "auto" and c.device == "cpu") else 0
    moved = 2 * int(keep.sum()) * heads * head * (dtype.itemsize + shape.dtype.itemsize)
    for name, cache in zip(calls, caches):
        row = Row(name, "reshape_and_cache", f"{tokens} tokens, {heads}x{head}, bs{bs}",
                  kv_label, max_abs=diff, worst_ratio=None)
        row.result = "ok" if diff <= step else ("FAIL" if name == "impl" else "FAIL (vLLM's)")
        row.ms = timed_ms(lambda f=calls[name], cache=cache: f(cache), c.device)
        c.add(row, moved)


def check_copy_blocks(c: Checker, dtype) -> None:
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
    row = Row("impl", "copy_blocks", f"{layers} layers, {pairs} pairs", _kv_label(dtype, "auto"),
              max_abs=0.0 if ok else None, result="ok" if ok else "FAIL")
    row.ms = timed_ms(lambda: copy_blocks(keys, values, mapping), c.device)
    c.add(row, 2 * 2 * layers * pairs * bs * heads * head * dtype.itemsize)


def check_swap_blocks(c: Checker, dtype) -> None:
    from impl.kernels.swap_blocks import swap_blocks

    blocks, bs, heads, head, pairs = (16, 16, 2, 32, 4) if c.tiny else (2048, 16, 8, 128, 256)
    gpu = torch.randn(blocks, bs, heads, head, device=c.device).to(dtype)
    host = torch.zeros(blocks, bs, heads, head, dtype=dtype)
    mapping = torch.stack([torch.arange(pairs), torch.arange(pairs) + pairs], 1)
    back_map = torch.stack([mapping[:, 1], mapping[:, 0]], 1)
    swap_blocks(gpu, host, mapping)
    back = torch.zeros_like(gpu)
    swap_blocks(host, back, back_map)
    c.sync()
    ok = torch.equal(back[:pairs], gpu[:pairs])
    row = Row("impl", "swap_blocks", f"{pairs} blocks out+in", _kv_label(dtype, "auto"),
              max_abs=0.0 if ok else None, result="ok" if ok else "FAIL")

    def run():
        swap_blocks(gpu, host, mapping)
        swap_blocks(host, back, back_map)

    row.ms = timed_ms(run, c.device)
    c.add(row, 2 * 2 * pairs * bs * heads * head * dtype.itemsize)


def run_pytest_gpu() -> bool:
    env = dict(os.environ, TRITON_INTERPRET="0")
    print("pytest -m gpu tests/impl/kernels (compiled kernels)", flush=True)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "-m", "gpu", "tests/impl/kernels/test_kernels_gpu.py"],
                       cwd=ROOT, env=env, timeout=300)
    return r.returncode in (0, 5)  # 5: nothing collected


def _vllm_kernels(args, device: str):
    """vLLM's kernels (from the bundle when given), or the reason they are missing."""
    from harness.backends.vllm_cpu_attention import VllmUnavailable
    from harness.backends.vllm_triton_attention import VllmTritonAttention, vllm_reshape_and_cache

    try:
        import vllm

        where = os.path.dirname(vllm.__file__)
        if args.vllm_kernels and not where.startswith(os.path.abspath(args.vllm_kernels)):
            return None, None, f"vllm imports from {where}, not from the bundle"
        cache: dict = {}

        def attention(q, k, v, out, batch, scale, kind, kv, k_scale, v_scale):
            key = (q.shape[1], k.shape[2], q.shape[2])
            if key not in cache:
                cache[key] = VllmTritonAttention(*key, device)
            return cache[key].forward(q, k, v, out, batch, scale, kind, kv, k_scale, v_scale)

        attention(*_probe(device))  # imports the kernels now: fail here, not mid-table
        return attention, vllm_reshape_and_cache, where
    except VllmUnavailable as e:
        return None, None, str(e)


def _probe(device: str):
    from harness.attention.kernel_cases import AttentionCase, build_case
    from harness.attention.kinds import AttentionKind

    case = AttentionCase("probe", (1,), (1,), dtype=torch.float32)
    p = build_case(case, device)
    return (p.query, p.cache.key, p.cache.value, torch.empty_like(p.query), p.batch,
            case.scale, AttentionKind(), "auto", None, None)


def main(args=None) -> int:
    args = args or ARGS
    if args.device == "cuda" and not torch.cuda.is_available():
        print("kvconform gpu-check: no CUDA GPU here (make gpu-check DRY=1 runs the "
              "interpreted dry run); nothing to check")
        return ExitCode.OK
    if args.device == "cpu":
        # vLLM's reshape asks torch.cuda which GPU generation it runs on.
        torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    import triton

    t0 = time.perf_counter()
    torch.manual_seed(0)
    pytest_ok = True if (args.no_pytest or args.device != "cuda") else run_pytest_gpu()
    c = Checker(args.device, args.tiny)
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu (interpreter)"
    attention, reshape, where = _vllm_kernels(args, args.device)
    print(f"kvconform gpu-check: {name}, torch {torch.__version__}, triton "
          f"{triton.__version__}; copy bandwidth {c.copy_gbps:.1f} GB/s; vLLM's kernels: "
          f"{where if attention else 'UNAVAILABLE: ' + where}", flush=True)
    if attention is None:
        return ExitCode.ENVIRONMENT
    print(HEADER, flush=True)
    # bf16 is what the interpreter cannot compute: the dry run uses float32.
    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    for kv in ("auto", "fp8"):
        check_reshape_pair(c, 64 if args.tiny else 16384, dtype, kv, reshape)
    for shape in shapes(args.tiny):
        for kv in ("auto", "fp8"):
            check_attention_pair(c, shape, dtype, kv, attention)
            if args.device == "cuda":
                torch.cuda.empty_cache()
    check_copy_blocks(c, dtype)
    check_swap_blocks(c, dtype)
    failed = sum(r.result.startswith("FAIL") and "vLLM's" not in r.result for r in c.rows)
    if not pytest_ok:
        failed += 1
        print("pytest -m gpu: FAILED")
    print(f"{len(c.rows)} checks, {failed} failed; {time.perf_counter() - t0:.1f} s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"device": name, "copy_gbps": c.copy_gbps, "vllm_kernels": where,
                       "rows": [asdict(r) for r in c.rows]}, f, indent=1)
    return ExitCode.DIVERGED if failed else ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
