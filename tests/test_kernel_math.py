"""Math mode from kernel names (collectors/kernel_math.py): a corpus of real GEMM, convolution
and attention kernel names classified by hand (tests/data/kernel_math_names.tsv: every such
name of the shared traces plus names from public NVIDIA/AMD profiles)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from retime.collectors.kernel_classes import CLASS_NAMES, classify_name
from retime.collectors.kernel_math import MODE_NAMES, MathMode, math_mode, math_modes

DATA = Path(__file__).parent / "data"


def _rows(path: Path, ncol: int) -> list[tuple[str, ...]]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            parts = tuple(line.split("\t"))
            assert len(parts) == ncol, line[:80]
            out.append(parts)
    return out


ROWS = _rows(DATA / "kernel_math_names.tsv", 3)


@pytest.mark.parametrize("mode,src,name", ROWS, ids=[f"{r[1]}:{r[2][:40]}" for r in ROWS])
def test_name_has_its_mode(mode, src, name):
    assert MODE_NAMES[math_mode(name)] == mode


def test_corpus_covers_every_shared_gemm_conv_and_attention_kernel():
    # every GEMM / conv / attention kernel of the shared traces (kernel_names.tsv lists every
    # distinct device-op name of them; test_kernel_classes checks that) has a hand-set mode
    ours = {r[2] for r in ROWS}
    shared = {n for c, kind, src, n in _rows(DATA / "kernel_names.tsv", 4)
              if src.startswith("shared:") and kind == "KERNEL"
              and c in ("GEMM", "conv", "attention")}
    assert len(shared) == 124  # 120 in the Kineto files + 4 in the nsys export (raw scan)
    assert shared - ours == set()


def test_mode_counts_of_the_shared_traces():
    # counted by hand from the listing of the shared traces' GEMM/conv kernel names:
    # V100 DDP-SGD: 16 volta_sgemm + magma_sgemmEx fp32 (its 5 volta_sgemm names that DLRM
    # also runs are listed under DLRM), 3 helpers (2 split-K, 1 epilogue);
    # A100 DDP CNN: 6 cutlass s1688gemm + 21 tf32 convolutions (10 xmma tf32f32, 9 cutlass
    # s1688 fprop/dgrad/wgrad, 2 ImplicitGemmConvolution<tfloat32_t>), 4 fp32 (2
    # ampere_sgemm, cutlass simt_sgemm, scudnn; a100-event-sync's ampere_sgemm is separate),
    # 5 helpers (2 split-K, ReduceSplitK, reduce_wgrad, computeOffsets)
    by_src: dict[str, dict[str, int]] = {}
    for mode, src, _name in ROWS:
        by_src.setdefault(src, {}).setdefault(mode, 0)
        by_src[src][mode] += 1
    assert by_src["shared:v100-ddp-sgd"] == {"fp32": 17, "none": 3}
    assert by_src["shared:a100-ddp-nccl"] == {"tf32": 27, "fp32": 4, "none": 5}
    assert by_src["shared:h100-vgg13"]["tf32"] == 16
    assert by_src["shared:h100-vgg13"]["fp32"] == 7
    assert set(by_src["shared:mi300x-resnet-ddp"]) == {"bf16"}


@pytest.mark.parametrize("name,mode", [
    # number formats in the name win over the SIMT spelling of the storage type
    ("sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x32", "tf32"),
    ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma", "fp32"),
    # Turing's s1688 with a 16-bit type is fp16; Ampere's without one is TF32
    ("turing_fp16_s1688gemm_fp16_128x128_ldg8_f2f_tn", "fp16"),
    ("cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4", "tf32"),
    # a split-K reduction of a TF32 GEMM does no matrix math
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, float>", "none"),
    # the template's cuBLAS gemv parameter type does not make a small-N GEMM a gemv
    ("void gemmSN_TN_kernel<float, 128, 16, 2, 4, 8, 9, false, cublasGemvTensorStridedBatched"
     "<float const> >", "fp32"),
    # vLLM's KV-cache enum type name is no fp8 math
    ("void vllm::paged_attention_v2_kernel<__nv_bfloat16, __nv_bfloat16, 128, 16, 128, "
     "(vllm::Fp8KVCacheDataType)0, false, 512>", "bf16"),
    ("Cijk_Ailk_Bljk_SB_MT128x128x8_SE_K1", "fp32"),
    ("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN", "unknown"),
])
def test_precedence(name, mode):
    assert MODE_NAMES[math_mode(name)] == mode


def test_vectorized_and_enum():
    names = ["volta_sgemm_128x64_nn", "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_tn", "x"]
    got = math_modes(names)
    assert got.dtype == np.int8
    assert got.tolist() == [MathMode.FP32, MathMode.BF16, MathMode.UNKNOWN]
    assert len(MODE_NAMES) == len(MathMode)


def test_only_gemm_like_kernels_in_the_corpus():
    assert {CLASS_NAMES[classify_name(r[2])] for r in ROWS} <= {"GEMM", "conv", "attention"}
