"""Write the hand-built regression traces of issue #28 (``python traces/regress/build.py``).

Each is a small Kineto JSON file that reproduces one pattern the issue found in a public
trace, built from the issue's description (what the public trace holds and the figures the
issue quotes); none is a cut of the public trace. ``README.md`` says which trace each
imitates. Times are in microseconds as Kineto writes them; every number is written out here
so a test can derive its expected figures from this file, not from retime.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
PID, TID = 100, 100  # the host process / main thread


class Kineto:
    """A Kineto trace under construction: host ops, launches and GPU ops."""

    def __init__(self, rank: int, world: int, *, rocm: bool = False,
                 pgs: list[dict] | None = None) -> None:
        self.ev: list[dict] = []
        self.corr = 1000
        self.ext = 1
        self.rocm = rocm
        self.dist = {"backend": "nccl", "rank": rank, "world_size": world,
                     "pg_count": len(pgs or []), "pg_config": pgs or []}

    def host(self, name: str, ts: float, dur: float, cat: str = "cpu_op",
             **args) -> None:
        self.ext += 1
        self.ev.append({"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": TID,
                        "ts": ts, "dur": dur, "args": {"External id": self.ext, **args}})

    def step(self, n: int, ts: float, dur: float) -> None:
        self.host(f"ProfilerStep#{n}", ts, dur, cat="user_annotation")

    def gpu_mark(self, name: str, ts: float, dur: float, stream: int = 7) -> None:
        self.ev.append({"ph": "X", "cat": "gpu_user_annotation", "name": name, "pid": 0,
                        "tid": stream, "ts": ts, "dur": dur,
                        "args": {"device": 0, "stream": stream}})

    def launch(self, kernel: str, ts: float, gpu_ts: float, gpu_dur: float, *,
               stream: int = 7, cat: str = "kernel", launch_dur: float = 5.0,
               api: str | None = None) -> int:
        """A runtime launch call at ``ts`` and the GPU op it launched at ``gpu_ts``."""
        self.corr += 1
        api = api or ("hipLaunchKernel" if self.rocm else "cudaLaunchKernel")
        self.ev.append({"ph": "X", "cat": "cuda_runtime", "name": api, "pid": PID, "tid": TID,
                        "ts": ts, "dur": launch_dur, "args": {"correlation": self.corr}})
        self.gpu(kernel, gpu_ts, gpu_dur, stream=stream, cat=cat, corr=self.corr)
        return self.corr

    def gpu(self, kernel: str, ts: float, dur: float, *, stream: int = 7,
            cat: str = "kernel", corr: int | None = None, **args) -> None:
        if corr is None:  # a GPU op whose launch call is not in the trace
            self.corr += 1
            corr = self.corr
        self.ev.append({"ph": "X", "cat": cat, "name": kernel, "pid": 0, "tid": stream,
                        "ts": ts, "dur": dur,
                        "args": {"device": 0, "stream": stream, "correlation": corr, **args}})

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"schemaVersion": 1, "distributedInfo": self.dist,
               "deviceProperties": [{"id": 0, "name": "AMD Instinct MI250X" if self.rocm
                                     else "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 1 << 36}],
               "traceEvents": sorted(self.ev, key=lambda e: (e["ts"], e["pid"])),
               "displayTimeUnit": "ms"}
        path.write_text(json.dumps(doc, indent=0) + "\n")


ELEMENTWISE = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add"
               "<float>, at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, "
               "at::detail::Array<char*, 3>)")

#: queue-lag-first-step: host ProfilerStep#550..553 (start, end) in ms; the GPU runs the
#: steps' 20 kernels each 155 ms behind, one GPU step every 215 ms from 158.46 ms
LAG_HOST_MS = [(3.2, 215.7), (215.7, 432.2), (432.2, 647.2), (647.2, 860.1)]
LAG_GPU0_MS, LAG_GPU_PERIOD_MS = 158.46, 215.0
LAG_KERNELS, LAG_LAUNCH_EVERY_MS, LAG_RUN_EVERY_MS, LAG_KERNEL_MS = 20, 10.79, 10.66, 10.6


def queue_lag_first_step() -> None:
    """HTA ``negative_queue_length_values_check`` rank 0 (A100, 1 of 16 ranks)."""
    k = Kineto(0, 16)
    for i, (a, b) in enumerate(LAG_HOST_MS):
        k.step(550 + i, a * 1e3, (b - a) * 1e3)
        g0 = LAG_GPU0_MS + i * LAG_GPU_PERIOD_MS
        for j in range(LAG_KERNELS):
            t = a + 0.1 + j * LAG_LAUNCH_EVERY_MS
            k.host("aten::add", t * 1e3 - 2.0, 9.0)
            k.launch(ELEMENTWISE, t * 1e3, (g0 + j * LAG_RUN_EVERY_MS) * 1e3, LAG_KERNEL_MS * 1e3)
    k.write(HERE / "queue-lag-first-step" / "rank0.json")


#: empty-trailing-step: ProfilerStep#1 (us) with 8 kernels, the GPU's last ends at 10,290;
#: ProfilerStep#2 is 49 us long with no ops, 37 us after it
EMPTY_STEP1_US, EMPTY_STEP2_US = (1000.0, 9100.0), (10327.0, 10376.0)
EMPTY_GPU_US = [(1050.0 + 1155.0 * j, 1150.0) for j in range(8)]  # last ends at 10,285+5


def empty_trailing_step() -> None:
    """HTA ``mi250_minitoy_train_ROCm6_2`` (MI250, ROCm 6.2, one rank)."""
    k = Kineto(0, 1, rocm=True)
    a, b = EMPTY_STEP1_US
    k.step(1, a, b - a)
    for j, (s, d) in enumerate(EMPTY_GPU_US):
        t = a + 20.0 + 1000.0 * j
        k.host("aten::mm", t - 3.0, 12.0)
        k.launch("Cijk_Ailk_Bljk_SB_MT64x64x16_MI32x32x2x1", t, s, d + (5.0 if j == 7 else 0.0))
    a, b = EMPTY_STEP2_US
    k.step(2, a, b - a)
    k.write(HERE / "empty-trailing-step" / "rank0.json")


#: all-to-all-off-by-one: the job's all-to-alls c_0..c_6 alternate 1,536 B and 339.7 MB;
#: rank 0's trace holds c_0..c_5, rank 1's c_1..c_6 (sampled windows one call apart).
#: c_k starts at A2A_T0_MS + k * A2A_EVERY_MS on rank 0, A2A_LATE_MS later on rank 1, and
#: ends at the same nanosecond on both
A2A_T0_MS, A2A_EVERY_MS, A2A_LATE_MS = 10.0, 20.0, 0.3
A2A_BYTES = [1536, 339_700_000]  # even k, odd k
A2A_DUR_MS = [0.05, 8.0]
A2A_CALLS = {0: range(0, 6), 1: range(1, 7)}
A2A_WORLD = 128


def a2a_times_ms(k: int, rank: int) -> tuple[float, float]:
    """(start, end) of call c_k on ``rank`` in ms."""
    s1 = A2A_T0_MS + k * A2A_EVERY_MS + A2A_LATE_MS
    e = s1 + A2A_DUR_MS[k % 2]
    return (s1 - A2A_LATE_MS if rank == 0 else s1), e


def all_to_all_off_by_one() -> None:
    """HTA ``tests/data/trace_filter`` sampled_rank-0/1 (2 of 128 ranks, all-to-alls)."""
    pg = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
           "pg_size": A2A_WORLD, "ranks": list(range(A2A_WORLD))}]
    for rank, calls in A2A_CALLS.items():
        k_ = Kineto(rank, A2A_WORLD, pgs=pg)
        for k in calls:
            s, e = a2a_times_ms(k, rank)
            nbytes = A2A_BYTES[k % 2]
            t = s - 0.2  # launched 0.2 ms before it runs
            k_.host("record_param_comms", t * 1e3 - 5.0, 20.0, **{
                "Collective name": "all_to_allv", "In msg nelems": nbytes // 2,
                "Out msg nelems": nbytes // 2, "dtype": "BFloat16", "Group size": A2A_WORLD,
                "Process Group Name": "0"})
            k_.launch("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", t * 1e3,
                      s * 1e3, (e - s) * 1e3, stream=20)
        k_.write(HERE / "all-to-all-off-by-one" / f"rank{rank}.json")


#: graph-capture: kernel launches recorded during one stream capture (ms, no GPU op runs),
#: then graph launches whose replays the trace does not show; two real copies
CAP_BEGIN_MS, CAP_END_MS, CAP_LAUNCHES = 1.0, 9.1, 40
CAP_GRAPH_LAUNCH_MS = [10.0, 12.0, 14.0]
CAP_COPIES_MS = [(0.5, 0.52, 0.08), (15.0, 15.02, 0.08)]  # (call, GPU start, GPU duration)


def graph_capture() -> None:
    """TraceLens's vLLM full-graph / SGLang decode captures (H100, one rank)."""
    k = Kineto(0, 1)
    for call, g, d in CAP_COPIES_MS:
        k.launch("Memcpy HtoD (Pinned -> Device)", call * 1e3, g * 1e3, d * 1e3,
                 cat="gpu_memcpy", api="cudaMemcpyAsync")
    k.host("cudaStreamBeginCapture", CAP_BEGIN_MS * 1e3 - 10.0, 10.0, cat="cuda_runtime")
    every = (CAP_END_MS - CAP_BEGIN_MS) / CAP_LAUNCHES
    for j in range(CAP_LAUNCHES):
        t = CAP_BEGIN_MS + j * every
        k.host("aten::mm", t * 1e3, every * 1e3 - 5.0)
        k.corr += 1
        k.ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": PID,
                     "tid": TID, "ts": t * 1e3 + 30.0, "dur": 20.0,
                     "args": {"correlation": k.corr}})
    k.host("cudaStreamEndCapture", CAP_END_MS * 1e3, 15.0, cat="cuda_runtime")
    k.host("cudaGraphInstantiate", CAP_END_MS * 1e3 + 100.0, 300.0, cat="cuda_runtime")
    for t in CAP_GRAPH_LAUNCH_MS:
        k.corr += 1
        k.ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": PID,
                     "tid": TID, "ts": t * 1e3, "dur": 12.0, "args": {"correlation": k.corr}})
    k.write(HERE / "graph-capture" / "rank0.json")


