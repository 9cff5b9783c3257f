"""Published modern training recipes against the plain ``retime synth`` command.

Run: ``python bench/synth_recipes.py`` (a few minutes on 2 cores; ``--quick`` for the
development rows; ``--commands`` prints each row's command only; ``--parts`` adds where each
row's step goes). For every published run
it prints the source, the hardware, the layout and the recipe's features, the exact
``retime synth`` command the recipe maps to (the options state what the recipe states and
nothing else: no per-row constant), the predicted and published tokens/s per GPU (model
TFLOP/s per GPU where the source gives that) and their ratio; then the median and worst
``|ratio - 1|`` of the development rows, of the judged rows and of all rows.

Sources (collectors/synth/REFERENCES.md):

- R7 pytorch/torchtitan ``benchmarks/llama3_h100_202412_torchtitan.md``, Tables 1-6:
  Llama 3.1 8B / 70B / 405B on Grand Teton hosts (H100 96GB HBM2e at a 500 W limit:
  ``bench/data/grand-teton-h100-500w.toml``), FSDP vs torch.compile vs Float8, FSDP + CP,
  2D (FSDP + TP) with and without AsyncTP, 3D with 1F1B and interleaved 1F1B, 4D with CP.
- R9 pytorch/torchtitan ``docs/performance.md``: Llama 3 8B / 70B and Llama 2 13B / 70B
  with FSDP2 on 64 A100 80GB (the ``selective layer`` rows need layer-level checkpointing,
  which is not modeled, and are left out), on AWS p4de instances with 400 Gb/s EFA
  (``bench/data/aws-p4de.toml``; R23: not stated by R9, see below).
- R10 pytorch/torchtitan ``benchmarks/llama3_8b_h200_2025-06_torchtitan.md`` (Trainy):
  Llama 3.1 8B on 32 and 64 H200, compile + Float8, FSDP.
- R11 Meta, "The Llama 3 Herd of Models" (arXiv 2407.21783) Table 4 / Balaji SC'24: Llama
  3 405B on 8,192 and 16,384 H100 (700 W, RoCE 400 Gb/s), TP 8, PP 16, 16M tokens per
  batch, BF16; published in model TFLOP/s per GPU (430 / 400).
- R12 DeepSeek-V3 technical report (arXiv 2412.19437): 2,048 H800, PP 16 DualPipe, EP 64,
  ZeRO-1, FP8, recompute of the norms and MLA up-projections; 180K H800 GPU-hours per
  trillion tokens (1,543 tokens/s per GPU, every overhead of the run included);
  ``bench/data/h800.toml``.

How recipes map to options. torchtitan: ``--fsdp --fsdp-impl fsdp2`` (PyTorch FSDP2 over
the data-parallel ranks: staging copies, fp32 reduce-scatter; R22),
``--eager`` unless the row uses ``torch.compile``, ``--compile-blocks`` when an R7 row uses
it (torchtitan compiled per block then; REFERENCES R18), ``--dtype fp8 --fp8-scaling tensorwise``
for Float8 (torchao's dynamic tensorwise scaling: every GEMM casts both operands, an amax
pass and a cast pass each), ``--recompute op`` for its default
"selective op" checkpointing, ``--recompute full`` for full checkpointing, TP with
``--sequence-parallel`` (torchtitan's TP plan shards the norms over the sequence), CP with
``--seq`` (the row's sequence length) and ``--cp-attention torch`` (PyTorch's ring
attention, step by step with fp32 merges; added after the CP rows had been seen: see
below), ``--schedule interleaved --chunks 2`` for
Interleaved 1F1B (torchtitan splits the model into two stages per rank for multi-stage
schedules), under PP torchtitan's default number of micro-batches at the benchmark's commit
(9dec370, 2024-12-26): the PP degree, for 1F1B and Interleaved 1F1B alike (torchtitan PR
#781, merged 2025-01-07, later made it PP degree x stages per rank), so Table 5's local
batch 32 runs 8 micro-batches of 4 and Table 6's local batch 8 runs 8 of 1,
``--tp-comm-overlap`` for AsyncTP (Tables 4-6). Llama 3 405B:
interleaved schedule with asynchronous pipeline transfers, the first and last stage one
layer fewer, which R11 says leaves the first model chunk the embedding alone and the last
the output projection and loss alone: model chunks of one layer, 8 per rank (R34; was 2
chunks of 4 layers, 3 on the first and last, an assumption), ZeRO-2 with the reduction
overlapped (R11: its FSDP "shards optimizer states and gradients", does not reshard the
weights and reduces gradients asynchronously; was ZeRO-1), sequence parallelism (inferred:
see the seventh pass).

Roles. ``dev``: torchtitan Table 1 (8B on 8 GPUs), whose 1.66x miss led to the eager,
op-level-checkpointing and 500 W profile changes; nothing was fitted to it (byte counts
from torchtitan's model code, peaks from datasheets). ``judge``: every other row. Honest
caveat: the judged rows' ratios under the *previous* model were printed once (while
finding the causes) before those changes were written, and ``--tp-comm-overlap`` was added
after the AsyncTP row had been seen run with the vanilla command (0.94x); its price is the
synthesizer's existing overlap rule (C3), nothing was fitted to the row.

Changes made after every row here had been seen (issue #29 item 4, after the cost-layer
merge moved the judged median from 8.9% to 13.8%, worst 46.4%), each a mechanism or a
recipe fact with its source, none a per-row factor, but chosen knowing the rows they move:
(1) Table 5's micro-batch count: torchtitan's default at the benchmark's commit is the PP
degree (8), not one sequence per micro-batch (these rows said ``micro_batch=1``, 32
micro-batches: torchtitan PR #781 only changed the default on 2025-01-07); (2) FSDP under
a pipeline gathers a stage once per step and reduce-scatters after its last backward
(torch.distributed.pipelining with FSDP2, torchtitan's ``reshard_after_forward=False`` with
PP; REFERENCES R13); (3) flash-attention backward at 0.87 of the forward's rate (FA3 paper,
costs REFERENCES K14); (4) ``--fp8-scaling tensorwise`` for the Float8 rows (torchao's
``matmul_with_hp_or_float8_args``, costs REFERENCES K15). Before them: judged median 13.8%,
worst 46.4%, 12/26 within 10%; after: see the README (``python bench/synth_recipes.py``).
(5) ``--cp-attention torch`` on the CP rows (PyTorch's ``_templated_ring_attention``: cp
flash calls per layer and fp32 eager merges, byte counts read off its source;
``collectors/synth/ring.py``), chosen after the CP rows had been seen 1.11x-1.25x too fast.

Third pass (issue #29 item 4, after every row here had been seen; mechanisms read off the
frameworks' source, none a per-row factor, each chosen knowing the rows it moves):
(6) DualPipe's communication SMs (REFERENCES R16): DeepSeek-V3's all-to-all kernels hold 20
of the H800's 132 SMs while DualPipe overlaps them with the paired chunk, so a
compute-bound kernel issued while one is in flight runs on 112 (DeepSeek-V3 1.10x ->
1.07x); (7) PyTorch's
ring attention as torchtitan drives it (R17): K/V expanded to the query heads
(``repeat_kv``), the backward's fp32 dK/dV rotated to the next rank after every step
(``cp - 1`` transfers beside the later steps' kernels, the last one exposed), step 1
waiting for the K/V all-gather (Table 6 CP 2 / 4 / 8 1.12x / 1.08x / 1.22x -> 1.07x /
1.05x / 1.14x; Table 2 CP 2 / 4 / 8 0.89x / 1.16x / 1.19x -> 0.87x / 1.14x / 1.17x).
(8) torchtitan's ``torch.compile`` scope at the benchmark's commit (R18,
``--compile-blocks`` on every compiled R7 row): compiled per transformer block, the
complex-number rotary embedding left to eager kernels (Inductor generates no complex code),
the final norm and the fp32 loss uncompiled (Table 1 / 3 compile 1.12x / 1.15x -> 1.08x /
1.12x, Float8 1.06x / 1.09x -> 1.02x / 1.05x; the other R7 rows 0.4-2% slower); the R10
rows (June 2025) keep the plain compiled command, as whether their loss was compiled was
not checked. Judged rows after (6)-(8): median 6.0%, worst 19.8%, 17 of 26 within 10%
(before: 8.6%, 22.2%, 16); dev rows 8.2% / 9.1% / 3 of 3 (9.1% / 11.8% / 2).
Table 2's published rows are not monotonic in what a ring step costs (CP 2 adds 4.5 s per
extra step over CP 1, CP 4 and CP 8 7.4 s and 7.3 s): no per-step price puts all three
within 10%.

Fourth pass (issue #29 item 4, after every row here had been seen; read off PyTorch's and
torchtitan's source, nothing fitted): (9) PyTorch FSDP2's staging copies and torchtitan's
fp32 gradient reduction (REFERENCES R22, ``collectors/synth/fsdp.py``; every torchtitan row
states ``--fsdp-impl fsdp2``, whose reduce dtype defaults to fp32 as torchtitan's does;
plain ``--fsdp`` keeps the earlier in-place, 16-bit pricing, Megatron-Core's FSDP):
the all-gather copy-out before each forward and backward regather and the reduce-scatter
copy-in before each reduce-scatter run on the compute stream (2 + 2 and 2 + 4 bytes per
parameter), the reduce-scatter moves 4 bytes per parameter. The previous pass had named
both as unmodeled causes of the 8B FSDP rows' miss, so this was looked for because of
those rows. Judged rows: median 6.0% -> 5.2%, worst 19.8% -> 16.8%, within 10% 17 -> 19 of
26; dev rows 8.2% / 9.1% -> 5.7% / 6.8%.
(10) The R9 rows' cluster (REFERENCES R23, ``bench/data/aws-p4de.toml``): R9 does not state
it; torchtitan's ``multinode_trainer.slurm`` of that time is "optimized for AWS with EFA"
("Enable for A100": ``FI_PROVIDER=efa``) and a maintainer wrote in 2024-11 "we no longer
have AWS cluster access": A100 80GB on AWS is p4de.24xlarge, 400 Gb/s EFA per instance
(four 100 Gb/s interfaces) against the built-in ``a100-80gb`` profile's DGX 8 x 200 Gb/s.
**Chosen after the R9 rows had been seen**, because Llama 2 70B with op-level
checkpointing (1.13x after (9)) is the one R9 row whose FSDP traffic (70B parameters,
gathered twice and reduced in fp32 each step) outweighs its compute (4,096 tokens per
GPU): on the slower network it is 0.98x; the other R9 rows 0.94x-1.02x (before: 0.96x-
1.03x). Nothing fitted: the EFA rate is the instance's datasheet figure, the bus
efficiency the a100-80gb profile's.
(11) FSDP2's gradient accumulator under a pipeline (R22, ``fsdp.accumulate``): each
backward but the last adds its 16-bit gradients into an unsharded fp32 accumulator on the
compute stream (10 bytes per parameter), which the memory model now holds at 4 bytes per
parameter (was 2): Tables 5 / 6 0.5-1.5% slower (T5 1F1B 1.02x -> 1.01x, interleaved
1.04x -> 1.03x) and 55-56 -> 67-68 GiB against 72.7-84.9 published. Found while reading
FSDP2's source for (9), after the rows had been seen. Judged median 5.2% -> 4.9%.

Fifth pass (issue #29 item 4, after every row here had been seen): (12) Llama 3 405B's
model chunks as the paper states them (R34: one layer fewer on the first and last stages
"means that the first model chunk on the first stage has only the embedding", so chunks
of one layer, 8 per rank; was 2 chunks of 4 layers, an assumption): 8K / 16K GPUs 1.02x /
0.90x -> 1.14x / 1.11x (bubble 23% / 47% -> 6% / 12%). Not a fix: the rows are now too
fast alike at both scales, by causes not modeled (REFERENCES "Still missed"). Judged
median 4.9% -> 5.7%, 20 -> 19 of 26 within 10%. (13) The optimizer step waits for the last
FSDP reduce-scatter (it had started beside the embedding's): FSDP rows 0.0-0.3% slower,
judged median 5.8%, dev rows 5.7% / 6.8% -> 5.4% / 6.6%.

Sixth pass (issue #29 item 1, one cost layer; R8): flash-attention kernels are priced by
the cost layer's one flash model (``kernels.attention``, the GPU's published FA2 rate,
checked in ``bench/kernel_attention.py``) instead of as GEMMs at k = head dim (REFERENCES
R50). Every flash row gets faster: judged median 5.8% -> 8.4%, worst 16.8% -> 36.9% (TT-T2
CP8 1.17x -> 1.37x), within 10% 19 -> 15 of 26; dev rows 5.4% / 6.6% -> 9.1% / 9.8%. Kept:
the kernel rate is the published one; the rows now show time the recipes lose outside it
(REFERENCES "Still missed").

Seventh pass (issue #29 item 4, helper SY2, after every row had been seen): Llama 3 405B's
memory recounted by hand (``tests/test_synth_memory_recount.py``) matched the model's 214.3
/ 196.2 GiB term by term, so the OOM came from the row, not a wrong term: (14) R11's FSDP
shards the gradients (ZeRO-2, was ZeRO-1) and reduces them asynchronously
(``--grad-overlap``); the synthesizer's ZeRO-2 now reduces every micro-batch's gradients
as DeepSpeed's does (synth REFERENCES R46; before, it reduced once yet held only a shard).
Sequence parallelism would fit the rows in 80 GB (79.2 / 72.4 GiB, 1.09x / 0.97x) but R11
does not state it, so the rows do not set it (the lead's review: a bench never invents an
input): without it one layer of one micro-batch keeps 1.47 GB on each TP rank and the 141
in flight need 193 GiB, and the rows say oom (202.6 / 184.4 GiB, 1.085x / 0.955x): an open
contradiction between the memory model and a published run, not hidden.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import numpy as np

from retime.collectors.enums import OpKind
from retime.collectors.synth import read_hardware_file, resolve_model, synthesize

DATA = Path(__file__).resolve().parent / "data"
TT = "bench/data/grand-teton-h100-500w.toml"
H800 = "bench/data/h800.toml"

# (id, source, hardware, features, published, unit, role, options)
# options are the command's: model, hardware or hardware_file, then the layout
_8B = dict(model="llama3-8b", hardware_file=TT, tp=1, pp=1, fsdp=True, fsdp_impl="fsdp2")
_70B_2D = dict(model="llama3-70b", hardware_file=TT, tp=8, pp=1, dp=32, fsdp=True, fsdp_impl="fsdp2",
               compile_blocks=True, sequence_parallel=True, global_batch=512, micro_batch=16, recompute="full",
               dtype="fp8", fp8_scaling="tensorwise")
_405B_3D = dict(model="llama3-405b", hardware_file=TT, tp=8, pp=8, fsdp=True, fsdp_impl="fsdp2",
                compile_blocks=True, sequence_parallel=True, tp_comm_overlap=True, micro_batch=1,
                recompute="full", dtype="fp8", fp8_scaling="tensorwise")
P4DE = "bench/data/aws-p4de.toml"
_A100 = dict(hardware_file=P4DE, tp=1, pp=1, dp=64, fsdp=True, fsdp_impl="fsdp2", eager=True)
_H200 = dict(model="llama3-8b", hardware="h200", tp=1, pp=1, fsdp=True, fsdp_impl="fsdp2", global_batch=64,
             micro_batch=2, recompute="op", dtype="fp8", fp8_scaling="tensorwise")
# R11 / R34: 8 model chunks of one layer per rank (126 layers + 2 = 16 ranks x 8), the
# first chunk the embedding alone and the last the output and loss alone
# R11 §3.3.2: "reduce-scatter gradients in FP32 across data parallel workers" (synth R51);
# its FSDP "shards optimizer states and gradients" and does not reshard the weights (ZeRO-2:
# every micro-batch's gradients reduced, R46), "asynchronously [...] reducing gradients"
# (--grad-overlap). Sequence parallelism is not stated, so the row does not set it (a bench
# never invents an input): the synthesizer then finds the activations alone (193 GiB) over
# the 80 GB that R34 trained on "without activation checkpointing", and says oom
_L405 = dict(model="llama3-405b", hardware="h100-sxm", tp=8, pp=16, zero=2, grad_overlap=True,
             schedule="interleaved", chunks=8, p2p="async",
             micro_batch=1, global_batch=2048, stage_layers="0" + ",1" * 126 + ",0",
             grad_reduce_dtype="fp32")
# R12 §3.3.3: gradients "retained in FP32" for accumulation (the reduce dtype is not stated
# apart: the fp32 buffer is what is reduced; synth R51); "we adopt the BF16 data format
# instead of FP32 to track the first and second moments in the AdamW optimizer" (synth R54)
_DS = dict(model="deepseek-v3", hardware_file=H800, tp=1, pp=16, dp=128, ep=64,
           global_batch=15360, micro_batch=1, dtype="fp8", schedule="dualpipe", zero=1,
           recompute="selective", grad_reduce_dtype="fp32", moment_dtype="bf16")

ROWS = [
    ("TT-T1 FSDP", "R7 T1", "8 x H100 500W", "FSDP, eager, SAC op", 5762, "tok", "dev",
     dict(_8B, dp=8, global_batch=16, micro_batch=2, recompute="op", eager=True)),
    ("TT-T1 +compile", "R7 T1", "8 x H100 500W", "FSDP, compile, SAC op", 6667, "tok", "dev",
     dict(_8B, dp=8, global_batch=16, micro_batch=2, recompute="op",
                         compile_blocks=True)),
    ("TT-T1 +Float8", "R7 T1", "8 x H100 500W", "FSDP, compile, Float8, SAC op", 8532, "tok",
     "dev", dict(_8B, dp=8, global_batch=16, micro_batch=2, recompute="op", dtype="fp8",
                     fp8_scaling="tensorwise", compile_blocks=True)),
    ("TT-T3 FSDP", "R7 T3", "128 x H100 500W", "FSDP, eager, SAC op", 5605, "tok", "judge",
     dict(_8B, dp=128, global_batch=256, micro_batch=2, recompute="op", eager=True)),
    ("TT-T3 +compile", "R7 T3", "128 x H100 500W", "FSDP, compile, SAC op", 6514, "tok",
     "judge", dict(_8B, dp=128, global_batch=256, micro_batch=2, recompute="op",
                   compile_blocks=True)),
    ("TT-T3 +Float8", "R7 T3", "128 x H100 500W", "FSDP, compile, Float8, SAC op", 8380,
     "tok", "judge", dict(_8B, dp=128, global_batch=256, micro_batch=2, recompute="op",
                          dtype="fp8", fp8_scaling="tensorwise", compile_blocks=True)),
    ("TT-T2 CP1 32k", "R7 T2", "8 x H100 500W", "FSDP 8, compile, Float8, full AC", 3890,
     "tok", "judge", dict(_8B, dp=8, global_batch=8, micro_batch=1, recompute="full",
                          compile_blocks=True,
                          dtype="fp8", fp8_scaling="tensorwise", seq=32768)),
    ("TT-T2 CP2 64k", "R7 T2", "8 x H100 500W", "FSDP 4, CP 2, compile, Float8, full AC",
     2540, "tok", "judge", dict(_8B, dp=4, cp=2, cp_attention="torch", compile_blocks=True,
                                global_batch=4, micro_batch=1,
                                recompute="full", dtype="fp8", fp8_scaling="tensorwise", seq=65536)),
    ("TT-T2 CP4 128k", "R7 T2", "8 x H100 500W", "FSDP 2, CP 4, compile, Float8, full AC",
     1071, "tok", "judge", dict(_8B, dp=2, cp=4, cp_attention="torch", compile_blocks=True,
                                global_batch=2, micro_batch=1,
                                recompute="full", dtype="fp8", fp8_scaling="tensorwise", seq=131072)),
    ("TT-T2 CP8 256k", "R7 T2", "8 x H100 500W", "CP 8, compile, Float8, full AC", 548,
     "tok", "judge", dict(_8B, dp=1, cp=8, cp_attention="torch", global_batch=1,
                          compile_blocks=True,
                          micro_batch=1, recompute="full",
                          dtype="fp8", fp8_scaling="tensorwise", seq=262144)),
    ("TT-T4 2D", "R7 T4", "256 x H100 500W", "FSDP 32, TP 8, compile, Float8, full AC", 829,
     "tok", "judge", dict(_70B_2D)),
    ("TT-T4 2D+AsyncTP", "R7 T4", "256 x H100 500W", "as 2D + AsyncTP", 876,
     "tok", "judge", dict(_70B_2D, tp_comm_overlap=True)),
    ("TT-T5 3D 1F1B", "R7 T5", "512 x H100 500W", "FSDP 8, TP 8, PP 8, 1F1B, Float8, "
     "AsyncTP, full AC", 100, "tok", "judge", dict(_405B_3D, dp=8, global_batch=256,
                                                   micro_batch=4)),
    ("TT-T5 3D interleaved", "R7 T5", "512 x H100 500W", "as 1F1B, Interleaved 1F1B", 128,
     "tok", "judge", dict(_405B_3D, dp=8, global_batch=256, micro_batch=4,
                          schedule="interleaved", chunks=2)),
    ("TT-T6 4D CP1 32k", "R7 T6", "512 x H100 500W", "FSDP 8, TP 8, PP 8, 1F1B, full AC",
     76, "tok", "judge", dict(_405B_3D, dp=8, global_batch=64, seq=32768)),
    ("TT-T6 4D CP2 64k", "R7 T6", "512 x H100 500W", "FSDP 4, CP 2, TP 8, PP 8", 47, "tok",
     "judge", dict(_405B_3D, dp=4, cp=2, cp_attention="torch",
                   global_batch=32, seq=65536)),
    ("TT-T6 4D CP4 128k", "R7 T6", "512 x H100 500W", "FSDP 2, CP 4, TP 8, PP 8", 31, "tok",
     "judge", dict(_405B_3D, dp=2, cp=4, cp_attention="torch",
                   global_batch=16, seq=131072)),
    ("TT-T6 4D CP8 256k", "R7 T6", "512 x H100 500W", "CP 8, TP 8, PP 8", 16, "tok",
     "judge", dict(_405B_3D, dp=1, cp=8, cp_attention="torch",
                   global_batch=8, seq=262144)),
    ("TT-A100 L3-8B op", "R9", "64 x A100 p4de", "FSDP, eager, SAC op, bs 1", 2973, "tok",
     "judge", dict(_A100, model="llama3-8b", global_batch=64, micro_batch=1,
                   recompute="op")),
    ("TT-A100 L3-70B full", "R9", "64 x A100 p4de", "FSDP, eager, full AC, bs 1", 331,
     "tok", "judge", dict(_A100, model="llama3-70b", global_batch=64, micro_batch=1,
                          recompute="full")),
    ("TT-A100 L2-13B none", "R9", "64 x A100 p4de", "FSDP, eager, no AC, bs 2", 2162, "tok",
     "judge", dict(_A100, model="llama2-13b", global_batch=128, micro_batch=2)),
    ("TT-A100 L2-13B op", "R9", "64 x A100 p4de", "FSDP, eager, SAC op, bs 2", 1904, "tok",
     "judge", dict(_A100, model="llama2-13b", global_batch=128, micro_batch=2,
                   recompute="op")),
    ("TT-A100 L2-70B op", "R9", "64 x A100 p4de", "FSDP, eager, SAC op, bs 1", 355, "tok",
     "judge", dict(_A100, model="llama2-70b", global_batch=64, micro_batch=1,
                   recompute="op")),
    ("TT-A100 L2-70B full", "R9", "64 x A100 p4de", "FSDP, eager, full AC, bs 2", 353,
     "tok", "judge", dict(_A100, model="llama2-70b", global_batch=128, micro_batch=2,
                          recompute="full")),
    ("TT-H200 32", "R10", "32 x H200", "FSDP, compile, Float8, SAC op", 10938, "tok",
     "judge", dict(_H200, dp=32)),
    ("TT-H200 64", "R10", "64 x H200", "FSDP, compile, Float8, SAC op", 10753, "tok",
     "judge", dict(_H200, dp=64, global_batch=128)),
    ("Llama3-405B 8K GPUs", "R11 T4", "8,192 x H100 SXM", "TP 8, PP 16, DP 64, BF16, "
     "interleaved, async p2p, uneven stages", 430, "tflops", "judge", dict(_L405, dp=64)),
    ("Llama3-405B 16K GPUs", "R11 T4", "16,384 x H100 SXM", "TP 8, PP 16, DP 128, BF16, "
     "interleaved, async p2p, uneven stages", 400, "tflops", "judge",
     dict(_L405, dp=128)),
    ("DeepSeek-V3", "R12", "2,048 x H800", "PP 16 DualPipe, EP 64, ZeRO-1, FP8, "
     "recompute norms + MLA up-proj.", 1543, "tok", "judge", dict(_DS)),
]

#: option name -> CLI flag (booleans are flags)
_FLAGS = ("model", "hardware", "hardware_file", "tp", "pp", "dp", "cp", "ep",
          "sequence_parallel", "tp_comm_overlap", "fsdp", "fsdp_impl", "zero", "schedule", "chunks",
          "stage_layers", "p2p", "global_batch", "micro_batch", "seq", "recompute", "dtype",
          "fp8_scaling", "cp_attention", "eager", "compile_blocks", "grad_reduce_dtype",
          "moment_dtype", "grad_overlap")


def command(opts: dict) -> str:
    """The ``retime synth`` command line of a row's options."""
    parts = ["retime synth"]
    for k in _FLAGS:
        if k not in opts:
            continue
        v = opts[k]
        flag = "--" + k.replace("_", "-")
        if isinstance(v, bool):
            if v:
                parts.append(flag)
        else:
            parts.append(f"{flag} {v}")
    return " ".join(parts) + " -o run.retime --json"


