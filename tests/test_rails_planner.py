"""deepkernels.rails: the TMEM planner, the seed's §3.1 resource table and the `rails plan` command."""
import argparse
import io
import subprocess
import sys

import pytest

from deepkernels.rails import (DecodeConfig, TmemOverflowError, format_resource_table, plan_tmem, qk_resources,
                               resource_table)
from deepkernels.rails.cli import add_rails_parser, main

pytestmark = pytest.mark.reference


def test_seed_resource_table_numbers():
    """shared/seeds/multi-rail-gemm.zh.txt §3.1 (T = 64, D = 512, 64 heads): every cell."""
    off, mr = resource_table(DecodeConfig(heads=64, d=512, topk_block=64, rails=2))
    assert (off.mma_shape, mr.mma_shape) == ("64×64×512", "64×128×256")
    assert (off.k_per_instruction, off.instructions, mr.instructions) == (16, 32, 16)
    assert (off.multiplies_per_instruction, mr.multiplies_per_instruction) == (65_536, 131_072)
    assert off.multiplies_total == mr.multiplies_total == 2_097_152
    assert (off.q_columns, mr.q_columns) == (256, 128)
    assert (off.p_columns, mr.p_columns) == (32, 64)
    assert (off.reduce_needed, mr.reduce_needed) == (False, True)
    assert mr.p_postprocessing == "needs P0 + P1"
    # seed §3.2: Q saves 128 columns, one P costs 32 more, net 96
    assert (off.q_columns - mr.q_columns, mr.p_columns - off.p_columns) == (128, 32)
    assert (off.q_columns + off.p_columns) - (mr.q_columns + mr.p_columns) == 96


def test_seed_resource_table_rendering():
    lines = format_resource_table(resource_table()).splitlines()
    cells = {ln.split("  ")[0]: ln.split() for ln in lines[2:]}
    assert lines[0].split("  ")[0] == "item" and "official .ws" in lines[0] and "multi-rail (2 rails)" in lines[0]
    assert cells["MMA shape (M×N×K)"][-2:] == ["64×64×512", "64×128×256"]
    assert cells["instructions (K=16 each)"][-2:] == ["32", "16"]
    assert cells["multiplies per instruction"][-2:] == ["65,536", "131,072"]
    assert cells["multiplies in total"][-2:] == ["2,097,152", "2,097,152"]
    assert cells["Q TMEM columns per lane group"][-2:] == ["256", "128"]
    assert cells["one P, TMEM columns per lane group"][-2:] == ["32", "64"]
    assert lines[-1].endswith("read back, ready to use  needs P0 + P1")


def test_head64_decode_layout():
    """docs/spec/mla.md §8.4, FlashMLA sm100 head64 decode: O 0–255, Q 256–383 (RoPE tail 384–399), P 400–463."""
    plan = plan_tmem(DecodeConfig(heads=64, d=512, d_rope=64, dtype="bf16", topk_block=64, rails=2))
    spans = {r.name: r.span for r in plan.regions}
    assert spans == {"O": "0–255", "Q": "256–383", "Q_rope": "384–399", "P": "400–463"}
    assert [r.name for r in plan.regions] == ["O", "Q", "Q_rope", "P"]
    assert (plan.region("P").start, plan.used_columns, plan.allocated_columns) == (400, 464, 512)
    text = plan.format()
    assert "O       0–255" in text and "P       400–463" in text and "used 464 of 512" in text


def test_fused_core_attn_layout_with_two_p_buffers():
    """docs/spec/mla.md §8.4 fused core-attn (d_qk 512): O 0, Q 256 (128 wide), P_0 384, P_1 448."""
    plan = plan_tmem(DecodeConfig(d_rope=0, p_buffers=2))
    assert [(r.name, r.start, r.columns) for r in plan.regions] == [
        ("O", 0, 256), ("Q", 256, 128), ("P0", 384, 64), ("P1", 448, 64)]
    assert plan.used_columns == 512


def test_refuses_layouts_over_512_columns():
    with pytest.raises(TmemOverflowError, match="needs 576 TMEM columns .*Q 256–511.*a CTA has 512"):
        plan_tmem(DecodeConfig(rails=1))                           # official: O + Q already fill 512 (seed §1.5)
    with pytest.raises(ValueError, match="needs 544"):
        plan_tmem(DecodeConfig(rails=1, d_rope=0))
    with pytest.raises(ValueError, match="^config: needs"):
        plan_tmem(DecodeConfig(heads=128, rails=1))                 # O alone takes 512 columns
    with pytest.raises(ValueError, match="^config: needs 576"):
        plan_tmem(DecodeConfig(d_rope=0, p_buffers=3))


def test_32_heads_four_rails():
    c = DecodeConfig(heads=32, topk_block=64, rails=4)
    r = qk_resources(c)
    assert (r.mma_shape, r.instructions, r.q_columns, r.p_columns) == ("32×256×128", 8, 64, 64)
    assert r.p_postprocessing == "needs P0 + P1 + P2 + P3"
    plan = plan_tmem(c)
    assert [(x.name, x.start, x.columns) for x in plan.regions] == [
        ("O", 0, 128), ("Q", 128, 64), ("Q_rope", 192, 8), ("P", 200, 64)]
    assert resource_table(DecodeConfig(rails=1))[0].filling == "official .ws"


@pytest.mark.parametrize("kw, match", [
    (dict(heads=48), "^heads must"),
    (dict(dtype="fp8"), "^dtype must"),
    (dict(rails=3), "^rails must divide the 2 lane groups"),
    (dict(rails=4), "^rails must divide"),
    (dict(topk_block=96), "^topk_block: N = rails·topk_block = 2·96"),
    (dict(topk_block=256), "^topk_block"),
    (dict(d=576), "^d must be a positive multiple of rails·64 = 128"),
    (dict(d_rope=8), "^d_rope must"),
    (dict(p_buffers=0), "^p_buffers must"),
])
def test_config_errors_name_the_field(kw, match):
    with pytest.raises(ValueError, match=match):
        DecodeConfig(**kw)


def test_cli_plan_prints_plan_and_table(capsys):
    assert main(["plan", "--heads", "64", "--d", "512", "--topk-block", "64"]) == 0
    out = capsys.readouterr().out
    assert "P       400–463" in out and "64×128×256" in out and "2,097,152" in out and "needs P0 + P1" in out


def test_cli_refused_plan_exits_2_but_prints_the_table(capsys):
    assert main(["plan", "--rails", "1"]) == 2
    out = capsys.readouterr().out
    assert "error: config: needs 576 TMEM columns" in out and "64×64×512" in out
    assert main(["plan", "--topk-block", "96"]) == 2
    assert "error: topk_block" in capsys.readouterr().out


def test_cli_registers_on_a_parent_parser():
    parser = argparse.ArgumentParser(prog="deepkernels")
    add_rails_parser(parser.add_subparsers(dest="cmd"))
    args = parser.parse_args(["rails", "plan", "--heads", "64", "--d", "512", "--topk-block", "64"])
    buf = io.StringIO()
    from deepkernels.rails.cli import run_plan
    assert args._rails_func is run_plan and run_plan(args, out=buf) == 0
    assert "Q       256–383" in buf.getvalue()


def test_module_entry_point():
    r = subprocess.run([sys.executable, "-m", "deepkernels.rails", "plan", "--heads", "64", "--d", "512",
                        "--topk-block", "64"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "P       400–463" in r.stdout
