"""`benchmarks/sampler_ab.py` (paired A/B of the static sampler's module settings) on a tiny
CPU shape: each variant runs under its own settings, the defaults come back afterwards, and
bad variants are rejected before any model is built."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import sampler_ab  # noqa: E402

sys.path.remove(str(BENCHMARKS))

from rlscope.sampling.backends import decode_attention, hf_static  # noqa: E402

TINY = ["--model", "tiny", "--device", "cpu", "--autocast", "none", "--batch", "4",
        "--prompt_len", "6", "--new_tokens", "5", "--group", "2", "--warmup", "1",
        "--repeats", "2"]


def test_each_variant_runs_under_its_settings_and_the_defaults_return(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[tuple[bool, int]] = []
    plain = sampler_ab.generate

    def spy(*args: Any, **kw: Any) -> Any:
        seen.append((hf_static.FUSED_DRAW, decode_attention.NUM_WARPS))
        return plain(*args, **kw)

    monkeypatch.setattr(sampler_ab, "generate", spy)
    defaults = (hf_static.FUSED_DRAW, decode_attention.NUM_WARPS)
    out_file = tmp_path / "ab.json"
    res = sampler_ab.main([*TINY, "--variant", "base:", "--variant",
                           "both:hf_static.FUSED_DRAW=False, decode_attention.NUM_WARPS=4",
                           "--variant", "base2:", "--output", str(out_file)])
    assert json.loads(out_file.read_text()) == json.loads(json.dumps(res, default=str))
    assert json.loads(capsys.readouterr().out) == json.loads(out_file.read_text())
    assert [r["variant"] for r in res["rows"]] == ["base", "both", "base2"]
    assert res["rows"][1]["settings"] == {"hf_static.FUSED_DRAW": False,
                                          "decode_attention.NUM_WARPS": 4}
    # 1 warm-up + 2 timed calls a variant, each under that variant's settings only
    assert seen == [defaults] * 3 + [(False, 4)] * 3 + [defaults] * 3
    assert (hf_static.FUSED_DRAW, decode_attention.NUM_WARPS) == defaults
    for row in res["rows"]:
        assert row["completion_tokens"] == 4 * 5  # no stop tokens: every row decodes all
        assert row["tokens_per_s"] == pytest.approx(20 / (row["call_ms"] / 1e3), rel=1e-3)
        assert row["min_call_ms"] <= row["call_ms"] <= row["max_call_ms"]
        assert "replay_us" not in row  # CUDA only
    assert res["card"] is None and res["environment"]["device"] == "cpu"


@pytest.mark.parametrize(("variants", "extra", "message"), [
    (["base"], [], "write NAME:SETTINGS"),
    (["x:torch.FOO=1"], [], "unknown module 'torch'"),
    (["x:hf_static.NOPE=1"], [], "hf_static has no setting 'NOPE'"),
    (["x:hf_static.decode=1"], [], "hf_static has no setting 'decode'"),
    (["x:hf_static.SPLIT_K_DOWN=True"], [],
     "hf_static.SPLIT_K_DOWN takes values of type int (default 4)"),
    (["x:hf_static.FUSED_DRAW=off"], [], "is not a Python literal"),
    (["x:hf_static.SPLIT_K_DOWN=" + "-" * 100_000 + "1"], [], "is not a Python literal"),
    (["x:hf_static.FUSED_DRAW"], [], "is not module.ATTRIBUTE=value"),
    (["a:", "a:"], [], "names must differ"),
    (["a:"], ["--profile", "b"], "--profile b: no variant of that name"),
    (["a:"], ["--timeline", "c"], "--timeline c: no variant of that name"),
    (["a:"], ["--new_tokens", "1"], "--new_tokens must be >= 2"),
    (["a:"], ["--compile"], "--compile needs --device cuda"),
])
def test_bad_variants_are_rejected_before_any_work(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        variants: list[str], extra: list[str], message: str) -> None:
    def no_model(*_: Any) -> Any:
        raise AssertionError("a model was built")

    monkeypatch.setattr(sampler_ab, "build_model", no_model)
    argv = [*TINY, *extra]
    for v in variants:
        argv += ["--variant", v]
    with pytest.raises(SystemExit) as exc:
        sampler_ab.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_without_a_gpu_cuda_is_refused_with_the_cpu_form(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exc:
        sampler_ab.main([*TINY, "--device", "cuda", "--variant", "a:"])
    assert exc.value.code == 2
    assert "CUDA is not available here; use --device cpu" in capsys.readouterr().err


def test_values_may_hold_commas() -> None:
    """A comma starts the next setting only where ``module.ATTRIBUTE=`` follows, so a dict
    or tuple value keeps its commas."""
    name, settings = sampler_ab.parse_variant(
        "opts:hf_static.COMPILE_OPTIONS={'combo_kernels': True, 'a': (1, 2)},"
        " decode_attention.NUM_WARPS=4")
    assert name == "opts"
    assert settings == {("hf_static", "COMPILE_OPTIONS"): {"combo_kernels": True, "a": (1, 2)},
                        ("decode_attention", "NUM_WARPS"): 4}
    with pytest.raises(ValueError, match="takes values of type dict"):
        sampler_ab.parse_variant("x:hf_static.COMPILE_OPTIONS=(1, 2)")
