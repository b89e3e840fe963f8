"""Long context: length distributions (padding, packing with and without a document mask, grouping),
the causal mask's work, and context parallelism (memory saving, K/V ring); numbers derived here."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ratrain import cli
from ratrain.cost.terms import attention_and_linear_ms, cost_terms, load_profile, pipeline_costs
from ratrain.errors import ConfigError
from ratrain.sim.simulator import simulate
from ratrain.spec.lengths import LengthDistribution, causal_pairs, plan_lengths, read_lengths
from ratrain.spec.memory import stage_memory
from ratrain.spec.models import get_model
from ratrain.spec.parallel import ParallelConfig
from ratrain.spec.platform import TrainingPlatform

S = 2048


@pytest.fixture(scope="module")
def llama():
    spec = get_model("llama2-7b")
    platform = TrainingPlatform()
    return spec, platform, load_profile(spec, 1, S, 1, source="roofline", platform=platform)


# ---------------------------------------------------------------- length files

def test_length_file_list_histogram_and_comments(tmp_path):
    path = tmp_path / "lengths.txt"
    path.write_text("# documents\n512\n\n1024 3  # a histogram row\n2048, 2\n")
    assert read_lengths(path) == [512, 1024, 1024, 1024, 2048, 2048]


@pytest.mark.parametrize("text,where", [("512\n0\n", ":2: length must be a positive"),
                                        ("512 -3\n", ":1: count must be a positive"),
                                        ("5x\n", ":1: length '5x' is not an integer"),
                                        ("# nothing\n", "no lengths")])
def test_bad_length_files_name_the_line(tmp_path, text, where):
    path = tmp_path / "lengths.txt"
    path.write_text(text)
    with pytest.raises(ConfigError, match=where):
        read_lengths(path)


def test_cli_bad_length_file_is_one_line_exit_2(tmp_path, capsys):
    path = tmp_path / "lengths.txt"
    path.write_text("1024\n-5\n")
    for argv in (["simulate", "--model", "llama2-7b", "--profile", "roofline", "--seq-lengths", str(path)],
                 ["simulate", "--model", "llama2-7b", "--profile", "roofline", "--cp", "3"],
                 ["memory", "--model", "llama2-7b", "--cp", "3", "--seq", "2048"]):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err


# ---------------------------------------------------------------- the mask's work

def test_causal_pairs():
    assert [causal_pairs(s) for s in (1, 2, 3, 2048)] == [1, 3, 6, 2048 * 2049 // 2]


def test_unequal_lengths_cost_more_than_their_tokens_say():
    # two documents of 3S/4 and S/4 hold as many tokens as two of S/2, but more causal pairs
    skewed = plan_lengths([3 * S // 4, S // 4], S, 2, 1, "pad", "mask").microbatches[0]
    even = plan_lengths([S // 2, S // 2], S, 2, 1, "pad", "mask").microbatches[0]
    assert skewed.tokens_real == even.tokens_real == S
    assert skewed.pairs_real == causal_pairs(3 * S // 4) + causal_pairs(S // 4) > even.pairs_real


def test_packing_with_and_without_a_document_mask():
    docs = [S // 2, S // 4, S // 4]                   # one packed sequence of S tokens
    masked = plan_lengths(docs, S, 1, 1, "pack-masked", "mask").microbatches[0]
    assert masked.pieces == ((S // 2, S // 4, S // 4),)
    assert masked.pairs_executed == causal_pairs(S // 2) + 2 * causal_pairs(S // 4)
    whole = plan_lengths(docs, S, 1, 1, "pack", "mask").microbatches[0]
    assert whole.pairs_executed == causal_pairs(S)    # no document mask: causal over the whole sequence
    # the emulated kernel knows no document mask: it computes the causal square of the sequence
    kernel = plan_lengths(docs, S, 1, 1, "pack-masked", "kernel").microbatches[0]
    assert kernel.pairs_executed == causal_pairs(S)
    # documents cut at the sequence boundary
    cut = plan_lengths([3 * S // 2, S // 2], S, 1, 2, "pack-masked", "mask")
    assert [mb.pieces for mb in cut.microbatches] == [((S,),), ((S // 2, S // 2),)]


def test_padding_against_grouping(llama):
    spec, platform, prof = llama
    docs = [256, S, 256, S]
    pad = plan_lengths(docs, S, 2, 2, "pad", "kernel")
    assert [mb.tokens_executed for mb in pad.microbatches] == [2 * S, 2 * S]
    assert pad.summary()["padding_fraction"] == 1 - (2 * 256 + 2 * S) / (4 * S)
    group = plan_lengths(docs, S, 2, 2, "group", "kernel")
    first, second = group.microbatches
    assert (first.seq, first.tokens_executed, first.pairs_executed) == (256, 512, 2 * causal_pairs(256))
    assert (second.seq, second.tokens_executed) == (S, 2 * S)
    linear, attention = attention_and_linear_ms(prof)
    scales = group.scales(linear, attention)
    expect = (linear * 512 / (2 * S) + attention * causal_pairs(256) / causal_pairs(S)) / (linear + attention)
    assert scales[0] == pytest.approx(expect, rel=1e-12) and scales[1] == 1.0


@pytest.mark.parametrize("packing", ["pad", "pack", "pack-masked", "group"])
@pytest.mark.parametrize("attention_cost", ["kernel", "mask"])
def test_equal_lengths_cost_exactly_the_uniform_step(llama, packing, attention_cost):
    spec, platform, prof = llama
    cfg = ParallelConfig(pp=2, dp=2, accum=4, seq=S)
    lengths = LengthDistribution((S,) * 3, packing, attention_cost).plan(S, 1, 4)
    assert all(s == 1.0 for s in lengths.scales(*attention_and_linear_ms(prof)))
    uniform = pipeline_costs(spec, cfg, prof, platform)
    costs = pipeline_costs(spec, cfg, prof, platform, lengths=lengths)
    assert costs.microbatch_scales is None and costs.to_json() == uniform.to_json()
    assert simulate(costs).step_time_ms == simulate(uniform).step_time_ms


def test_unequal_micro_batches_change_the_simulated_step(llama):
    spec, platform, prof = llama
    cfg = ParallelConfig(pp=2, accum=4, seq=S)
    lengths = plan_lengths([S // 4, S], S, 1, 4, "group", "mask")
    costs = pipeline_costs(spec, cfg, prof, platform, lengths=lengths)
    assert costs.microbatch_scales is not None and costs.microbatch_scales[0] < 1.0
    f_tasks = [t for t in simulate(costs).tasks if t.kind == "F" and t.layer == 0]
    durations = sorted((t.microbatch, t.end_ms - t.start_ms) for t in f_tasks)
    base = costs.stages[0][0].forward_ms
    for mb, dur in durations:
        assert dur == pytest.approx(base * costs.microbatch_scales[mb], rel=1e-12)


# ---------------------------------------------------------------- context parallelism

def test_cp_divides_tokens_and_the_attention_rows():
    spec = get_model("llama2-7b")
    one = stage_memory(spec, ParallelConfig(seq=4 * S, activation="full"))[0].breakdown
    four = stage_memory(spec, ParallelConfig(seq=4 * S, cp=4, activation="full"))[0].breakdown
    # per-layer saved tensors (per-token ones over s/4 tokens, P over (s/4) x s) plus the int32 token ids
    # and labels of the one stage's s/4 tokens
    h, heads, d, f = spec.hidden, spec.heads, spec.head_dim, spec.ffn
    sl, s = S, 4 * S
    per_token = 2 * (h + h) + 4 + 2 * (3 * heads * d) + heads * d * 2 + 2 * (h + h) + 4 + 3 * 2 * f
    per_layer = sl * per_token + heads * sl * s * 2
    assert four["saved_activations"] == spec.layers * per_layer + 2 * 4 * sl
    assert one["saved_activations"] > 3.9 * four["saved_activations"]
    ring = 2 * 2 * sl * spec.kv_heads * d * 2                    # two chunks of K and V in flight
    assert four["cp_kv_buffer"] == ring and "cp_kv_buffer" not in one


def test_cp_ring_exchange_cost(llama):
    spec, platform, prof = llama
    cfg = ParallelConfig(cp=4, seq=S, accum=2)
    ring = cost_terms(spec, cfg, prof, platform).exchange["context_parallel"]
    chunk = 2 * (S // 4) * spec.kv_heads * spec.head_dim * 2
    step = 1e3 * (chunk / platform.link_bandwidth + platform.link_latency_s)
    assert ring["chunk_bytes"] == chunk and ring["forward_ring_ms"] == pytest.approx(3 * step, rel=1e-12)
    attn_f = sum(o.forward_s for o in prof.ops if o.kind == "attention") * 1e3 / 4
    assert ring["forward_wait_ms"] == pytest.approx(max(0.0, 3 * step - attn_f * 3 / 4), rel=1e-12)
    base = cost_terms(spec, replace(cfg, cp=1), prof, platform)
    cp = cost_terms(spec, cfg, prof, platform)
    assert cp.mid.forward < base.mid.forward                     # a quarter of the tokens per device


def test_cp_must_divide_the_sequence():
    with pytest.raises(ConfigError, match="CP=3 must divide the sequence length 2048"):
        ParallelConfig(cp=3, seq=2048)


def test_simulate_cli_with_lengths_reports_them(tmp_path, capsys):
    path = tmp_path / "lengths.txt"
    path.write_text(f"{S} 4\n")
    base = ["simulate", "--model", "llama2-7b", "--profile", "roofline", "--pp", "2", "--accum", "4", "--json"]
    assert cli.main(base) == 0
    uniform = json.loads(capsys.readouterr().out)
    assert cli.main(base + ["--seq-lengths", str(path), "--packing", "pack-masked", "--attention-cost", "mask"]) == 0
    equal = json.loads(capsys.readouterr().out)
    assert equal["step_time_ms"] == uniform["step_time_ms"] and equal["timeline"] == uniform["timeline"]
    assert equal["lengths"]["tokens_real"] == 4 * S and equal["lengths"]["scales"] == [1.0] * 4
    assert "lengths" not in uniform and "moe" not in uniform and "context_parallel" not in uniform
    assert cli.main(base + ["--seq-lengths", "512,2048", "--packing", "group", "--attention-cost", "mask"]) == 0
    grouped = json.loads(capsys.readouterr().out)
    assert grouped["step_time_ms"] < uniform["step_time_ms"]
