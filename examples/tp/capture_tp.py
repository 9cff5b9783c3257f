"""A real tensor-parallel pair on CPU: one transformer block at TP=1 and TP=2 (gloo).

The block is written as Megatron-LM writes it (Shoeybi et al. 2019): attention with a fused
QKV projection that is **column**-parallel (each rank holds ``heads / t`` heads), the attention
core per rank (``F.scaled_dot_product_attention`` over its heads), the out-projection
**row**-parallel, then one all-reduce of its output (forward); the MLP's first linear
column-parallel, its second row-parallel, one all-reduce of its output. In the backward each
column-parallel layer's input gradient is all-reduced (Megatron's ``f`` operator). Tokens are
flattened to ``[batch * seq, hidden]`` for the linears. Same seeds at both degrees: rank
``r`` of TP=t holds the ``r``-th slice of the TP=1 weights.

    python examples/tp/capture_tp.py --out traces/tp        # writes tp1/ and tp2/

then ``retime ingest traces/tp/tp1 -o tp1.retime`` and
``retime replay tp1.retime --set parallel.tp=2``; ``traces/tp/tp2`` is the measured
counterpart. CPU, one intra-op thread per rank: a check of the *graph* retime rebuilds
(shapes, FLOPs, all-reduce count and bytes), not of GPU timing.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

try:
    from retime.collectors.capture import Capture, end_process
except ImportError:  # run from a checkout without retime installed: use the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from retime.collectors.capture import Capture, end_process


class _CopyToTp(torch.autograd.Function):
    """Megatron's ``f``: identity forward, all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        if dist.get_world_size() > 1:
            g = g.contiguous()
            dist.all_reduce(g)
        return g


class _ReduceFromTp(torch.autograd.Function):
    """Megatron's ``g``: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x):
        if dist.get_world_size() > 1:
            x = x.contiguous()
            dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g


def _slice(w: torch.Tensor, dim: int, t: int, r: int) -> nn.Parameter:
    return nn.Parameter(w.chunk(t, dim=dim)[r].clone().contiguous())


class TpBlock(nn.Module):
    """One pre-norm transformer block, tensor-parallel over ``t`` ranks (this is rank ``r``)."""

    def __init__(self, hidden: int, heads: int, t: int, r: int, seed: int):
        super().__init__()
        if heads % t or hidden % heads:
            raise SystemExit(f"heads={heads} must be divisible by tp={t} and divide "
                             f"hidden={hidden}")
        g = torch.Generator().manual_seed(seed)
        h, f = hidden, 4 * hidden
        self.h, self.heads_local, self.t = h, heads // t, t
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        s = h ** -0.5
        # full weights drawn identically at every degree; each rank keeps its slice. The QKV
        # weight is laid out per head ([heads, 3, head_dim, h]) so a column slice holds whole
        # heads' q, k and v, as Megatron's fused QKV does.
        qkv = (torch.randn(heads, 3, h // heads, h, generator=g) * s)
        self.w_qkv = _slice(qkv, 0, t, r)
        self.b_qkv = _slice(torch.zeros(heads, 3, h // heads), 0, t, r)
        self.w_out = _slice(torch.randn(h, h, generator=g) * s, 1, t, r)
        self.b_out = nn.Parameter(torch.zeros(h))  # added once, after the all-reduce
        self.w_fc1 = _slice(torch.randn(f, h, generator=g) * s, 0, t, r)
        self.b_fc1 = _slice(torch.zeros(f), 0, t, r)
        self.w_fc2 = _slice(torch.randn(h, f, generator=g) * f ** -0.5, 1, t, r)
        self.b_fc2 = nn.Parameter(torch.zeros(h))

    def forward(self, x: torch.Tensor, batch: int, seq: int) -> torch.Tensor:
        hl, d = self.heads_local, self.h // (self.heads_local * self.t)
        y = _CopyToTp.apply(self.ln1(x))
        qkv = F.linear(y, self.w_qkv.reshape(-1, self.h), self.b_qkv.reshape(-1))
        q, k, v = qkv.view(batch, seq, hl, 3, d).permute(3, 0, 2, 1, 4).unbind(0)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        a = a.transpose(1, 2).reshape(batch * seq, hl * d)
        x = x + _ReduceFromTp.apply(F.linear(a, self.w_out)) + self.b_out
        y = _CopyToTp.apply(self.ln2(x))
        y = F.gelu(F.linear(y, self.w_fc1, self.b_fc1))
        return x + _ReduceFromTp.apply(F.linear(y, self.w_fc2)) + self.b_fc2


def train(args: argparse.Namespace, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    t, r = dist.get_world_size(), dist.get_rank()
    blocks = nn.ModuleList(TpBlock(args.hidden, args.heads, t, r, seed=100 + i)
                           for i in range(args.layers))
    opt = torch.optim.SGD(blocks.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1234)  # the same tokens on every TP rank
    x0 = torch.randn(args.batch * args.seq, args.hidden, generator=gen)
    with Capture(out, wait=1, warmup=1, active=1) as cap:
        for _ in range(3):
            with torch.profiler.record_function("forward"):
                x = x0
                for b in blocks:
                    x = b(x, args.batch, args.seq)
                loss = x.float().pow(2).mean()
            with torch.profiler.record_function("backward"):
                loss.backward()
            with torch.profiler.record_function("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
            cap.step()
    if r == 0:
        print(f"tp={t}: loss {loss.item():.6f}; trace: {', '.join(map(str, cap.paths))}")
    dist.destroy_process_group()


def _spawned(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    train(args, out)
    end_process(0)  # traces are written; leave without torch's static destructors


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="traces/tp", help="folder for tp1/ and tp2/")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    args = p.parse_args(argv)
    for t in args.tp:
        mp.spawn(_spawned, args=(t, _free_port(), args, f"{args.out}/tp{t}"), nprocs=t)


if __name__ == "__main__":
    main()
