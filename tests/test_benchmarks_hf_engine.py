"""`benchmarks/hf_engine.py` (issue 17's engine benchmark) end to end on a tiny CPU shape, and
its by-name handling of learner settings that later rlscope versions add."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Literal

import pytest

pytest.importorskip("transformers")

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import hf_engine  # noqa: E402

sys.path.remove(str(BENCHMARKS))

TINY_CPU = ["--models", "tiny", "--device", "cpu", "--autocast", "none",
            "--batch_sizes", "4", "--new_tokens", "5", "--prompt_len", "6", "--ragged_prompts",
            "--sampler_group", "2",
            "--warmup", "1", "--repeats", "1", "--learner_rows", "8", "--learner_group", "2",
            "--learner_prompt_len", "6", "--min_len", "8", "--max_len", "20",
            "--micro_batch_size", "4", "--learner_warmup", "0", "--learner_steps", "1",
            "--grpo_prompts", "2", "--grpo_group", "2", "--grpo_new_tokens", "4",
            "--grpo_steps", "3", "--grpo_warmup", "1", "--grpo_micro_batch", "2"]


def test_tiny_cpu_run_writes_json_with_positive_rates(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out_file = tmp_path / "hf_engine.json"
    out = hf_engine.main([*TINY_CPU, "--sections", "sampler", "learner",
                          "--output", str(out_file)])
    expected = json.loads(json.dumps(out, default=str))
    assert json.loads(out_file.read_text()) == expected
    assert json.loads(capsys.readouterr().out) == expected  # stdout holds the JSON alone
    assert out["versions"]["torch"] and out["versions"]["transformers"]
    assert out["card"] is None and out["environment"]["device"] == "cpu"
    tiny = out["models"]["tiny"]
    assert tiny["params"] > 0
    sampler = tiny["sampler"]
    paths = [r["path"] for r in sampler]
    assert paths == [f"rlscope:{b}" for b in hf_engine.rlscope_backends()] + [
        "hf:dynamic", "hf:static"]
    for row in sampler:
        assert row["status"] == "ok", row
        assert row["completion_tokens"] == 4 * 5  # no stop tokens: every row decodes it all
        assert row["tokens_per_s"] > 0 and row["ms_per_position"] > 0
        assert row["tokens_per_s"] == pytest.approx(20 / row["wall_s"])
    learner = tiny["learner"]
    assert [r["mode"] for r in learner] == ["padded", "packed"]
    for row in learner:
        assert row["status"] == "ok", row
        assert row["step_s"] > 0 and row["tokens_per_s"] > 0
        assert row["step_times_s"] == [row["step_s"]]  # one timed step: it is the median
        assert 8 * 8 <= row["real_tokens"] < row["padded_tokens"] == 8 * 20
        assert row["plan"]["micro_batch_size"] == 4 and row["plan"]["group_size"] == 2
    assert "grpo" not in tiny


@pytest.mark.slow
def test_tiny_cpu_grpo_against_trl(capsys: pytest.CaptureFixture[str]) -> None:
    """The GRPO section with TRL's trainer (about 15 s; needs trl, accelerate, datasets)."""
    pytest.importorskip("trl")
    out = hf_engine.main([*TINY_CPU, "--sections", "grpo"])
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(out, default=str))
    grpo = out["models"]["tiny"]["grpo"]
    assert grpo["batch_size"] == 4 and out["versions"]["trl"]
    for tool in ("rlscope", "trl"):
        assert grpo[tool]["step_s"] > 0
        assert 0 < grpo[tool]["completion_tokens_per_step"] <= 4 * 4
    assert grpo["step_time_ratio_trl_over_rlscope"] == pytest.approx(
        grpo["trl"]["step_s"] / grpo["rlscope"]["step_s"])


def test_unknown_sampler_path_is_rejected_with_the_choices() -> None:
    with pytest.raises(ValueError, match="hf:dynamic"):
        hf_engine.sampler_paths(["hf:vllm"])


