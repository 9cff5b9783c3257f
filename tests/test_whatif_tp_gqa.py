"""``parallel.tp`` on grouped-query attention (issue 27, REFERENCES K36): each rank keeps
``H / t`` query heads and the ``H_kv / t`` key/value heads of their groups; ``H_kv % t``
refused. The minimal one-block Kineto file is :func:`test_whatif_tp._gpu_block_trace`."""

from __future__ import annotations

import pytest
from test_whatif_tp import _gpu_block_trace

from retime.collectors.costs.ops import op_cost
from retime.collectors.errors import PolicyError
from retime.replay import whatif
from retime.replay.policies.kernel_cost import shaped_kernels
from retime.replay.policies.tp_measured import split_dims, tp_layout


@pytest.mark.parametrize("qkv", ["fused", "q, k, v"])
def test_gpu_grouped_query_attention_splits_query_and_kv_heads(tmp_path, qkv):
    """GQA (16 query heads, 4 key/value heads of 64; K36 with Megatron's query groups): at
    TP=2 each rank runs 8 query and 2 key/value heads. Recount from the split shapes: every
    GEMM and the core lose exactly half their FLOPs, the core's bytes are
    ``2 (b H/t s d + 2 b H_kv/t s d + b H/t s d)`` (q, k, v read, the output written); a
    degree that divides 16 but not 4 is refused in one line."""
    from retime.collectors.ingest import read
    b, H, kv, s, d, m, h = 2, 16, 4, 1024, 64, 2048, 1024
    tr = read([_gpu_block_trace(tmp_path / "rank-0.pt.trace.json", qkv, kv=kv)])
    lay = tp_layout(tr, 2)
    (blk,) = lay.attention
    assert (blk["heads"], blk["kv_heads"], len(blk["qkv"])) == (H, kv, 1 if qkv == "fused" else 3)
    assert blk["core_bwd"]
    n = len(blk["qkv"])
    assert [L["kind"] for L in lay.layers] == ["column"] * n + ["row", "column", "row"]
    widths = [h + 2 * kv * d] if n == 1 else [h, kv * d, kv * d]
    assert [L["n"] for L in lay.layers[:n]] == widths
    sk = shaped_kernels(tr)
    split = {int(x): split_dims(sk.names[x], sk.dims[x], a, 2)
             for x, a in zip(lay.calls, lay.axis)}
    fwd = next(x for x in split if sk.names[x] == "aten::_scaled_dot_product_flash_attention")
    bwd = next(x for x in split if sk.names[x].endswith("attention_backward"))
    assert split[fwd][:3] == [[b, H // 2, s, d], [b, kv // 2, s, d], [b, kv // 2, s, d]]
    assert split[bwd][:6] == [[b, H // 2, s, d]] * 2 + [[b, kv // 2, s, d]] * 2 + \
        [[b, H // 2, s, d], [b, H // 2, s]]
    f, by, _ = op_cost(sk.names[fwd], split[fwd], sk.types[fwd])
    assert f == 4.0 * b * (H // 2) * s * s * d
    assert by == 2.0 * (b * (H // 2) * s * d * 2 + 2 * b * (kv // 2) * s * d)
    # the QKV projection: (H + 2 H_kv) d outputs, t-th of them per rank, 2 m h n per GEMM
    qkv_flops = sum(op_cost(sk.names[x], split[x], sk.types[x])[0]
                    for x in split if sk.names[x] in ("aten::addmm",)
                    and any(L["fwd"] == x for L in lay.layers[:n]))
    assert qkv_flops == 2.0 * m * h * (H + 2 * kv) * d / 2
    r = whatif(tr, {"parallel.tp": 2})
    fx = r.meta["scenario"][0]["tp_effect"]
    assert fx["flops_new"] == fx["flops_old"] / 2
    assert fx["split_calls"] == (n + 3) * 3 + 2
    a = " ".join(r.meta["whatif"]["assumed"])
    assert "16 -> 8 heads per rank in the attention core (grouped-query: 4 -> 2 key/value " \
        "heads per rank" in a
    assert whatif(tr, {"parallel.tp": 4}).meta["scenario"][0]["tp_effect"]["flops_new"] == \
        fx["flops_old"] / 4
    with pytest.raises(PolicyError, match=r"^parallel.tp=8 on a measured trace: its attention "
                       r"block \(QKV .*16 heads of 64, 4 key/value heads, rank 0\) is "
                       r"grouped-query.*num_query_groups divisible.* 8 does not divide 4; "
                       r"choose a degree that divides 4$"):
        tp_layout(tr, 8)


def test_split_heads_of_a_gqa_call_keeps_an_unsplit_mask():
    """An SDPA call with ``enable_gqa``: query 32 heads, key / value 8, a ``[b, 1, s, s]``
    mask broadcast over heads; at t = 4: 8 and 2 heads, the mask untouched."""
    from retime.replay.policies.tp_attention import kv_heads, split_heads
    q, k, mask = [1, 32, 128, 128], [1, 8, 128, 128], [1, 1, 128, 128]
    name = "aten::scaled_dot_product_attention"
    dims = [q, k, k, mask, [], [], []]
    assert kv_heads(name, dims) == 8
    assert split_heads(dims, 4, 8)[:4] == [[1, 8, 128, 128], [1, 2, 128, 128],
                                          [1, 2, 128, 128], mask]


def test_eager_gqa_with_repeated_kv_reads_the_groups_from_the_projection(tmp_path):
    """Eager attention after ``repeat_kv`` (the batched GEMMs over ``b H``, 16 heads) behind a
    fused projection of ``(16 + 2 x 4) x 64`` outputs: 4 key/value heads, split 2 per rank
    at TP=2 with the projection's columns; every split call exactly half its FLOPs."""
    from retime.collectors.ingest import read
    tr = read([_gpu_block_trace(tmp_path / "rank-0.pt.trace.json", "fused", "bmm", kv=4)])
    lay = tp_layout(tr, 2)
    (blk,) = lay.attention
    assert (blk["axis"], blk["heads"], blk["kv_heads"]) == ("b", 16, 4)
    assert lay.layers[0]["n"] == (16 + 2 * 4) * 64
    fx = whatif(tr, {"parallel.tp": 2}).meta["scenario"][0]["tp_effect"]
    assert fx["flops_new"] == fx["flops_old"] / 2
    with pytest.raises(PolicyError, match=r"8 does not divide 4"):
        tp_layout(tr, 8)
