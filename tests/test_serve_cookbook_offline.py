"""Unmodified tinker-cookbook recipes that look models up by hub name, run offline against
`rlscope serve` (issue 20): ``rl_loop``, ``sl_basic``, ``rl_basic``, the multi-turn
``guess_number`` and ``twenty_questions`` (whose answerer is a second model, served through the
alias table), and the text-arena tic-tac-toe self-play recipe.

The server maps the hub names to tiny models (``--models``) and writes their tokenizers to a
Hugging Face cache (``--write_hf_cache``); the recipes run with ``HF_HOME`` pointing there and
``HF_HUB_OFFLINE=1``. The data sets the recipes load from the hub (GSM8K, No Robots) are
synthetic stand-ins of the same columns planted in the same cache (`plant_hf_dataset`): the
recipes' code is what runs, not their data."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("tinker")
pytest.importorskip("fastapi")
pytest.importorskip("tinker_cookbook")
pytest.importorskip("datasets")
pytest.importorskip("math_verify")  # the math recipes import their grader

from serve_util import Server, plant_hf_dataset, running_server

MODELS = ("tiny=tiny-llama", "meta-llama/Llama-3.2-1B=tiny-llama",
          "Qwen/Qwen3.5-4B=tiny-qwen2-chat", "Qwen/Qwen3.5-9B=tiny-qwen2-chat")
"""The hub names the recipes use, aliased to tiny models: Llama 3.2 1B (renderer role_colon)
for the GSM8K and No Robots recipes, Qwen 3.5 (ChatML: qwen3_5_disable_thinking) for the
multiplayer ones; 9B is twenty questions' answerer."""
ROWS = 128
"""Rows per synthetic split: ``rl_basic`` and ``sl_basic`` fix their batch size at 128."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("offline")
    hf_home = tmp / "hf"
    problems = {"question": [f"What is {i} + {i + 1}?" for i in range(ROWS)],
                "answer": [f"{i} + {i + 1} = {2 * i + 1}\n#### {2 * i + 1}"
                           for i in range(ROWS)]}
    plant_hf_dataset(hf_home, "openai/gsm8k", "main", {"train": problems, "test": problems})
    chats = [[{"role": "user", "content": f"Count to {i % 9 + 1}."},
              {"role": "assistant", "content": " ".join(str(k) for k in range(1, i % 9 + 2))}]
             for i in range(ROWS)]
    no_robots = {"prompt": [c[0]["content"] for c in chats],
                 "prompt_id": [str(i) for i in range(ROWS)], "messages": chats,
                 "category": ["Generation"] * ROWS}
    plant_hf_dataset(hf_home, "HuggingFaceH4/no_robots", "default",
                     {"train": no_robots, "test": no_robots})
    with running_server(tmp, models=MODELS, write_hf_cache=str(hf_home)) as srv:
        yield srv


def _recipe(server: Server, module: str, log_path: Path, *args: str) -> str:
    hf_home = Path(server.app.state.context.cfg.write_hf_cache)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(TINKER_API_KEY="tml-local", TINKER_TELEMETRY="0", OMP_NUM_THREADS="1",
               TINKER_BASE_URL=server.base_url, HF_HOME=str(hf_home), HF_HUB_OFFLINE="1")
    cmd = [sys.executable, "-m", module, f"log_path={log_path}", *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def _jsonl(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _trained_base_models(server: Server) -> set[str]:
    return {m.base_model for m in server.app.state.context.engine.models.values()}


def test_rl_loop_runs_offline_with_a_hub_named_model(server: Server, tmp_path: Path) -> None:
    log_path = tmp_path / "rl_loop"
    _recipe(server, "tinker_cookbook.recipes.rl_loop", log_path,
            f"base_url={server.base_url}", "model_name=meta-llama/Llama-3.2-1B",
            "batch_size=2", "group_size=2", "max_tokens=16", "max_steps=2", "save_every=1",
            "lora_rank=4")
    assert [c["name"] for c in _jsonl(log_path / "checkpoints.jsonl")] == ["000001", "final"]
    metrics = _jsonl(log_path / "metrics.jsonl")
    assert [m["progress/batch"] for m in metrics] == [0, 1]
    assert all(0.0 <= float(m["reward/total"]) <= 1.0 for m in metrics)  # type: ignore[arg-type]
    assert "meta-llama/Llama-3.2-1B" in _trained_base_models(server)


@pytest.mark.slow
def test_sl_basic_runs_offline(server: Server, tmp_path: Path) -> None:
    log_path = tmp_path / "sl_basic"
    _recipe(server, "tinker_cookbook.recipes.sl_basic", log_path,
            "model_name=meta-llama/Llama-3.2-1B", f"base_url={server.base_url}",
            "max_steps=1", "lora_rank=4", "save_every=0", "eval_every=0")
    [row] = _jsonl(log_path / "metrics.jsonl")
    assert row["num_sequences"] == ROWS
    nll = float(row["train_mean_nll"])  # type: ignore[arg-type]
    # a random model over 258 ids: about log 258 = 5.55 nats per token
    assert math.isfinite(nll) and 4.0 < nll < 7.0
    assert [c["name"] for c in _jsonl(log_path / "checkpoints.jsonl")] == ["final"]


@pytest.mark.slow
def test_rl_basic_runs_offline(server: Server, tmp_path: Path) -> None:
    # batch 128 × group 16 is fixed by the recipe: one step, short answers
    log_path = tmp_path / "rl_basic"
    _recipe(server, "tinker_cookbook.recipes.rl_basic", log_path,
            "model_name=meta-llama/Llama-3.2-1B", f"base_url={server.base_url}",
            "max_tokens=8", "max_steps=1", "lora_rank=4", "save_every=0", "eval_every=0")
    [row] = _jsonl(log_path / "metrics.jsonl")
    assert "env/all/reward/total" in row
    assert abs(float(row["optim/kl_sample_train_v1"])) < 1e-3  # type: ignore[arg-type]
    assert [c["name"] for c in _jsonl(log_path / "checkpoints.jsonl")] == ["final"]


@pytest.mark.slow
def test_guess_number_runs_offline_with_the_qwen_chat_renderer(server: Server,
                                                               tmp_path: Path) -> None:
    log_path = tmp_path / "guess_number"
    _recipe(server, "tinker_cookbook.recipes.multiplayer_rl.guess_number.train", log_path,
            "group_size=2", "batch_size=1", "max_tokens=8", "max_steps=1", "eval_every=0",
            "save_every=0", "behavior_if_log_dir_exists=delete")
    [row] = _jsonl(log_path / "metrics.jsonl")
    assert row["env/all/total_episodes"] == 2
    assert float(row["env/all/turns_per_episode"]) >= 1  # type: ignore[arg-type]
    assert "Qwen/Qwen3.5-4B" in _trained_base_models(server)


@pytest.mark.slow
def test_twenty_questions_runs_offline_with_its_answerer_model(server: Server,
                                                               tmp_path: Path) -> None:
    log_path = tmp_path / "twenty_questions"
    _recipe(server, "tinker_cookbook.recipes.multiplayer_rl.twenty_questions.train", log_path,
            "group_size=2", "batch_size=1", "max_tokens=8", "max_steps=1", "num_epochs=1",
            "eval_every=0", "save_every=0", "behavior_if_log_dir_exists=delete")
    [row] = _jsonl(log_path / "metrics.jsonl")
    assert row["env/all/total_episodes"] == 2
    # a random player never guesses the word: every episode uses its 20 questions
    assert row["env/all/turns_per_episode"] == 20
    engine = server.app.state.context.engine
    # the answerer is a base-model sampler of the second hub name, built once
    answerers = [w for w in engine.samplers.values() if w.base_model == "Qwen/Qwen3.5-9B"]
    assert answerers and all(w.params is None for w in answerers)
    assert "tiny-qwen2-chat" in engine.base_policies


@pytest.mark.slow
def test_text_arena_tictactoe_runs_offline_in_self_play(server: Server, tmp_path: Path) -> None:
    """The text-arena tic-tac-toe recipe (needs the `textarena` package: the `cookbook` and
    `dev` extras): self-play for training, the untrained base model as the test opponent (a
    base-model sampler of the same hub name). TextArena's TicTacToe-v0 is local code: no
    network."""
    pytest.importorskip("textarena")
    log_path = tmp_path / "tictactoe"
    out = _recipe(server, "tinker_cookbook.recipes.multiplayer_rl.text_arena.train", log_path,
                  "batch_size=4", "num_train_datapoints=4", "num_test_datapoints=2",
                  "max_tokens=8", "max_steps=1", "eval_every=1", "save_every=0",
                  "behavior_if_log_dir_exists=delete")
    rows = _jsonl(log_path / "metrics.jsonl")
    assert rows, out[-2000:]
    train = [r for r in rows if "env/all/total_episodes" in r]
    # one self-play step: 2 games, both players' episodes
    assert train and train[-1]["env/all/total_episodes"] == 4
    test = [r for r in rows if "test/env/all/reward/total" in r]
    # a random byte-level player writes illegal moves: every reward is in [-2, 1]
    assert test and -2.0 <= float(test[0]["test/env/all/reward/total"]) <= 1.0  # type: ignore[arg-type]
    assert "Qwen/Qwen3.5-4B" in _trained_base_models(server)
    engine = server.app.state.context.engine
    opponents = [w for w in engine.samplers.values()
                 if w.base_model == "Qwen/Qwen3.5-4B" and w.params is None]
    assert opponents  # the test opponent: the untrained base model