def test_ragged_batch_lengths_lie_in_range() -> None:
    import torch

    batch = hf_engine.ragged_batch(64, prompt_len=8, min_len=16, max_len=40, vocab=50,
                                   group=4, device=torch.device("cpu"))
    totals = 8 + batch.completion_mask_BT.sum(-1)
    assert int(totals.min()) >= 16 and int(totals.max()) <= 40
    assert batch.completion_tokens_BT.shape == (64, 32)
    assert batch.rewards_B is not None and batch.group_id_B.tolist()[:5] == [0, 0, 0, 0, 1]


@dataclasses.dataclass(frozen=True)
class FakeLearner:
    packing: Literal["auto", "on", "off"] = "auto"
    logprob_chunk: int = 4096
    token_budget: int = 0
    activation_checkpointing: bool = False


@dataclasses.dataclass(frozen=True)
class FakeTrain:
    learner: FakeLearner = dataclasses.field(default_factory=FakeLearner)


def test_learner_settings_are_set_by_name_whatever_their_type() -> None:
    cfg = hf_engine.TrainConfig()
    if not hasattr(cfg, "learner"):  # today's rlscope: nothing to set, the config is untouched
        assert hf_engine.learner_config(cfg, True, 100, False, {}) == (cfg, None)
    fake: Any = FakeTrain()
    padded, used = hf_engine.learner_config(fake, False, 6144, False, {})
    assert used == {"packing": "off", "logprob_chunk": 0, "token_budget": 0,
                    "activation_checkpointing": False}
    assert padded.learner == FakeLearner("off", 0, 0, False)  # type: ignore[attr-defined]
    packed, used = hf_engine.learner_config(fake, True, 6144, True, {"logprob_chunk": 512})
    assert packed.learner == FakeLearner("on", 512, 6144, True)  # type: ignore[attr-defined]
    assert hf_engine.parse_overrides(["a=3", "b=on", "c=true"]) == {"a": 3, "b": "on", "c": True}
    with pytest.raises(ValueError, match="key=value"):
        hf_engine.parse_overrides(["packing"])


def test_inconsistent_options_are_rejected_before_any_work() -> None:
    args = hf_engine.parser().parse_args(["--learner_prompt_len", "64", "--min_len", "32",
                                          "--grpo_micro_batch", "3"])
    errors = hf_engine.check_args(args)
    assert any("--learner_prompt_len < --min_len" in e for e in errors)
    assert any("--grpo_micro_batch 3 must divide the GRPO batch 256" in e for e in errors)
    assert hf_engine.check_args(hf_engine.parser().parse_args([])) == []
    with pytest.raises(SystemExit):
        hf_engine.main(["--learner_rows", "10"])  # not a multiple of --learner_group 8


def test_sampler_switches_are_checked_then_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """The static sampler's switches: a block or warp count Triton cannot compile is refused
    with the allowed values; valid ones set the module switches they name."""
    from rlscope.sampling.backends import decode_attention, hf_static, triton_layers

    bad = hf_engine.parser().parse_args(["--decode_block", "8", "--decode_warps", "3",
                                         "--split_down", "-1", "--split_out", "-2"])
    errors = hf_engine.check_args(bad)
    assert any("--decode_block must be 16, 32" in e for e in errors)
    assert any("--decode_warps must be a power of two" in e for e in errors)
    assert any("--split_down must be >= 0" in e for e in errors)
    assert any("--split_out must be >= 0 (got -2)" in e for e in errors)
    for module, names in ((hf_static, ("FUSE_ROPE", "SHARE_PROMPT_KEYS", "GRAPH_PREFILL",
                                       "SPLIT_K_DOWN", "SPLIT_K_OUT", "FUSED_DRAW",
                                       "ROPE_TABLE",
                                       "COMPILE_PREFILL", "FUSED_GATE_UP", "TRITON_LAYERS")),
                          (decode_attention, ("BLOCK_N", "NUM_WARPS")),
                          (triton_layers, ("PDL",))):
        for name in names:  # restored after the test
            monkeypatch.setattr(module, name, getattr(module, name))
    hf_engine.apply_sampler_switches(hf_engine.parser().parse_args(
        ["--no_fuse_rope", "--no_share_prompt", "--no_graph_prefill", "--no_fused_draw",
         "--split_down", "0", "--split_out", "2", "--decode_block", "128",
         "--decode_warps", "8",
         "--no_rope_table", "--no_compile_prefill", "--no_fused_gate_up",
         "--no_triton_layers", "--no_pdl"]))
    assert (hf_static.FUSE_ROPE, hf_static.SHARE_PROMPT_KEYS, hf_static.GRAPH_PREFILL,
            hf_static.FUSED_DRAW, hf_static.SPLIT_K_DOWN) == (False, False, False, False, 0)
    assert (hf_static.ROPE_TABLE, hf_static.COMPILE_PREFILL, hf_static.FUSED_GATE_UP) == \
        (False, False, False)
    assert (decode_attention.BLOCK_N, decode_attention.NUM_WARPS) == (128, 8)
    assert (hf_static.TRITON_LAYERS, triton_layers.PDL) == (False, False)
    assert hf_static.SPLIT_K_OUT == 2
    hf_static.SPLIT_K_DOWN, hf_static.SPLIT_K_OUT = 4, 3
    hf_engine.apply_sampler_switches(hf_engine.parser().parse_args([]))
    # no flag: the module's values stay
    assert (hf_static.SPLIT_K_DOWN, hf_static.SPLIT_K_OUT) == (4, 3)
    assert (hf_static.ROPE_TABLE, hf_static.COMPILE_PREFILL, hf_static.FUSED_GATE_UP) == \
        (True, True, True)
    assert (hf_static.TRITON_LAYERS, triton_layers.PDL) == (True, True)


