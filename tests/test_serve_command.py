"""`rlscope serve` options, the API key rule for non-loopback binds, the tokenizer directory
and model building."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from rlscope.cli import main
from rlscope.serve import command
from rlscope.serve.config import ServeConfig
from rlscope.serve.state import LoraSettings, build_policy
from rlscope.serve.tokenizer_dir import byte_codec, marker_spec, write_tokenizer_dir


def test_help_documents_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for f in dataclasses.fields(ServeConfig):
        assert f"--{f.name}" in out, f.name
    assert "refuses to start without one" in out


def test_invalid_options_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--models", "no-equals-sign", "--long_poll_s", "50"]) == 2
    err = capsys.readouterr().err
    assert "NAME=SPEC" in err and "long_poll_s" in err


def test_binding_beyond_loopback_needs_an_api_key(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import uvicorn

    started: list[tuple[str, int, float | None]] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self: started.append(
        (self.config.host, self.config.port, self.config.timeout_graceful_shutdown)))
    monkeypatch.delenv("RLSCOPE_SERVE_API_KEY", raising=False)
    assert command.run(ServeConfig(host="0.0.0.0", port=9, root=str(tmp_path))) == 2
    assert "api_key" in capsys.readouterr().err and started == []
    assert command.run(ServeConfig(host="0.0.0.0", port=9, root=str(tmp_path),
                                   api_key="short")) == 2
    assert "tml-" in capsys.readouterr().err and started == []
    monkeypatch.setenv("RLSCOPE_SERVE_API_KEY", "tml-0123456789abcdef")
    assert command.run(ServeConfig(host="0.0.0.0", port=9, root=str(tmp_path))) == 0
    assert started == [("0.0.0.0", 9, 5)]
    monkeypatch.delenv("RLSCOPE_SERVE_API_KEY")
    assert command.run(ServeConfig(host="127.0.0.1", port=9, root=str(tmp_path))) == 0
    assert len(started) == 2


def test_tokenizer_dir_loads_with_auto_tokenizer(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    out = write_tokenizer_dir(tmp_path / "models" / "tok")
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    text = "User: What is 3 + 4?\n\nAssistant: 7 é"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids == list(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert tok.encode(tok.bos_token, add_special_tokens=False) == [256]
    assert tok.eos_token_id == 257 == byte_codec().eos_token_id
    assert marker_spec(str(out)) == "tiny-llama" and marker_spec(str(tmp_path)) is None


def test_lora_groups_select_the_adapted_modules() -> None:
    pytest.importorskip("peft")
    cfg = ServeConfig(tiny_d_model=32, tiny_heads=2)
    device = torch.device("cpu")
    attn_only, _ = build_policy(cfg, device, "tiny-llama",
                                LoraSettings(rank=2, train_mlp=False, train_unembed=False))
    names = [n for n, p in attn_only.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    assert any("q_proj" in n for n in names) and not any("mlp" in n for n in names)
    assert not any("lm_head" in n for n in names)
    assert all(p.shape[0] == 2 or p.shape[1] == 2 for n, p in attn_only.named_parameters()
               if p.requires_grad)
    everything, _ = build_policy(cfg, device, "tiny-llama", LoraSettings(rank=4))
    names = [n for n, p in everything.named_parameters() if p.requires_grad]
    assert any("down_proj" in n for n in names) and any("lm_head" in n for n in names)
    full, _ = build_policy(cfg, device, "tiny-llama", LoraSettings(rank=0))
    assert all(p.requires_grad for p in full.parameters())
