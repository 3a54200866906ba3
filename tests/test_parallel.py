"""Tensor-parallel MLA and expert-parallel MoE (deepkernels.parallel): 2 ranks equal 1 rank.

Multi-process tests run 2 processes on the CPU with gloo (torch.multiprocessing spawn, a free port, a hard timeout;
each process destroys its process group). With CPU tensors every deepkernels op runs its PyTorch reference, so
these exercise the whole layer: sharding, all_reduce, the all_to_all dispatch/combine and the masked layout.
"""
import pytest
import torch

from deepkernels.model import MLAAttention, PagedLatentCache
from deepkernels.parallel import (DistributedRunError, EPMoE, MoEConfig, MoELayer, TPMLAAttention, checks,
                                  head_range, masked_grouped_ops, moe_reference, shard_mla_state_dict,
                                  spawn_distributed)
from deepkernels.parallel.launch import MULTICAST_OFF_ENV, free_port

pytestmark = pytest.mark.reference

TIMEOUT_S = 120  # per spawned job; a hang fails the test instead of stalling CI


def _need_masked():
    try:
        masked_grouped_ops()
    except NotImplementedError as e:
        pytest.skip(str(e))


SMALL_MOE = MoEConfig(hidden_size=256, moe_intermediate_size=128, n_routed_experts=8, num_experts_per_tok=2)


# ---------------------------------------------------------------------------------------------- single process
def test_head_range_and_shard_shapes():
    cfg = checks.small_mla_config(num_heads=8)
    assert head_range(8, 1, 2) == (4, 8) and head_range(8, 3, 4) == (6, 8)
    with pytest.raises(ValueError, match="divisible"):
        head_range(8, 0, 3)
    with pytest.raises(ValueError, match="rank"):
        head_range(8, 2, 2)
    full = MLAAttention(cfg, dtype=torch.bfloat16)
    sd = full.state_dict()
    part = shard_mla_state_dict(sd, cfg, 1, 2)
    assert part["q_b_proj.weight"].shape == (4 * cfg.qk_head_dim, cfg.q_lora_rank)
    assert torch.equal(part["kv_b_proj.weight"], sd["kv_b_proj.weight"][4 * 64:])
    assert torch.equal(part["o_proj.weight"], sd["o_proj.weight"][:, 4 * 32:])
    assert part["kv_a_proj_with_mqa.weight"] is sd["kv_a_proj_with_mqa.weight"]     # replicated, not copied
    with pytest.raises(KeyError, match="o_proj"):
        shard_mla_state_dict({k: v for k, v in sd.items() if k != "o_proj.weight"}, cfg, 0, 2)
    with pytest.raises(ValueError, match="absorbed"):
        TPMLAAttention(MLAAttention(cfg, dtype=torch.float32), 1)


@pytest.mark.parametrize("world_size", [2, 4])
def test_tp_partials_sum_to_one_rank(world_size):
    """No process group: each rank's partial o_proj output (reduce=False, float32), summed, equals the 1-rank layer.

    Not bit-exact in general: the head count changes the BLAS path of the per-head einsums, and q̃ (rounded to bf16
    before FlashMLA) or a head's output can then round the other way; measured ≤ 3e-4 (usually ~5e-8)."""
    cfg = checks.small_mla_config(num_heads=8)
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    full = checks._build_mla(cfg, gen, "cpu", 0.1)
    one = TPMLAAttention.from_full(full, 0, 1)
    parts = [TPMLAAttention.from_full(full, r, world_size) for r in range(world_size)]
    c1, c2 = (PagedLatentCache(2, 96, 576, "bf16") for _ in range(2))
    for s in (33, 1, 2):
        hidden = torch.randn(2, s, cfg.hidden_size).bfloat16()
        y1 = one(hidden, c1, reduce=False)                          # float32, the whole o_proj
        lens = c2.cache_seqlens.clone()
        partial = []
        for p in parts:  # every rank appends the same latent rows to its own copy: rewind between ranks
            c2.cache_seqlens.copy_(lens)
            partial.append(p(hidden, c2, reduce=False))
        assert all(p.last_route == "dense" for p in parts)
        y = torch.stack(partial).sum(0)
        assert checks.rel_l2(y, y1) < 1e-3, (s, checks.rel_l2(y, y1))
        assert checks.within_bf16_ulp(checks._cmp(y.bfloat16(), y1.bfloat16())), s


def test_moe_one_rank_matches_reference():
    _need_masked()
    layer = MoELayer(SMALL_MOE).reset_parameters()
    with torch.no_grad():
        layer.e_score_correction_bias[5] = -1e4                     # expert 5 never chosen
    x = torch.randn(19, SMALL_MOE.hidden_size).bfloat16()
    ep = EPMoE(layer, 0, 1)
    y, ref = ep(x), moe_reference(layer, x)
    assert ep.last_stats["masked_m"][5] == 0 and sum(ep.last_stats["masked_m"]) == 19 * 2
    assert checks.rel_l2(y, ref) < 1e-3
    y8 = EPMoE(layer, 0, 1, backend="fp8")(x)
    assert checks.rel_l2(y8, ref) < 0.12                            # e4m3 activations and weights, two GEMMs
    assert EPMoE(layer, 0, 1)(x[:0]).shape == (0, SMALL_MOE.hidden_size)