def predict(opts: dict) -> dict:
    """``meta["synth"]`` of a row's run, as the command computes it (one representative rank
    per pipeline stage: ``expand="unique"``; the step time is the same)."""
    return run(opts).meta["synth"]


def run(opts: dict):
    """The synthesized trace of a row's options (:func:`predict`)."""
    o = dict(opts)
    mc = resolve_model(o.pop("model"))
    seq = o.pop("seq", None)
    if seq is not None:
        mc = dataclasses.replace(mc, seq=seq)
    hw = o.pop("hardware", None)
    hf = o.pop("hardware_file", None)
    if hf is not None:
        hw = read_hardware_file(Path(__file__).resolve().parent.parent / hf)
    sl = o.pop("stage_layers", None)
    if sl is not None:
        o["stage_layers"] = tuple(int(x) for x in sl.split(","))
    return synthesize(mc, hw, expand="unique", check_memory=False, **o)


#: FLOPs per HBM byte from which a kernel counts as GEMM-like in :func:`parts`
GEMM_INTENSITY = 50.0


def parts(trace) -> dict[str, float]:
    """Where the step of a row's first rank goes, in ms: ``attention`` (flash-attention
    kernels, ring steps included), ``gemm`` (other kernels with at least
    :data:`GEMM_INTENSITY` FLOPs per byte), ``other`` (the remaining compute-stream kernels:
    memory-bound), ``idle`` (the step minus those three: compute waiting for communication
    or the pipeline), ``comm`` (the summed time of the collectives and transfers in flight,
    overlapped or not) and ``step``. Printed by ``--parts``."""
    f = trace.ops_frame()
    f = f[f["rank"] == f["rank"].min()]
    comm = f["kind"].isin([int(OpKind.COLLECTIVE), int(OpKind.P2P)])
    k = f[f["kind"] == int(OpKind.KERNEL)]
    att = k["name"].astype(str).str.contains("flash")
    dense = ~att & (k["flops"] >= GEMM_INTENSITY * k["bytes"].clip(lower=1))
    ms = {"attention": k.loc[att, "dur_ns"].sum() / 1e6,
          "gemm": k.loc[dense, "dur_ns"].sum() / 1e6,
          "other": k.loc[~att & ~dense, "dur_ns"].sum() / 1e6,
          "comm": f.loc[comm, "dur_ns"].sum() / 1e6,
          "step": trace.meta["synth"]["step_time_ns"] / 1e6}
    ms["idle"] = ms["step"] - ms["attention"] - ms["gemm"] - ms["other"]
    return ms