#: b200-multimem: symmetric-memory all-reduces of a [4096, 7168] bf16 tensor, launched by
#: the CPU op symm_mem::multimem_all_reduce_ (its Input Dims and type carry the size)
MM_KERNEL = ("void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>"
             "(c10::BFloat16*, unsigned long, unsigned int**, unsigned long, unsigned long)")
MM_DIMS, MM_CALLS_MS = [4096, 7168], [1.0, 3.0, 5.0]


def b200_multimem() -> None:
    """A B200 trace with PyTorch symmetric-memory (NVLS multimem) all-reduces, rank 0 of 8."""
    k = Kineto(0, 8)
    for t in MM_CALLS_MS:
        k.host("symm_mem::multimem_all_reduce_", t * 1e3, 40.0, **{
            "Input Dims": [MM_DIMS, [], []], "Input type": ["c10::BFloat16", "", ""],
            "Input Strides": [[MM_DIMS[1], 1], [], []]})
        k.launch(MM_KERNEL, t * 1e3 + 10.0, t * 1e3 + 30.0, 150.0)
    k.write(HERE / "b200-multimem" / "rank0.json")


#: deepep-kernels: one MoE layer's DeepEP kernels as DeepSeek's train.json names them
#: (name, expected primitive; None: a local kernel, not communication)
DEEPEP = [("dpsk::ep::cuda::get_dispatch_layout", None),
          ("dpsk::ep::internode::cached_notify", "BARRIER"),
          ("dpsk::ep::internode::notify_dispatch", "ALL_TO_ALL"),
          ("dpsk::ep::internode::dispatch", "ALL_TO_ALL"),
          ("dpsk::ep::internode::combine", "ALL_TO_ALL")]


def deepep_kernels() -> None:
    """DeepSeek's train.json (H800, DeepEP expert parallelism), rank 0 of 16."""
    k = Kineto(0, 16)
    for j, (name, _) in enumerate(DEEPEP):
        t = 1.0 + j
        k.host("aten::empty", t * 1e3 - 20.0, 10.0)
        k.launch(name, t * 1e3, t * 1e3 + 20.0, 200.0, stream=30)
    k.write(HERE / "deepep-kernels" / "rank0.json")


if __name__ == "__main__":
    queue_lag_first_step()
    empty_trailing_step()
    all_to_all_off_by_one()
    graph_capture()
    b200_multimem()
    deepep_kernels()
