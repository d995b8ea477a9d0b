"""Learning check for `rlscope serve`: does the unmodified cookbook RL recipe learn through it?

1. Start ``rlscope serve`` in this process (tiny Llama, byte-level tokenizer) on a free port.
2. Warm start through the tinker SDK: a short supervised run (``cross_entropy``) on arithmetic
   conversations rendered by the cookbook's ``role_colon`` renderer, then ``save_state``.
3. Run the unmodified ``tinker_cookbook.recipes.math_rl.train`` (env=arithmetic) from that
   state (``load_checkpoint_path``) for a few dozen steps.
4. Evaluate the warm start and the final RL weights on the same fixed problems (sampled at
   temperature 1, as RL optimises), and compare the mean reward of the first and last RL
   steps (exit 1 unless the held-out accuracy rose).

    python benchmarks/serve_learning_check.py            # docs/tinker.md records a run

Needs the serve extra, tinker-cookbook and its math_rl imports (docs/tinker.md).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tyro


@dataclass(frozen=True)
class CheckConfig:
    """Sizes of the learning check."""

    sft_steps: int = 500
    """Supervised warm-start steps (batch ``sft_batch``)."""
    sft_batch: int = 64
    """Conversations per supervised step."""
    sft_lr: float = 2e-3
    """AdamW learning rate of the warm start."""
    rl_steps: int = 60
    """math_rl steps (each ``groups_per_batch`` × ``group_size`` rollouts)."""
    groups_per_batch: int = 8
    """Problems per RL step."""
    group_size: int = 8
    """Rollouts per problem."""
    rl_lr: float = 1e-4
    """math_rl learning rate (5e-4 overshot here: held-out accuracy fell; docs/tinker.md)."""
    lora_rank: int = 0
    """LoRA rank (0 = train every weight of the tiny model)."""
    d_model: int = 128
    """Width of the tiny model."""
    layers: int = 2
    """Blocks of the tiny model."""
    max_tokens: int = 16
    """Sampled tokens per answer (byte-level: the stop string "\\n\\nUser:" alone is 7)."""
    eval_problems: int = 128
    """Fixed held-out problems for the before/after accuracy."""
    eval_samples: int = 4
    """Samples per held-out problem."""
    window: int = 5
    """Steps averaged at each end of the RL run."""
    out: str = ""
    """Directory for the server root and the recipe's log (default: a temp dir)."""
    reuse_warm_start: bool = False
    """Skip the warm start and reuse the one an earlier run left in ``out``
    (``out/warm_start.json``; same model sizes)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def accuracy(base_url: str, tok_dir: Path, sampler_path: str, cfg: CheckConfig) -> float:
    """Fraction of correct sampled answers (T = 1) on fixed problems, for saved weights."""
    import tinker
    from tinker_cookbook import renderers
    from tinker_cookbook.recipes.math_rl.arithmetic_env import ArithmeticEnv
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    renderer = renderers.get_renderer("role_colon", get_tokenizer(str(tok_dir)))
    service = tinker.ServiceClient(base_url=base_url, api_key="tml-local")
    sampler = service.create_sampling_client(model_path=sampler_path).result()
    rng = np.random.default_rng(12345)  # not the warm start's stream
    problems = [(int(x), int(y)) for x, y in rng.integers(0, 101, size=(cfg.eval_problems, 2))]
    params = tinker.SamplingParams(max_tokens=cfg.max_tokens, temperature=1.0,
                                   stop=renderer.get_stop_sequences())
    futures = [sampler.sample(renderer.build_generation_prompt(
        [*ArithmeticEnv.standard_fewshot_prefix(),
         {"role": "user", "content": f"What is {x} + {y}?"}]),
        num_samples=cfg.eval_samples, sampling_params=params) for x, y in problems]
    correct = 0
    for (x, y), fut in zip(problems, futures, strict=True):
        for seq in fut.result().sequences:
            message, _ = renderer.parse_response(seq.tokens)
            env = ArithmeticEnv(x, y, renderer)
            correct += env.check_answer(renderers.get_text_content(message))
    return correct / (cfg.eval_problems * cfg.eval_samples)


def warm_start(base_url: str, tok_dir: Path, cfg: CheckConfig) -> tuple[str, str, float]:
    """Supervised warm start through the SDK; returns the state path, the sampler path and
    the seconds taken."""
    import tinker
    from tinker_cookbook import renderers
    from tinker_cookbook.recipes.math_rl.arithmetic_env import ArithmeticEnv
    from tinker_cookbook.supervised.data import conversation_to_datum
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    t0 = time.perf_counter()
    renderer = renderers.get_renderer("role_colon", get_tokenizer(str(tok_dir)))
    service = tinker.ServiceClient(base_url=base_url, api_key="tml-local")
    tc = service.create_lora_training_client(base_model=str(tok_dir),
                                             rank=cfg.lora_rank).result()
    rng = np.random.default_rng(0)
    prefix = ArithmeticEnv.standard_fewshot_prefix()
    for step in range(cfg.sft_steps):
        data = []
        for _ in range(cfg.sft_batch):
            x, y = (int(v) for v in rng.integers(0, 101, size=2))
            convo = [*prefix, {"role": "user", "content": f"What is {x} + {y}?"},
                     {"role": "assistant", "content": str(x + y)}]
            data.append(conversation_to_datum(
                convo, renderer, None, renderers.TrainOnWhat.LAST_ASSISTANT_MESSAGE))
        fb = tc.forward_backward(data, "cross_entropy")
        opt = tc.optim_step(tinker.AdamParams(learning_rate=cfg.sft_lr))
        loss = fb.result().metrics["loss:sum"] / cfg.sft_batch
        opt.result()
        if step % 25 == 0 or step == cfg.sft_steps - 1:
            sys.stderr.write(f"sft step {step}: loss/conversation {loss:.3f}\n")
    path = tc.save_state("warm_start").result().path
    sampler_path = tc.save_weights_for_sampler("warm_start").result().path
    return path, sampler_path, time.perf_counter() - t0


def main(cfg: CheckConfig) -> int:
    import uvicorn

    from rlscope.serve.app import create_app
    from rlscope.serve.config import ServeConfig

    out = Path(cfg.out or tempfile.mkdtemp(prefix="serve_learning_"))
    tok_dir = out / "models" / "tiny-tok"
    port = _free_port()
    serve_cfg = ServeConfig(port=port, root=str(out / "serve_runs"), write_tokenizer=str(tok_dir),
                            tiny_d_model=cfg.d_model, tiny_layers=cfg.layers, device="cpu",
                            log_level="warning")
    server = uvicorn.Server(uvicorn.Config(create_app(serve_cfg), host="127.0.0.1", port=port,
                                           log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    base_url = f"http://127.0.0.1:{port}"
    record = out / "warm_start.json"
    if cfg.reuse_warm_start:
        saved = json.loads(record.read_text())
        state, warm_sampler, sft_s = saved["state"], saved["sampler"], 0.0
    else:
        state, warm_sampler, sft_s = warm_start(base_url, tok_dir, cfg)
        record.write_text(json.dumps({"state": state, "sampler": warm_sampler}) + "\n")
    log_path = out / "math_rl"
    env = {**os.environ, "TINKER_API_KEY": "tml-local", "TINKER_TELEMETRY": "0"}
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "tinker_cookbook.recipes.math_rl.train", f"base_url={base_url}",
         f"model_name={tok_dir}", "renderer_name=role_colon", "env=arithmetic",
         f"group_size={cfg.group_size}", f"groups_per_batch={cfg.groups_per_batch}",
         f"max_tokens={cfg.max_tokens}", f"lora_rank={cfg.lora_rank}", f"learning_rate={cfg.rl_lr}",
         f"max_steps={cfg.rl_steps}", "save_every=0", "eval_every=0",
         f"load_checkpoint_path={state}", f"log_path={log_path}",
         "behavior_if_log_dir_exists=delete"],
        env=env, capture_output=True, text=True)
    rl_s = time.perf_counter() - t0
    if proc.returncode != 0:
        server.should_exit = True
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        return 2
    final = json.loads((log_path / "checkpoints.jsonl").read_text().splitlines()[-1])
    before = accuracy(base_url, tok_dir, warm_sampler, cfg)
    after = accuracy(base_url, tok_dir, str(final["sampler_path"]), cfg)
    server.should_exit = True
    rows = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]
    reward = [float(r["env/all/reward/total"]) for r in rows]
    correct = [float(r["env/all/correct"]) for r in rows]
    w = cfg.window
    summary = {
        "sft_seconds": round(sft_s, 1), "rl_seconds": round(rl_s, 1), "rl_steps": len(rows),
        "heldout_accuracy_before_rl": round(before, 4),
        "heldout_accuracy_after_rl": round(after, 4),
        "reward_first": round(float(np.mean(reward[:w])), 4),
        "reward_last": round(float(np.mean(reward[-w:])), 4),
        "correct_first": round(float(np.mean(correct[:w])), 4),
        "correct_last": round(float(np.mean(correct[-w:])), 4),
        "reward_by_step": [round(r, 3) for r in reward], "log_path": str(log_path),
    }
    sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    return 0 if after > before else 1


if __name__ == "__main__":
    raise SystemExit(main(tyro.cli(CheckConfig)))