def test_grouped_ragged_prompts_repeat_within_a_group() -> None:
    import torch

    prompts = hf_engine.random_prompts(6, 8, vocab=100, ragged=True, seed=0,
                                       device=torch.device("cpu"), group=3)
    assert prompts.attention_mask_BP is not None
    assert torch.equal(prompts.tokens_BP[0], prompts.tokens_BP[2])
    assert torch.equal(prompts.attention_mask_BP[3], prompts.attention_mask_BP[5])
    lengths = prompts.attention_mask_BP.sum(-1)
    assert int(lengths.min()) >= 2 and int(lengths.max()) <= 8
    assert bool((prompts.tokens_BP[prompts.attention_mask_BP == 0] == 0).all())


def test_targets_read_the_best_rlscope_sampler_the_packed_learner_and_the_ratio() -> None:
    res = {"sampler": [
        {"path": "rlscope:eager", "status": "ok", "batch_size": 256, "new_tokens": 128,
         "tokens_per_s": 20e3},
        {"path": "rlscope:static", "status": "ok", "batch_size": 256, "new_tokens": 128,
         "tokens_per_s": 160e3},
        {"path": "hf:static", "status": "ok", "batch_size": 256, "new_tokens": 128,
         "tokens_per_s": 900e3},
        {"path": "rlscope:static", "status": "oom", "batch_size": 512, "new_tokens": 128}],
        "learner": [{"mode": "padded", "status": "ok", "mfu": 0.5},
                    {"mode": "packed", "status": "ok", "mfu": 0.3}],
        "grpo": {"step_time_ratio_trl_over_rlscope": 6.0}}
    got = hf_engine.target_check("qwen0.5b", res)
    assert got["sampler_tokens_per_s_b256_t128"] == {"target": 150e3, "measured": 160e3,
                                                     "met": True}
    assert got["learner_mfu"] == {"target": 0.35, "measured": 0.3, "met": False}
    assert got["grpo_step_speedup_over_trl"]["met"] is True
    assert hf_engine.target_check("104m", {}) == {
        "sampler_tokens_per_s_b256_t128": {"target": 500e3, "measured": None, "met": None}}


def test_a_failing_cell_is_recorded_and_the_table_goes_on() -> None:
    import torch

    cpu = torch.device("cpu")
    cell: dict[str, Any] = {"path": "hf:static", "batch_size": 512, "wall_s": 1.0}
    with hf_engine.cell_guard(cell, cpu):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
    assert cell == {"path": "hf:static", "batch_size": 512, "status": "oom"}
    cell = {"mode": "packed"}
    with hf_engine.cell_guard(cell, cpu):
        raise ValueError("learner.packing='on' needs a Hugging Face policy")
    assert cell == {"mode": "packed", "status": "error: ValueError: learner.packing='on' "
                                                "needs a Hugging Face policy"}
