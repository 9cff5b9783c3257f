"""A small real DDP training job that captures its own steps with retime.

Runs on CPU with the gloo backend (NCCL on GPUs with ``--device cuda``). Three ways to run it:

    # plain: spawns 2 processes itself and writes traces to traces/ddp
    python examples/capture_ddp.py --trace-dir traces/ddp

    # under torchrun, as in a real job
    torchrun --standalone --nproc-per-node 2 examples/capture_ddp.py --trace-dir traces/ddp

    # under `retime capture` (the --trace-dir comes from `-o` through the environment)
    retime capture -n 2 -o traces/ddp -- examples/capture_ddp.py

then ``retime ingest traces/ddp -o ddp.retime`` and ``retime replay ddp.retime``.

The only retime-specific lines are the ``Capture`` context manager around the loop and the
``cap.step()`` call at the end of every step.
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
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

try:
    from retime.collectors.capture import Capture, end_process
except ImportError:  # run from a checkout without retime installed: use the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from retime.collectors.capture import Capture, end_process


def build_model(hidden: int, layers: int) -> nn.Module:
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(hidden, hidden), nn.ReLU()]
    mods.append(nn.Linear(hidden, 1))
    return nn.Sequential(*mods)


def train(args: argparse.Namespace) -> None:
    """One rank's training loop (expects torchrun-style RANK/WORLD_SIZE/MASTER_* env)."""
    torch.set_num_threads(args.threads)
    use_cuda = args.device == "cuda"
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)  # same initial weights everywhere (DDP broadcasts rank 0's anyway)
    model = DDP(build_model(args.hidden, args.layers).to(device),
                bucket_cap_mb=args.bucket_cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1234 + rank)  # each rank its own data shard
    x = torch.randn(args.batch, args.hidden, generator=gen).to(device)
    y = torch.randn(args.batch, 1, generator=gen).to(device)

    with Capture(args.trace_dir, wait=args.wait, warmup=args.warmup, active=args.active) as cap:
        for _ in range(args.steps):
            with torch.profiler.record_function("forward"):
                loss = nn.functional.mse_loss(model(x), y)
            with torch.profiler.record_function("backward"):
                loss.backward()
            with torch.profiler.record_function("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
            cap.step()
    if rank == 0:
        where = ", ".join(str(p) for p in cap.paths) or "nowhere (capture disabled)"
        print(f"rank 0: trained {args.steps} steps, final loss {loss.item():.4f}; trace: {where}")
    dist.destroy_process_group()


def _spawned(local_rank: int, world_size: int, port: int, args: argparse.Namespace) -> None:
    os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank),
                      WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    train(args)
    end_process(0)  # traces are written; leave without torch's static destructors


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace-dir", default=None,
                   help="where to write traces (default: RETIME_CAPTURE_OUT_DIR, else no capture)")
    p.add_argument("--steps", type=int, default=6, help="training steps (default 6)")
    p.add_argument("--wait", type=int, default=None, help="profiler schedule: idle steps")
    p.add_argument("--warmup", type=int, default=None, help="profiler schedule: warm-up steps")
    p.add_argument("--active", type=int, default=None, help="profiler schedule: recorded steps")
    p.add_argument("--hidden", type=int, default=512, help="width of each Linear layer")
    p.add_argument("--layers", type=int, default=4, help="number of hidden Linear layers")
    p.add_argument("--batch", type=int, default=64, help="per-rank batch size")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP gradient bucket size")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--nprocs", type=int, default=2,
                   help="processes to spawn when not launched by torchrun (default 2)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if "RANK" in os.environ:  # launched by torchrun / retime capture
        train(args)
        end_process(0)  # traces are written; leave without torch's static destructors
    else:
        mp.spawn(_spawned, args=(args.nprocs, _free_port(), args), nprocs=args.nprocs)


if __name__ == "__main__":
    main()