def test_moe_validation():
    with pytest.raises(ValueError, match="multiple of 64"):
        MoEConfig(hidden_size=100)
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        MoEConfig(n_routed_experts=4, num_experts_per_tok=5)
    layer = MoELayer(SMALL_MOE)
    with pytest.raises(ValueError, match="world_size"):
        EPMoE(layer, 0, 3)
    with pytest.raises(ValueError, match="backend"):
        EPMoE(layer, 0, 1, backend="fp4")
    with pytest.raises(ValueError, match=r"\[T, 256\]"):
        EPMoE(layer, 0, 1)(torch.zeros(2, 3, 256, dtype=torch.bfloat16))


# ---------------------------------------------------------------------------------------------- 2 processes, gloo
def test_tp_mla_two_ranks_equal_one_rank():
    # BF16 cache: dense decode at 4 heads per rank; V3.2 FP8 cache: FlashMLA's sparse decode at 16 heads per rank
    # (its head counts are 16/32/64/128), per-query index lists of every visible token
    cases = [("tp_mla", dict(fmt="bf16")),
             ("tp_mla", dict(cfg=checks.small_mla_config(32), fmt="v32", route="sparse", prefill=(9, 66),
                             steps=(1, 2)))]
    res = spawn_distributed(checks.run_cases, 2, args=("cpu", cases), backend="gloo", timeout_s=TIMEOUT_S)
    for case in res[0]:
        assert "error" not in case, case
        assert case["heads_per_rank"] == (4 if case["fmt"] == "bf16" else 16)
        for row in case["steps"]:
            assert "error" not in row, row
            assert row["ranks_agree_max_abs"] == 0.0, row                 # every rank holds the reduced output
            assert row["route"] == row["route_1rank"] == ("dense" if case["fmt"] == "bf16" else "sparse"), row
            # same math, only the head split and the all-reduce order differ
            # (up to bf16 rounding flips of intermediates: see test_tp_partials_sum_to_one_rank)
            assert row["vs_1rank"]["rel_l2"] < 1e-3 and checks.within_bf16_ulp(row["vs_1rank"]), row
            assert row["vs_unsharded"]["rel_l2"] < 1e-3, row              # the model's own absorbed forward


def test_ep_moe_two_ranks_equal_single_process():
    _need_masked()
    cases = [("ep_moe", dict(tokens=(5, 11), dead_experts=(3,))),        # uneven tokens, an expert with 0 rows
             ("ep_moe", dict(tokens=(0, 9), dead_experts=(0, 6))),       # a rank with no tokens
             ("ep_moe", dict(tokens=(6, 3), dead_experts=(4, 5, 6, 7))),  # rank 1 receives nothing
             ("ep_moe", dict(tokens=(7, 4), dead_experts=(2,), backend="fp8"))]
    res = spawn_distributed(checks.run_cases, 2, args=("cpu", cases), backend="gloo", timeout_s=TIMEOUT_S)
    for case in res[0]:
        assert "error" not in case, case
        assert case["dead_expert_rows"] == [0] * len(case["dead_experts"]), case
        # same expert math, rows moved around: bit-identical but for rare bf16 rounding flips (torch's CPU matmul
        # blocking depends on the row count; CI at 87ef13e saw one flip: rel_l2 1.6e-4, seed 121045181994560)
        vs1 = case["vs_1rank"]
        assert vs1["rel_l2"] < 1e-3 and checks.within_bf16_ulp(vs1) and vs1["identical_frac"] > 0.99, case
        assert case["vs_reference"]["rel_l2"] < (0.12 if case["backend"] == "fp8" else 1e-3), case
        stats = case["stats"]
        assert sum(sum(s["sent"]) for s in stats) == sum(case["tokens"]) * SMALL_MOE.num_experts_per_tok
        assert [sum(s["received"]) for s in stats] == [sum(s["masked_m"]) for s in stats]
    assert sum(res[0][2]["stats"][1]["received"]) == 0


def _fails_on_rank1(rank, world_size):
    import os

    import torch.distributed as dist
    assert all(os.environ[k] == v for k, v in MULTICAST_OFF_ENV.items())
    if rank == 1:
        raise ValueError("boom on rank 1")
    dist.barrier()  # the peer is gone: must fail (or time out), not hang the test
    return rank


def test_spawn_reports_a_failed_rank():
    with pytest.raises(DistributedRunError, match="boom on rank 1"):
        spawn_distributed(_fails_on_rank1, 2, backend="gloo", timeout_s=30)
    assert 0 < free_port() < 65536