def figure(s: dict, unit: str) -> float:
    """Predicted tokens/s per GPU, or model TFLOP/s per GPU (MFU x the dtype's peak)."""
    if unit == "tflops":
        return s["mfu"] * s["hardware"]["peak_tflops"][s["dtype"]]
    return s["tokens_per_s"] / s["world_size"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="development rows only")
    ap.add_argument("--commands", action="store_true", help="print the commands only")
    ap.add_argument("--only", default="", help="rows whose id contains this text")
    ap.add_argument("--parts", action="store_true",
                    help="also print where each row's step goes (ms: attention, GEMM, other "
                         "kernels, idle, communication in flight)")
    args = ap.parse_args()
    _rows(args)


def _rows(args) -> None:
    errs: dict[str, list[float]] = {"dev": [], "judge": []}
    for rid, src, hw, feat, pub, unit, role, opts in ROWS:
        if (args.quick and role != "dev") or args.only not in rid:
            continue
        if args.commands:
            print(f"# {rid} ({src}; {hw}; {feat}): published {pub} "
                  f"{'TFLOP/s' if unit == 'tflops' else 'tokens/s'} per GPU\n{command(opts)}")
            continue
        t0 = time.perf_counter()
        tr = run(opts)
        s = tr.meta["synth"]
        pred = figure(s, unit)
        r = pred / pub
        errs[role].append(abs(r - 1))
        u = "TFLOP/s" if unit == "tflops" else "tok/s"
        print(f"{rid:22s} {src:7s} {hw:18s} {pred:8.0f} {pub:6d} {u:7s} {r:5.2f}x  "
              f"{s['peak_memory_bytes'] / 2**30:5.1f} GiB{' oom' if s['oom'] else '    '} "
              f"{role:5s} [{time.perf_counter() - t0:.0f}s]  {feat}")
        print(f"    {command(opts)}")
        if args.parts:
            print("    parts (ms): " + ", ".join(f"{k} {v:.0f}" for k, v in parts(tr).items()))
    if args.commands:
        return
    print()
    every = errs["dev"] + errs["judge"]
    for name, e in (("dev", errs["dev"]), ("judge", errs["judge"]), ("all", every)):
        if e:
            print(f"{name:5s} rows {len(e):2d}: median |ratio-1| {100 * np.median(e):.1f}%, "
                  f"worst {100 * np.max(e):.1f}%, within 10%: "
                  f"{sum(x <= 0.10 for x in e)}/{len(e)}")


if __name__ == "__main__":
    main()
