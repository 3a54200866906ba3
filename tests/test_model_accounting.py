"""KV-cache accounting (the seed's table, exactly) and the decode roofline."""
import math

import pytest

from deepkernels.model import MLAConfig
from deepkernels.model.kv_accounting import format_bytes, kv_bytes_per_token, kv_cache_bytes, seed_table
from deepkernels.model.roofline import GPUS, attention_intensity, main, mla_decode_ops

pytestmark = pytest.mark.reference


def test_seed_table_reproduced():
    rows = {r.scheme: r for r in seed_table()}
    # seed §6 "cache 账本" + §8/§10: 64 KiB, 4 KiB, 512 B, 1152 B (1.125 KiB), 656 B, 528 B, 288 B
    expect = {"mha": (65536, "64 KiB", "1×"), "gqa": (4096, "4 KiB", "1/16"), "mqa": (512, "512 B", "1/128"),
              "mla": (1152, "1152 B", "1/57"), "v32": (656, "656 B", "1/100"), "model1": (584, "584 B", "1/112"),
              "v41": (528, "528 B", "1/124"), "fp4": (288, "288 B", "1/228")}
    for k, (nbytes, text, ratio) in expect.items():
        assert rows[k].bytes_per_token == nbytes and format_bytes(nbytes) == text and rows[k].ratio_str == ratio, k
    assert rows["mla"].bytes_per_token / 1024 == 1.125
    assert kv_bytes_per_token("bf16") == kv_bytes_per_token("mla") == 576 * 2
    # the seed's prose "8 groups = 8 KiB, 8x smaller" disagrees with its own table: 8 KV heads are 4 KiB, 1/16
    assert kv_bytes_per_token("gqa", groups=8) == 4 * 1024 and 65536 // 4096 == 16
    # "61 layers ~3.9 MiB/token, 128K context 500 GB": 3.81 MiB (4.0 MB); 488 GiB = 524 GB
    per_tok = kv_cache_bytes("mha", tokens=1, layers=61)
    assert per_tok / 2**20 == pytest.approx(3.8125) and per_tok / 1e6 == pytest.approx(3.998, abs=1e-3)
    assert kv_cache_bytes("mha", tokens=128 * 1024) / 2**30 == pytest.approx(488.0)
    with pytest.raises(ValueError, match="unknown KV scheme"):
        kv_bytes_per_token("mla-fp2")
    with pytest.raises(ValueError, match="groups"):
        kv_bytes_per_token("gqa", groups=7)


def test_roofline_balance_and_verdicts():
    assert GPUS["h800"].balance() == pytest.approx(989 / 3.35)          # 295 FLOP/B (seed §1 table)
    assert 865 / 3.35 == pytest.approx(258.2, abs=0.1)                  # the seed's down-clocked figure
    assert GPUS["h200"].balance() == pytest.approx(206.0, abs=0.1)
    assert GPUS["b200"].balance() == pytest.approx(281.25)
    # decode intensity: exact long-context limit h_q·s_q·(576+512)/576 ≈ 1.89·h_q·s_q (≈ 2·h_q·s_q)
    assert attention_intensity(128, 1) == pytest.approx(128 * 1088 / 576)
    assert attention_intensity(128, 1, "v32") == pytest.approx(2 * 128 * 1088 / 656)
    ops = {o.op.split(" ")[0]: o for o in mla_decode_ops(MLAConfig.deepseek_v3(), b=64, s_q=1, s_k=65536)}
    att = ops["flash_mla"]
    assert att.flops == 2 * 64 * 128 * 65536 * 1088
    assert att.verdict(GPUS["h200"]) == "compute-bound"
    assert att.verdict(GPUS["h800"]) == "memory-bound"                 # 241 < 295 (and < 258): see notes
    small = {o.op.split(" ")[0]: o for o in mla_decode_ops(MLAConfig.deepseek_v3(num_heads=16), 64, 1, 65536)}
    assert small["flash_mla"].verdict(GPUS["h200"]) == "memory-bound"
    assert ops["o_proj"].flops == 2 * 64 * 7168 * 16384 and ops["o_proj"].verdict(GPUS["h200"]) == "memory-bound"
    t = att.time_us(GPUS["h200"])
    assert t == pytest.approx(att.flops / 989e12 * 1e6)
    with pytest.raises(ValueError):
        mla_decode_ops(MLAConfig.deepseek_v3(), 0, 1, 1)


def test_roofline_cli(capsys):
    assert main(["--gpu", "h200", "--heads", "128", "--s-q", "1"]) == 0
    out = capsys.readouterr().out
    assert "206" in out and "compute-bound" in out and "2·h_q·s_q = 256" in out
