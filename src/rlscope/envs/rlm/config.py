"""`RlmConfig`: the options of the ``rlm_papers`` environment (COMPANIONS.md section 4) and
`rlm_errors`, its rejections. The trainer's own options (group size, clip, KL, LoRA, 4-bit)
are checked with the method."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tyro.conf import Suppress

from rlscope.sandbox import isolation_problem
from rlscope.sandbox.isolated import INSTALL_HINT

RewardMode = Literal["char_f1", "judge"]


@dataclass(frozen=True)
class RlmConfig:
    """The RLM environment: turns, children, REPL limits, reward and data."""

    max_plan_tokens: int = 384
    """Tokens the root generates per turn (sampled at temperature 1.0, top-p 1.0, top-k 0)."""
    max_child_tokens: int = 384
    """Tokens a child generates per turn."""
    max_root_turns: int = 10
    """Root turns; a root without FINAL after them ends with no answer (``max_turns``)."""
    max_child_turns: int = 10
    """Turns of each child; a child without FINAL after them answers None."""
    max_children: int = 8
    """Children per tree (all ``rlm_query*`` calls together); a call over it raises
    BudgetError in the REPL and spawns nothing. 0: no children."""
    max_children_per_call: int = 4
    """Children of one ``rlm_query_batched`` call; more raises BudgetError."""
    repl_timeout: float = 30.0
    """Wall-clock seconds of one REPL block, paused while children run; past it the session
    is killed and reset. The session's RLIMIT_CPU is this × the turn limit."""
    max_observation_chars: int = 3000
    """An observation (stdout, then the last traceback line) is cut to this many
    characters."""
    max_prompt_tokens: int = 8192
    """A conversation longer than this ends its rollout (finish ``context_limit``, no
    answer); an example whose first prompt is longer is a load error."""
    max_reward_predictions: int = 12
    """N of char_f1's penalty 0.05·max(0, n_pred − N)/N on answers with many strings."""
    reward_mode: RewardMode = "char_f1"
    """``char_f1``: character F1 of the located answer strings against the gold spans;
    ``judge``: an OpenAI-compatible endpoint scores precision and recall 1..10."""
    judge_base_url: str = ""
    """Judge mode: base URL of the OpenAI-compatible endpoint (``.../v1``)."""
    judge_model: str = ""
    """Judge mode: the model name sent to the endpoint."""
    judge_api_key_env: str = "RLSCOPE_JUDGE_API_KEY"
    """Judge mode: the environment variable holding the endpoint's API key (must be set)."""
    train_file: str = ""
    """A ``.jsonl`` or ``.parquet`` file in the rlm_papers schema (papers may be a list of
    ``{"id", "text"}``, gold may be text only); empty: the shipped dataset."""
    max_examples: int = 0
    """Use at most this many train examples (0: all)."""
    train_child_trajectories: bool = True
    """Train on the children's turns (weight 1/(k·n_j) each); ``--no_train_child_trajectories``
    gives them weight 0."""
    unsafe_sandbox: Suppress[bool] = False
    """Run the REPL in the weak subprocess sandbox instead of bubblewrap (docs/sandbox.md).
    Not a flag of its own: ``rlscope train`` sets it from the task option
    ``--unsafe_sandbox``."""


def rlm_errors(cfg: RlmConfig, environ: dict[str, str] | None = None) -> list[str]:
    """The rejections of COMPANIONS.md section 4 that concern the environment, one line each
    (empty when none). ``environ`` defaults to ``os.environ``."""
    env = os.environ if environ is None else environ
    errors = [f"--{name} must be >= 1 (got {getattr(cfg, name)})"
              for name in ("max_plan_tokens", "max_child_tokens", "max_root_turns",
                           "max_child_turns", "max_observation_chars", "max_prompt_tokens",
                           "max_reward_predictions")
              if getattr(cfg, name) < 1]
    if not (math.isfinite(cfg.repl_timeout) and cfg.repl_timeout >= 1):
        errors.append(f"--repl_timeout must be >= 1 second (got {cfg.repl_timeout})")
    if cfg.max_children < 0:
        errors.append(f"--max_children must be >= 0 (got {cfg.max_children})")
    if cfg.max_children_per_call < 1:
        errors.append(f"--max_children_per_call must be >= 1 (got "
                      f"{cfg.max_children_per_call})")
    elif 0 < cfg.max_children < cfg.max_children_per_call:
        errors.append(f"--max_children_per_call {cfg.max_children_per_call} exceeds "
                      f"--max_children {cfg.max_children}; lower it")
    if cfg.max_examples < 0:
        errors.append(f"--max_examples must be >= 0 (got {cfg.max_examples})")
    if cfg.reward_mode not in ("char_f1", "judge"):
        errors.append(f"--reward_mode must be char_f1 or judge (got {cfg.reward_mode!r})")
    if cfg.reward_mode == "judge":
        if not cfg.judge_base_url:
            errors.append("--reward_mode judge needs --judge_base_url (an OpenAI-compatible "
                          "endpoint)")
        if not cfg.judge_model:
            errors.append("--reward_mode judge needs --judge_model")
        if not cfg.judge_api_key_env or not env.get(cfg.judge_api_key_env):
            errors.append(f"--reward_mode judge: set the environment variable "
                          f"{cfg.judge_api_key_env or '(--judge_api_key_env)'} to the "
                          "endpoint's API key")
    if cfg.train_file:
        path = Path(cfg.train_file)
        if path.suffix not in (".jsonl", ".parquet"):
            errors.append(f"--train_file {cfg.train_file} must end in .jsonl or .parquet")
        elif not path.is_file():
            errors.append(f"--train_file {cfg.train_file} does not exist")
    return errors


def sandbox_errors(cfg: RlmConfig) -> list[str]:
    """Why the REPL cannot run here (empty if it can): the isolated mode needs bubblewrap and
    seccomp unless ``--unsafe_sandbox`` (a quick probe, cached)."""
    if cfg.unsafe_sandbox:
        return []
    problem = isolation_problem()
    return [f"the REPL sandbox is unavailable: {problem}; {INSTALL_HINT}"] if problem else []
