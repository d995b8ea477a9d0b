"""``rlscope serve --write_hf_cache``: the hub-cache layout, checked with huggingface_hub's own
cache reader, and an offline ``AutoTokenizer.from_pretrained("org/name")`` in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
hub = pytest.importorskip("huggingface_hub")

from rlscope.serve.config import ServeConfig  # noqa: E402
from rlscope.serve.hf_export import hub_cache_ids, write_hf_cache  # noqa: E402
from rlscope.serve.state import UserError  # noqa: E402

ALIASES = {"meta-llama/Llama-3.2-1B": "tiny-llama", "Qwen/Qwen3.5-9B": "tiny-qwen2-chat",
           "tiny": "tiny-llama"}
LLAMA_REMAP = "thinkingmachineslabinc/meta-llama-3-instruct-tokenizer"


def test_hub_cache_ids_take_org_name_ids_and_the_cookbook_llama_remap() -> None:
    assert hub_cache_ids("tiny") == []
    assert hub_cache_ids("/abs/path/dir") == []
    assert hub_cache_ids("a/b/c") == []
    assert hub_cache_ids("Qwen/Qwen3.5-9B") == ["Qwen/Qwen3.5-9B"]
    assert hub_cache_ids("meta-llama/Llama-3.2-1B") == ["meta-llama/Llama-3.2-1B", LLAMA_REMAP]


def test_the_cache_is_what_huggingface_hub_reads(tmp_path: Path) -> None:
    written = write_hf_cache(ServeConfig(), ALIASES, tmp_path)
    assert sorted(written) == sorted(["meta-llama/Llama-3.2-1B", LLAMA_REMAP, "Qwen/Qwen3.5-9B"])
    info = hub.scan_cache_dir(tmp_path / "hub")
    assert info.warnings == []
    repos = {r.repo_id: r for r in info.repos}
    assert sorted(repos) == sorted(written)
    for repo_id, repo in repos.items():
        assert repo.repo_type == "model"
        [rev] = repo.revisions
        assert rev.refs == frozenset({"main"})
        assert {f.file_name for f in rev.files} == {"config.json", "tokenizer.json",
                                                    "tokenizer_config.json"}
        assert rev.snapshot_path == written[repo_id]
        # every snapshot file is a link to a blob named by its git blob id
        for f in rev.files:
            assert f.file_path.is_symlink() and f.blob_path.parent.name == "blobs"
    found = hub.try_to_load_from_cache("Qwen/Qwen3.5-9B", "config.json",
                                       cache_dir=tmp_path / "hub")
    assert isinstance(found, str)
    assert json.loads(Path(found).read_text())["vocab_size"] == 256 + 5
    assert hub.try_to_load_from_cache("tiny", "config.json", cache_dir=tmp_path / "hub") is None
    # the same files give the same revision again (a restart does not pile up snapshots)
    again = write_hf_cache(ServeConfig(), ALIASES, tmp_path)
    assert again == written
    assert len(list((tmp_path / "hub" / "models--Qwen--Qwen3.5-9B" / "snapshots").iterdir())) == 1


def test_a_local_hugging_face_model_gets_its_own_tokenizer_and_config(tmp_path: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    from rlscope.policy.hf import tiny_hf_model
    from rlscope.serve.tokenizer_dir import CHAT_SPECIALS, write_tokenizer_dir

    model_dir = tmp_path / "models" / "local-qwen"
    tiny_hf_model("qwen2", 256 + len(CHAT_SPECIALS), seed=1, hidden_size=32, num_heads=2,
                  max_len=512).save_pretrained(str(model_dir))
    write_tokenizer_dir(model_dir, "tiny-qwen2-chat", marker=False)
    written = write_hf_cache(ServeConfig(), {"acme/local-7b": str(model_dir)}, tmp_path / "hf")
    snapshot = written["acme/local-7b"]
    assert AutoConfig.from_pretrained(snapshot).to_dict()["hidden_size"] == 32
    assert AutoConfig.from_pretrained(snapshot).max_position_embeddings == 512
    tok = AutoTokenizer.from_pretrained(snapshot)
    assert tok.encode("<|im_start|>a", add_special_tokens=False) == [257, 97]
    assert not any(p.name.endswith(".safetensors") for p in snapshot.iterdir())  # no weights
    with pytest.raises(UserError, match="neither a tiny model"):
        write_hf_cache(ServeConfig(), {"acme/x": str(tmp_path / "nowhere")}, tmp_path / "hf")


def test_two_specs_for_one_remapped_id_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="alias those names to one model"):
        write_hf_cache(ServeConfig(), {"meta-llama/Llama-3.2-1B": "tiny-llama",
                                       "meta-llama/Llama-3.1-8B": "tiny-qwen2"}, tmp_path)


def test_config_refuses_a_cache_with_no_hub_alias() -> None:
    errors = ServeConfig(write_hf_cache="/tmp/x").validate()
    assert any("no --models NAME is a hub id" in e for e in errors)
    assert ServeConfig(write_hf_cache="/tmp/x",
                       models=("Qwen/Qwen3-8B=tiny-qwen2-chat",)).validate() == []


OFFLINE_CLIENT = """
import json
from transformers import AutoConfig, AutoTokenizer
from tinker_cookbook.tokenizer_utils import get_tokenizer
from tinker_cookbook.renderers import get_renderer
qwen = AutoTokenizer.from_pretrained("Qwen/Qwen3.5-9B")
llama = get_tokenizer("meta-llama/Llama-3.2-1B")  # the cookbook reads the remapped repo
renderer = get_renderer("qwen3_5_disable_thinking", get_tokenizer("Qwen/Qwen3.5-9B"))
print(json.dumps({
    "im_end": qwen.encode("<|im_end|>", add_special_tokens=False),
    "think": qwen.encode("</think>", add_special_tokens=False),
    "eos": qwen.eos_token_id,
    "llama": llama.encode("hi", add_special_tokens=False),
    "vocab": AutoConfig.from_pretrained("meta-llama/Llama-3.2-1B").vocab_size,
    "stop": renderer.get_stop_sequences(),
}))
"""


def test_an_unmodified_client_loads_the_tokenizers_offline(tmp_path: Path) -> None:
    pytest.importorskip("tinker_cookbook")
    write_hf_cache(ServeConfig(), ALIASES, tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(tmp_path), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", OFFLINE_CLIENT], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # ChatML specials are single tokens (ids 256..260), <|im_end|> is EOS and the stop
    assert out["im_end"] == [258] and out["think"] == [260] and out["eos"] == 258
    assert out["stop"] == [258]
    assert out["llama"] == [104, 105] and out["vocab"] == 258
