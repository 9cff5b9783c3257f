"""Kernel classes: one table, used by ingest (communication kernels), analysis (kernel stats,
breakdown, report) and the hardware what-ifs (``hardware.gemm_speedup``, GPU swap).

A name is matched against the rules of :data:`RULES` in order; the first that matches gives
its class. Names no rule knows are :attr:`KernelClass.OTHER`, never a guess: ``retime
analyze`` lists the top ones (``unclassified``), so a user sees what is missing. An op's kind
comes first (:func:`op_classes`): collective/p2p ops are communication, memcpy/memset are
memory, whatever their name.

======================  ==================================================================
class                   what (examples of real names in ``tests/data/kernel_names.tsv``)
======================  ==================================================================
``communication``       NCCL/RCCL (``ncclKernel_*``, ``ncclDevKernel_*``), NVLS
                        ``multimem_*`` and PyTorch symmetric memory, DeepEP dispatch/combine,
                        NVSHMEM, MSCCL++, vLLM/TRT-LLM custom all-reduce, userbuffers, gloo
``memory``              memcpy/memset, ROCclr copy/fill kernels
``attention``           flash / FMHA / SDPA / paged / Triton attention
``conv``                cuDNN/MIOpen/CK convolutions (implicit GEMM, winograd, fprop/dgrad/
                        wgrad, ``igemm_fwd/bwd/wrw``) and their helpers
``GEMM``                cuBLAS/cuBLASLt (``*sgemm*``, ``sm90_xmma_gemm``, ``nvjet``, split-K
                        reduce, epilogues), CUTLASS, hipBLASLt/Tensile ``Cijk_``, CK gemm,
                        Triton matmul templates, grouped / MoE / fp8 GEMMs (DeepGEMM)
``norm``                batch/layer/RMS/group norm (``bn_fw_*``, ``bn_bw_*``, MIOpen BatchNorm)
``embedding``           embedding lookups and their backward (fbgemm ``split_embedding_*``)
``optimizer``           fused/foreach optimizer steps (``multi_tensor_apply``, Adam, LAMB)
``pooling``             max/avg/adaptive pooling
``layout``              transposes and format changes (``nchwToNhwc``, ``batched_transpose``),
                        permute, cat
``reduction``           reductions, softmax, losses, sort/top-k/scan, Triton ``red``/``per``
``elementwise``         pointwise math, activations, casts and copies, fill, dropout, indexing,
                        Triton ``poi``
``other``               a name none of the rules knows
======================  ==================================================================

The modeled ops of ``retime synth`` (``L3.attn.qkv.fwd``, ``mlp.fc1.bwd_wgrad``, ...) have
rules of their own, checked first. Memory-bound classes (norm ... elementwise) are never
GEMM: the GPU swap re-times them by HBM bandwidth, GEMM/conv/attention by peak FLOP/s.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from enum import IntEnum
from functools import lru_cache

import numpy as np

from .enums import OpKind

__all__ = ["KernelClass", "CLASS_NAMES", "RULES", "classify_name", "classify_names",
           "is_comm_kernel", "op_classes", "MEMORY_BOUND"]


class KernelClass(IntEnum):
    """Class of a device op (see the module docstring)."""

    COMMUNICATION = 0
    MEMORY = 1
    ATTENTION = 2
    CONV = 3
    GEMM = 4
    NORM = 5
    EMBEDDING = 6
    OPTIMIZER = 7
    POOLING = 8
    LAYOUT = 9
    REDUCTION = 10
    ELEMENTWISE = 11
    OTHER = 12


#: display names, indexed by KernelClass
CLASS_NAMES = ("communication", "memory", "attention", "conv", "GEMM", "norm", "embedding",
               "optimizer", "pooling", "layout", "reduction", "elementwise", "other")

#: classes whose kernels are bound by memory bandwidth (the roofline's HBM side)
MEMORY_BOUND = (KernelClass.NORM, KernelClass.EMBEDDING, KernelClass.OPTIMIZER,
                KernelClass.POOLING, KernelClass.LAYOUT, KernelClass.REDUCTION,
                KernelClass.ELEMENTWISE)

_C = KernelClass
_I = re.I

#: (pattern, class) in the order they are tried; the first match wins
RULES: tuple[tuple[re.Pattern[str], KernelClass], ...] = (
    # modeled ops of retime synth: <layer>.<block>.<op>.<pass>
    (re.compile(r"(^|\.)(qkv|proj|fc1|fc2|logits)\.(fwd|bwd)"), _C.GEMM),
    (re.compile(r"(^|\.)attn\.(scores|context|softmax|flash)\.(fwd|bwd)"), _C.ATTENTION),
    (re.compile(r"(^|\.)(attn|mlp|head)\.norm\.(fwd|bwd)"), _C.NORM),
    (re.compile(r"(^|\.)(attn|mlp|embed)\.(dropout|residual|act|rotary)\.(fwd|bwd)"),
     _C.ELEMENTWISE),
    (re.compile(r"(^|\.)embed\.lookup\.(fwd|bwd)"), _C.EMBEDDING),
    (re.compile(r"(^|\.)head\.cross_entropy\.(fwd|bwd)"), _C.REDUCTION),
    (re.compile(r"^(recompute\.)?optimizer\.\w+$|^optimizer$"), _C.OPTIMIZER),
    # local kernels of communication libraries (DeepEP's token counting per rank and
    # expert): before the communication rules
    (re.compile(r"get_dispatch_layout", _I), _C.REDUCTION),
    # communication (kernels that are not NCCL-named too)
    (re.compile(r"^(void\s+)?(nccl|rccl|msccl)|\bnccl(Dev)?Kernel|\brccl", _I), _C.COMMUNICATION),
    (re.compile(r"multimem_|symmetric_memory::|\bnvls\b|nvshmem|mscclpp|userbuffers|"
                r"deep_?ep::|dpsk::ep::|\bpplx\b|cross_device_reduce|custom_?all_?reduce|"
                r"one_?shot_?all_?reduce|two_?shot_?all_?reduce|lamport|\bc10d::|^gloo:|"
                r"all[-_]?reduce|all[-_]?gather|reduce[-_]?scatter|all[-_]?to[-_]?all|"
                r"(^|[-.])(send|recv)$", _I),
     _C.COMMUNICATION),
    # memory traffic issued as kernels
    (re.compile(r"^memcpy|^memset|\bmemcpy\b|\bmemset\b|\[CUDA mem(cpy|set)|"
                r"__amd_rocclr_(copy|fill)|rocclr.*(copy|fill)Buffer", _I), _C.MEMORY),
    # attention
    (re.compile(r"flash|fmha|attention|_attn|attn_|sdpa|\bmha\b|xformers", _I),
     _C.ATTENTION),
    # the streaming helpers of a flash backward (cuDNN: dot(dO, O) per row, the fp32 dQ
    # accumulator's conversion; FlashAttention-2: flash_bwd_dot_do_o / convert_dq, caught above)
    (re.compile(r"compute_dot_do_o|convert_dq_to_16bits", _I), _C.ATTENTION),
    # PyTorch's embedding backward (EmbeddingBackwardKernel.cu): sort-and-segment kernels
    (re.compile(r"compute_grad_weight|krn_partials?_|embedding_backward", _I), _C.EMBEDDING),
    # convolution (implicit GEMM included): before GEMM
    (re.compile(r"conv(?!ert)|winograd|implicit_?convolve|scudnn|hcudnn|xcudnn|\d{3,5}cudnn|fprop|dgrad|"
                r"wgrad|\bigemm_(fwd|bwd|wrw)|MIOpenConv|naive_conv|cask_cudnn|cudnn::cnn|"
                r"cutlass_cudnn", _I), _C.CONV),
    # matrix multiplies
    (re.compile(r"(?<!fb)gemm|gemv|cutlass|cublas|nvjet|hipblas|rocblas|Cijk_|matmul|\bmm\b|bmm|"
                r"xmma|wmma|magma|splitKreduce|triton_tem_fused|fused_moe_kernel|"
                r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear)$", _I), _C.GEMM),
    # normalization
    (re.compile(r"layer_?norm|rms_?norm|group_?norm|instance_?norm|batch_?norm|\bbn_(fw|bw)|"
                r"GammaBetaBackward|cuApply(Layer|RMS)Norm|cuComputeGradInput|"
                r"cuComputePartGradGammaBeta|cuComputeGradGammaBeta|normalization::", _I),
     _C.NORM),
    # rotary position embeddings are pointwise math, not lookups
    (re.compile(r"rotary|\brope\b|_rope_", _I), _C.ELEMENTWISE),
    (re.compile(r"embedding|embed_|EmbeddingBag|bounds_check_indices", _I), _C.EMBEDDING),
    (re.compile(r"multi_tensor_apply|_foreach_|adam|adagrad|\blamb\b|lamb_|_sgd|sgd_|"
                r"optimizer", _I), _C.OPTIMIZER),
    (re.compile(r"max_?pool|avg_?pool|adaptive_\w*pool|adaptive_average|pooling", _I),
     _C.POOLING),
    (re.compile(r"transpose|permute|nchw_?to_?nhwc|nhwc_?to_?nchw|NCHW2|CNHW2|NHWC2|"
                r"CatArray|concat|im2col|col2im|channel_shuffle|pixel_shuffle", _I),
     _C.LAYOUT),
    (re.compile(r"reduce|reduction|softmax|logsumexp|nll_loss|cross_?entropy|welford|topk|"
                r"top_k|sort|argmax|argmin|cumsum|cumprod|\bscan|triton_red_|triton_per_|"
                r"norm_kernel|histogram|bincount", _I), _C.REDUCTION),
    (re.compile(r"elementwise|pointwise|Functor|fill|copy|cast|dropout|triton_poi_|gelu|silu|"
                r"swiglu|relu|sigmoid|tanh|clamp|masked|index|gather|scatter|arange|philox|"
                r"bernoulli|SubTensorOp|OpTensor|compare", _I), _C.ELEMENTWISE),
)

_COMM_RULES = tuple(p for p, c in RULES if c == _C.COMMUNICATION)
# every communication rule needs one of these words (lower case): a quick pre-check, as
# kernel names are long (templates) and most are not communication
_COMM_WORDS = ("nccl", "rccl", "msccl", "multimem", "symmetric_memory", "nvls", "nvshmem",
               "userbuffers", "deep_ep", "deepep", "dpsk", "pplx", "cross_device", "reduce",
               "gather", "scatter", "to_all", "toall", "to-all", "c10d", "gloo", "send",
               "recv", "lamport")


#: kernels of communication libraries that move no data between ranks
_LOCAL = re.compile(r"get_dispatch_layout", _I)


@lru_cache(maxsize=1 << 16)
def classify_name(name: str) -> KernelClass:
    """The class of one kernel (or op) name; :attr:`KernelClass.OTHER` when no rule knows
    it."""
    for pat, cls in RULES:
        if pat.search(name):
            return cls
    return KernelClass.OTHER


def classify_names(names: Iterable[str]) -> np.ndarray:
    """:func:`classify_name` of each name: int8 array of :class:`KernelClass` values."""
    return np.fromiter((int(classify_name(str(n))) for n in names), np.int8)


def is_comm_kernel(name: str) -> bool:
    """Whether a GPU kernel of this name is communication (ingest makes it a collective).

    Only the communication rules are tried, so a synth-style name never counts."""
    low = name.lower()
    if not any(w in low for w in _COMM_WORDS):
        return False
    if _LOCAL.search(name):
        return False
    return any(p.search(name) for p in _COMM_RULES)


def op_classes(kind: np.ndarray, name_id: np.ndarray, strings: list[str] | np.ndarray,
               by_name: np.ndarray | None = None) -> np.ndarray:
    """Class of every op (int8 :class:`KernelClass`): collective/p2p ops are communication
    and memcpy/memset memory whatever their name; other ops take their name's class
    (``by_name``: :func:`classify_names` of ``strings`` when already known)."""
    name_id = np.asarray(name_id)
    if by_name is None:  # only the names the ops use
        by_name = np.full(len(strings), int(_C.OTHER), np.int8)
        used = np.unique(name_id) if len(name_id) else np.zeros(0, np.int64)
        by_name[used] = classify_names([strings[i] for i in used.tolist()])
    cls = (by_name[name_id] if len(name_id) else np.zeros(0, np.int8)).copy()
    kind = np.asarray(kind)
    cls[(kind == OpKind.COLLECTIVE) | (kind == OpKind.P2P)] = int(_C.COMMUNICATION)
    cls[(kind == OpKind.MEMCPY) | (kind == OpKind.MEMSET)] = int(_C.MEMORY)
    return cls
