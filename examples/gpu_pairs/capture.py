"""Capture single-GPU training pairs on one NVIDIA GPU with plain ``torch.profiler``.

Each configuration is one real training job (a GPT-style decoder, or a tiny one that is
launch-bound, or an FP32 one), profiled the way a user would: ``record_shapes=True``, the
default schedule markers (``ProfilerStep#N``), and ``with_stack=True`` only where the what-if
needs Python frames (activation checkpointing). No retime records are written into the traces.
Pairs differ in one knob: activation checkpointing, per-GPU batch, CUDA graphs, TF32.

Run on the GPU machine:  python examples/gpu_pairs/capture.py OUTDIR [--only NAME,...]
(batch G1: no --only; batch G2: --only with the big-* and fp32big-* names; batch G3: --only
with its names and --micro-g3)
Writes OUTDIR/<config>/rep<k>.pt.trace.json.gz, OUTDIR/job.json (settings, GPU, torch, the
unprofiled per-step times) and OUTDIR/micro.json (GEMM / attention / copy microbenchmarks).
"""
# ruff: noqa: B023  (each closure is timed by bench() in the iteration that defines it)
from __future__ import annotations

import gzip
import json
import os
import shutil
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).permute(
            2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class LlamaBlock(nn.Module):
    """RMSNorm, grouped-query attention (kv heads = heads / 4), SwiGLU MLP, no biases."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads, self.kv = heads, heads // 4
        hd = d // heads
        self.n1, self.n2 = nn.RMSNorm(d), nn.RMSNorm(d)
        self.q = nn.Linear(d, d, bias=False)
        self.kvp = nn.Linear(d, 2 * self.kv * hd, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        ff = int(8 * d / 3 / 256 + 1) * 256
        self.gu = nn.Linear(d, 2 * ff, bias=False)
        self.down = nn.Linear(ff, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        hd = d // self.heads
        h = self.n1(x)
        q = self.q(h).view(b, s, self.heads, hd).transpose(1, 2)
        k, v = self.kvp(h).view(b, s, 2, self.kv, hd).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, d))
        g, u = self.gu(self.n2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u)


class GPT(nn.Module):
    def __init__(self, layers: int, d: int, heads: int, vocab: int, seq: int,
                 ckpt: bool, llama: bool = False) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        blk = LlamaBlock if llama else Block
        self.blocks = nn.ModuleList(blk(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.ckpt = ckpt

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = checkpoint(blk, x, use_reentrant=False) if self.ckpt else blk(x)
        return self.head(self.ln(x))


MODELS = {
    # name: layers, d_model, heads, vocab, seq
    "gpt": (8, 1024, 16, 32768, 1024),
    "tiny": (4, 256, 4, 8192, 128),
    "fp32": (4, 1024, 16, 32768, 512),
    # batch G2: GPU-bound under the profiler (GPU work per step well above the host's)
    "big": (8, 2048, 16, 32768, 1024),
    "fp32big": (4, 2048, 16, 32768, 1024),
    # batch G3 (held-out test of FREEZE-11): another sequence length, an FP32 model of other shapes
    "bigs512": (8, 2048, 16, 32768, 512),
    "fp32mid": (6, 1536, 12, 32768, 512),
    "fp32wide": (4, 3072, 24, 32768, 512),
    "fp32deep": (8, 1024, 16, 32768, 2048),
    # batch G4 (more held-out pairs for FREEZE-11): a Llama-style decoder, and ResNet-50
    "llama": (8, 2048, 16, 32000, 1024),
    "resnet50": (0, 0, 0, 1000, 224),
    # batch G5 (held-out test of FREEZE-12: launches blocked on a full queue)
    "fp32g5": (6, 2560, 20, 32768, 512),
}

# name: model, batch, checkpointing, cuda graph, dtype ("bf16" autocast | "fp32"), tf32, stack
CONFIGS = {
    "gpt-b8": ("gpt", 8, False, False, "bf16", False, True),
    "gpt-b8-ckpt": ("gpt", 8, True, False, "bf16", False, True),
    "gpt-b16": ("gpt", 16, False, False, "bf16", False, False),
    "gpt-b2": ("gpt", 2, False, False, "bf16", False, False),
    "gpt-b8-nostack": ("gpt", 8, False, False, "bf16", False, False),
    "gpt-b8-graph": ("gpt", 8, False, True, "bf16", False, False),
    "tiny-eager": ("tiny", 4, False, False, "bf16", False, False),
    "tiny-graph": ("tiny", 4, False, True, "bf16", False, False),
    "fp32-notf32": ("fp32", 4, False, False, "fp32", False, False),
    "fp32-tf32": ("fp32", 4, False, False, "fp32", True, False),
    "big-b8": ("big", 8, False, False, "bf16", False, True),
    "big-b8-ckpt": ("big", 8, True, False, "bf16", False, True),
    "big-b8-nostack": ("big", 8, False, False, "bf16", False, False),
    "big-b16": ("big", 16, False, False, "bf16", False, False),
    "big-b4": ("big", 4, False, False, "bf16", False, False),
    "big-b2": ("big", 2, False, False, "bf16", False, False),
    "big-b8-graph": ("big", 8, False, True, "bf16", False, False),
    "fp32big-notf32": ("fp32big", 8, False, False, "fp32", False, False),
    "fp32big-tf32": ("fp32big", 8, False, False, "fp32", True, False),
    "big-s512-b8": ("bigs512", 8, False, False, "bf16", False, False),
    "big-s512-b16": ("bigs512", 16, False, False, "bf16", False, False),
    "big-s512-b8-stack": ("bigs512", 8, False, False, "bf16", False, True),
    "big-s512-b8-ckpt": ("bigs512", 8, True, False, "bf16", False, True),
    "big-b12": ("big", 12, False, False, "bf16", False, False),
    "big-b32": ("big", 32, False, False, "bf16", False, False),
    "fp32big-b16": ("fp32big", 16, False, False, "fp32", False, False),
    "fp32mid-notf32": ("fp32mid", 8, False, False, "fp32", False, False),
    "fp32mid-tf32": ("fp32mid", 8, False, False, "fp32", True, False),
    "fp32wide-notf32": ("fp32wide", 8, False, False, "fp32", False, False),
    "fp32wide-tf32": ("fp32wide", 8, False, False, "fp32", True, False),
    "fp32deep-notf32": ("fp32deep", 4, False, False, "fp32", False, False),
    "fp32deep-tf32": ("fp32deep", 4, False, False, "fp32", True, False),
    "llama-b4": ("llama", 4, False, False, "bf16", False, False),
    "llama-b8": ("llama", 8, False, False, "bf16", False, False),
    "llama-b4-stack": ("llama", 4, False, False, "bf16", False, True),
    "llama-b4-ckpt": ("llama", 4, True, False, "bf16", False, True),
    "r50-b64": ("resnet50", 64, False, False, "bf16", False, False),
    "r50-b128": ("resnet50", 128, False, False, "bf16", False, False),
    "r50-b64-graph": ("resnet50", 64, False, True, "bf16", False, False),
    "r50fp32-notf32": ("resnet50", 64, False, False, "fp32", False, False),
    "r50fp32-tf32": ("resnet50", 64, False, False, "fp32", True, False),
    "fp32g5-notf32": ("fp32g5", 8, False, False, "fp32", False, False),
    "fp32g5-tf32": ("fp32g5", 8, False, False, "fp32", True, False),
    "big-s512-b32": ("bigs512", 32, False, False, "bf16", False, False),
    "llamafp32-notf32": ("llama", 4, False, False, "fp32", False, False),
    "llamafp32-tf32": ("llama", 4, False, False, "fp32", True, False),
}


def run_config(name: str, out: str, reps: int, active: int) -> dict:
    mname, batch, ckpt, graph, dtype, tf32, stack = CONFIGS[name]
    layers, d, heads, vocab, seq = MODELS[mname]
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.manual_seed(0)
    dev = "cuda"
    if mname == "resnet50":
        import torchvision
        model = torchvision.models.resnet50().to(dev)
        idx = torch.randn(batch, 3, seq, seq, device=dev)
        tgt = torch.randint(0, vocab, (batch,), device=dev)
    else:
        model = GPT(layers, d, heads, vocab, seq, ckpt, llama=mname == "llama").to(dev)
        idx = torch.randint(0, vocab, (batch, seq), device=dev)
        tgt = torch.randint(0, vocab, (batch, seq), device=dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True, capturable=True)
    amp = dtype == "bf16"

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp, cache_enabled=False):
            logits = model(idx)
            loss = F.cross_entropy(logits.view(-1, vocab).float(), tgt.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=not graph)

    run = step
    if graph:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        run = g.replay
    for _ in range(5):
        run()
    torch.cuda.synchronize()
    # unprofiled step times (CUDA events around each step)
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(11)]
    ev[0].record()
    for i in range(10):
        run()
        ev[i + 1].record()
    torch.cuda.synchronize()
    plain_ms = [ev[i].elapsed_time(ev[i + 1]) for i in range(10)]
    os.makedirs(os.path.join(out, name), exist_ok=True)
    files = []
    for r in range(reps):
        sched = torch.profiler.schedule(wait=1, warmup=1, active=active, repeat=1)
        with torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU,
                            torch.profiler.ProfilerActivity.CUDA],
                schedule=sched, record_shapes=True, with_stack=stack) as prof:
            for _ in range(2 + active):
                run()
                prof.step()
        torch.cuda.synchronize()
        raw = os.path.join(out, name, f"rep{r + 1}.pt.trace.json")
        prof.export_chrome_trace(raw)
        with open(raw, "rb") as fi, gzip.open(raw + ".gz", "wb", compresslevel=6) as fo:
            shutil.copyfileobj(fi, fo)
        os.remove(raw)
        files.append(f"{name}/rep{r + 1}.pt.trace.json.gz")
    mem = torch.cuda.max_memory_allocated() / 2**30
    torch.cuda.reset_peak_memory_stats()
    model = opt = None  # free before the next configuration
    torch.cuda.empty_cache()
    info = {"model": mname, "layers": layers, "d_model": d, "heads": heads, "vocab": vocab,
            "seq": seq, "batch": batch, "checkpointing": ckpt, "cuda_graph": graph,
            "dtype": dtype, "allow_tf32": tf32, "with_stack": stack, "record_shapes": True,
            "optimizer": "AdamW(foreach, capturable)", "active_steps": active,
            "unprofiled_step_ms": plain_ms, "peak_mem_gib": mem, "files": files}
    med = sorted(plain_ms)[5]
    log(f"{name}: unprofiled median {med:.2f} ms, peak {mem:.1f} GiB, {len(files)} trace(s)")
    return info


def bench(fn, n: int = 20) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / n * 1e3  # us


def micro() -> dict:
    rows = []
    for dt, tn in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
        torch.backends.cuda.matmul.allow_tf32 = False
        for (m, n, k) in ((256, 256, 256), (1024, 1024, 1024), (2048, 2048, 2048),
                          (4096, 4096, 4096), (8192, 8192, 8192), (8192, 1024, 4096),
                          (16384, 4096, 1024), (2048, 8192, 1024), (64, 4096, 4096),
                          (8192, 32768, 1024)):
            if tn == "fp32" and m * n * k > 4096 ** 3:
                continue
            a = torch.randn(m, k, device="cuda", dtype=dt)
            b = torch.randn(k, n, device="cuda", dtype=dt)
            us = bench(lambda: a @ b)
            rows.append({"kind": "matmul", "m": m, "n": n, "k": k, "dtype": tn, "time_us": us,
                         "tflops": 2 * m * n * k / us / 1e6})
    for (bsz, h, s, hd) in ((8, 16, 1024, 64), (2, 16, 4096, 128), (16, 32, 512, 128)):
        q, k, v = (torch.randn(bsz, h, s, hd, device="cuda", dtype=torch.bfloat16,
                               requires_grad=True) for _ in range(3))
        fwd = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        go = torch.randn_like(o)
        fb = bench(lambda: torch.autograd.grad(
            F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v), go))
        rows.append({"kind": "attention", "batch": bsz, "heads": h, "seq": s, "head_dim": hd,
                     "causal": True, "dtype": "bf16", "fwd_us": fwd, "fwd_bwd_us": fb})
    x = torch.empty(2**30 // 2, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    us = bench(lambda: y.copy_(x))
    rows.append({"kind": "copy", "bytes": 2 * x.numel() * 2, "time_us": us,
                 "gbps": 2 * x.numel() * 2 / us / 1e3})
    return {"rows": rows}


def micro_g3() -> dict:
    """Batch G3's held-out kernel rows: shapes no earlier row or trace had."""
    rows = []
    torch.backends.cuda.matmul.allow_tf32 = False
    for dt, tn, shapes in ((torch.bfloat16, "bf16", ((4096, 14336, 4096), (1024, 8192, 28672),
                                                     (3072, 3072, 3072), (512, 512, 8192),
                                                     (16384, 16384, 2048), (128, 8192, 8192))),
                           (torch.float32, "fp32", ((3072, 3072, 3072), (4096, 1024, 4096),
                                                    (512, 4096, 2048)))):
        for (m, n, k) in shapes:
            a = torch.randn(m, k, device="cuda", dtype=dt)
            b = torch.randn(k, n, device="cuda", dtype=dt)
            us = bench(lambda: a @ b)
            rows.append({"kind": "matmul", "m": m, "n": n, "k": k, "dtype": tn, "time_us": us,
                         "tflops": 2 * m * n * k / us / 1e6})
    att = ((4, 16, 16, 2048, 128, True, torch.bfloat16), (1, 16, 16, 8192, 128, True, torch.bfloat16),
           (8, 32, 32, 1024, 64, False, torch.bfloat16), (2, 32, 32, 4096, 64, True, torch.bfloat16),
           (4, 16, 16, 2048, 96, True, torch.bfloat16), (16, 16, 16, 256, 128, True, torch.bfloat16),
           (2, 32, 8, 4096, 128, True, torch.bfloat16), (1, 16, 16, 16384, 128, False, torch.bfloat16),
           (8, 16, 16, 1024, 128, True, torch.float16), (2, 16, 16, 1536, 128, True, torch.bfloat16))
    for (bsz, h, hkv, s_, hd, causal, dt) in att:
        q = torch.randn(bsz, h, s_, hd, device="cuda", dtype=dt, requires_grad=True)
        k, v = (torch.randn(bsz, hkv, s_, hd, device="cuda", dtype=dt, requires_grad=True)
                for _ in range(2))
        kw = {"is_causal": causal, "enable_gqa": hkv != h}
        fwd = bench(lambda: F.scaled_dot_product_attention(q, k, v, **kw))
        go = torch.randn_like(F.scaled_dot_product_attention(q, k, v, **kw))
        fb = bench(lambda: torch.autograd.grad(
            F.scaled_dot_product_attention(q, k, v, **kw), (q, k, v), go))
        rows.append({"kind": "attention", "batch": bsz, "heads": h, "kv_heads": hkv, "seq": s_,
                     "head_dim": hd, "causal": causal, "dtype": str(dt).split(".")[-1],
                     "fwd_us": fwd, "fwd_bwd_us": fb})
    x = torch.randn(8192, 8192, device="cuda")
    y = torch.randn(8192, 8192, device="cuda")
    rows.append({"kind": "add", "shape": [8192, 8192], "dtype": "fp32",
                 "time_us": bench(lambda: x + y)})
    g = torch.randn(16384, 8192, device="cuda", dtype=torch.bfloat16)
    rows.append({"kind": "gelu", "shape": [16384, 8192], "dtype": "bf16",
                 "time_us": bench(lambda: F.gelu(g))})
    ln = nn.LayerNorm(2048).cuda()
    xi = torch.randn(16384, 2048, device="cuda", requires_grad=True)
    gy = torch.randn(16384, 2048, device="cuda")
    rows.append({"kind": "layer_norm", "shape": [16384, 2048], "dtype": "fp32",
                 "fwd_us": bench(lambda: ln(xi)),
                 "fwd_bwd_us": bench(lambda: torch.autograd.grad(ln(xi), (xi,), gy))})
    mm = torch.randn(65536, 4096, device="cuda", dtype=torch.bfloat16)
    rows.append({"kind": "mul_scalar_inplace", "shape": [65536, 4096], "dtype": "bf16",
                 "time_us": bench(lambda: mm.mul_(1.0001))})
    return {"rows": rows}


def main() -> None:
    out = sys.argv[1]
    only = None
    if "--only" in sys.argv:
        only = sys.argv[sys.argv.index("--only") + 1].split(",")
    os.makedirs(out, exist_ok=True)
    p = torch.cuda.get_device_properties(0)
    job = {"gpu": torch.cuda.get_device_name(0), "sms": p.multi_processor_count,
           "memory_gib": p.total_memory / 2**30, "torch": torch.__version__,
           "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
           "configs": {}}
    log(f"{job['gpu']} torch {job['torch']} cuda {job['cuda']}")
    for name in CONFIGS:
        if (only and name not in only) or (not only and name.startswith(("big", "fp32"))
                                                       and name not in ("fp32-notf32", "fp32-tf32")):
            continue
        try:
            job["configs"][name] = run_config(name, out, reps=2, active=3)
        except Exception as e:  # keep the other configurations
            job["configs"][name] = {"error": repr(e)}
            log(f"{name}: FAILED {e!r}")
        with open(os.path.join(out, "job.json"), "w") as f:
            json.dump(job, f, indent=1)
    try:
        mb = micro_g3() if "--micro-g3" in sys.argv else micro()
        mb.update({"gpu": job["gpu"], "torch": job["torch"]})
        with open(os.path.join(out, "micro.json"), "w") as f:
            json.dump(mb, f, indent=1)
        log(f"micro: {len(mb['rows'])} rows")
    except Exception as e:
        log(f"micro FAILED {e!r}")


if __name__ == "__main__":
    main()
