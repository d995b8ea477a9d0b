"""Input validation before any work starts (rlscope.checks, rlscope.paths, config.validate):
finite floats and non-negative counts over every config field, run names that stay inside the
runs directory, devices, files to read, directories to write, optional modules, and the memory
estimate that rejects a batch that cannot fit."""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from rlscope import checks
from rlscope.checks import (
    MemoryTerm,
    device_errors,
    field_errors,
    install_hint,
    memory_errors,
    module_errors,
    writable_dir_errors,
)
from rlscope.config import FIELD_ALIASES, ConfigError, RunConfig, TrainConfig, validate
from rlscope.paths import check_name_component


def _leaves(cfg: object, prefix: str = "") -> list[tuple[str, type]]:
    """Every (dotted path, kind) of the config ``cfg`` whose field is typed float or int (an
    unset ``float | None`` override included), read from the type annotations."""
    out: list[tuple[str, type]] = []
    for f in dataclasses.fields(cfg):  # type: ignore[arg-type]
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            out += _leaves(value, f"{prefix}{f.name}.")
        elif str(f.type) in ("float", "float | None"):
            out.append((prefix + f.name, float))
        elif str(f.type) in ("int", "int | None"):
            out.append((prefix + f.name, int))
    return out


def _with(cfg: object, path: str, value: object) -> object:
    """``cfg`` with the dotted field ``path`` set to ``value`` (frozen dataclasses)."""
    head, _, rest = path.partition(".")
    if not rest:
        return dataclasses.replace(cfg, **{head: value})  # type: ignore[type-var]
    return dataclasses.replace(cfg, **{head: _with(getattr(cfg, head), rest, value)})  # type: ignore[type-var]


def _shown(path: str) -> str:
    """How messages name the dotted field ``path`` (``components.x`` → ``method.x``)."""
    head, _, rest = path.partition(".")
    return f"{FIELD_ALIASES.get(head, head)}.{rest}" if rest else path


def _base(tmp_path: Path) -> TrainConfig:
    return TrainConfig(run=RunConfig(runs_dir=str(tmp_path / "runs"), device="cpu"))


LEAVES = _leaves(TrainConfig())


def test_the_walk_finds_the_fields_of_the_issue() -> None:
    names = {path for path, _ in LEAVES}
    for path in ("optim.lr", "sampling.temperature", "components.kl_coef",
                 "run.checkpoint_every", "task_options.reward_noise", "run.batch_size"):
        assert path in names, path
    assert len([k for _, k in LEAVES if k is float]) > 40


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_every_float_option_must_be_finite(tmp_path: Path, bad: float) -> None:
    base = _base(tmp_path)
    for path, kind in LEAVES:
        if kind is not float:
            continue
        with pytest.raises(ConfigError) as info:
            validate(_with(base, path, bad))  # type: ignore[arg-type]
        message = str(info.value)
        flag = "--" + path.rsplit(".", 1)[-1]
        assert f"{_shown(path)}={bad} must be a finite number ({flag})" in message, path
    assert not (tmp_path / "runs").exists()


def test_every_count_must_be_non_negative(tmp_path: Path) -> None:
    base = _base(tmp_path)
    for path, kind in LEAVES:
        if kind is not int or path == "run.seed":
            continue
        with pytest.raises(ConfigError) as info:
            validate(_with(base, path, -1))  # type: ignore[arg-type]
        assert f"{_shown(path)}=-1 must be >= " in str(info.value), path
    validate(_with(base, "run.seed", -3))  # type: ignore[arg-type]  # a seed may be negative


@dataclass(frozen=True)
class Inner:
    scale: float | None = None
    ids: tuple[int, ...] = ()
    flag: bool = False


@dataclass(frozen=True)
class Outer:
    inner: Inner = dataclasses.field(default_factory=Inner)
    seed: int = 0
    rate: float = 1.0


def test_field_errors_walks_optionals_tuples_and_nesting() -> None:
    assert field_errors(Outer(Inner(scale=2.0, ids=(1, 2)), seed=-5)) == []
    assert field_errors(Outer(Inner(scale=float("nan"), ids=(3, -1)), rate=float("inf"))) == [
        "inner.scale=nan must be a finite number (--scale)",
        "inner.ids=-1 must be >= 0 (--ids)",
        "rate=inf must be a finite number (--rate)"]
    assert field_errors(Outer(seed=-1), signed=()) == ["seed=-1 must be >= 0 (--seed)"]


@pytest.mark.parametrize("name", ["../../x", "..", ".", "a/b", "/abs", "", "a\0b", "a\nb",
                                  " x", "a\\b"])
def test_unsafe_names_are_refused(name: str) -> None:
    message = check_name_component(name, "--name")
    assert message is not None and message.startswith("--name")
    assert "\n" not in message


@pytest.mark.parametrize("name", ["grpo_s0", "run-1.v2", "..x", "x..", "é"])
def test_plain_names_pass(name: str) -> None:
    assert check_name_component(name, "--name") is None


def test_train_refuses_a_name_outside_the_runs_dir(tmp_path: Path) -> None:
    cfg = _with(_base(tmp_path), "run.name", "../../escaped")
    with pytest.raises(ConfigError, match=r"--name '\.\./\.\./escaped' holds a path separator"):
        validate(cfg)  # type: ignore[arg-type]


def test_device_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    assert device_errors("cpu") == [] and device_errors("auto") == []
    assert device_errors("gpu") == [
        "run.device='gpu' is not a device: use cpu, cuda, cuda:N or auto"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device_errors("cuda:7") == [
        "run.device='cuda:7' but CUDA is not available on this machine: use --device cpu "
        "(or auto)"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert device_errors("cuda:1") == [] and device_errors("cuda") == []
    assert device_errors("cuda:7") == [
        "run.device='cuda:7' but this machine has 2 CUDA device(s), cuda:0..cuda:1: pick one "
        "of those"]


def test_writable_dir_errors(tmp_path: Path) -> None:
    assert writable_dir_errors(str(tmp_path / "new" / "deeper"), "--runs_dir") == []
    assert not (tmp_path / "new").exists()  # the check creates nothing
    assert list(tmp_path.iterdir()) == []  # and leaves no temporary file
    (tmp_path / "file").write_text("x")
    [message] = writable_dir_errors(str(tmp_path / "file" / "runs"), "--runs_dir")
    assert message.startswith(f"--runs_dir {tmp_path / 'file' / 'runs'}: ")
    assert "is a file, not a directory" in message
    [message] = writable_dir_errors("/proc/rlscope_runs", "--runs_dir")
    assert message.startswith("--runs_dir /proc/rlscope_runs: cannot write in /proc")


def test_train_checks_paths_before_training(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    cfg = TrainConfig(run=RunConfig(runs_dir=str(tmp_path / "file" / "runs"), device="cpu",
                                    init=str(tmp_path / "no_sft"), output=str(tmp_path / "file"
                                                                              / "r.csv")))
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    lines = str(info.value).splitlines()
    assert lines[0] == "invalid configuration:"
    assert any(line.startswith(f"  - --init {tmp_path / 'no_sft'}: no such file or directory")
               for line in lines)
    assert any(line.startswith(f"  - --runs_dir {tmp_path / 'file' / 'runs'}: ")
               for line in lines)
    assert any(line.startswith("  - --output ") for line in lines)


def test_resume_needs_a_run_directory_with_a_checkpoint(tmp_path: Path) -> None:
    base = _base(tmp_path)
    with pytest.raises(ConfigError, match=r"--resume .*missing: no such file or directory"):
        validate(_with(base, "run.resume", str(tmp_path / "missing")))  # type: ignore[arg-type]
    (tmp_path / "empty_run").mkdir()
    with pytest.raises(ConfigError, match=r"--resume .*empty_run: no checkpoint in"):
        validate(_with(base, "run.resume", str(tmp_path / "empty_run")))  # type: ignore[arg-type]


def test_rm_path_missing(tmp_path: Path) -> None:
    cfg = _with(_with(_with(_base(tmp_path), "task", "preference_rm"), "method", "ppo"),
                "task_options.rm_path", str(tmp_path / "nope"))
    with pytest.raises(ConfigError) as info:
        validate(cfg)  # type: ignore[arg-type]
    matching = [line for line in str(info.value).splitlines() if "--rm_path" in line]
    assert len(matching) == 1 and str(tmp_path / "nope") in matching[0]  # said once


def test_optional_modules_name_their_extra(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    real = checks.importlib.util.find_spec
    monkeypatch.setattr(checks.importlib.util, "find_spec",
                        lambda name, *a: None if name == "transformers" else real(name, *a))
    assert module_errors("transformers", "--arch qwen2") == [
        "--arch qwen2 needs transformers: pip install 'rlscope[hf]'"]
    with pytest.raises(ConfigError, match=r"--arch qwen2 needs transformers: pip install "
                                          r"'rlscope\[hf\]'"):
        validate(_with(_base(tmp_path), "model.arch", "qwen2"))  # type: ignore[arg-type]
    from rlscope.policy import ModelConfig
    from rlscope.supervised.sft import SftConfig, validate_sft

    assert validate_sft(SftConfig(model=ModelConfig(arch="qwen2"), runs_dir=str(tmp_path))) == [
        "--arch qwen2 needs transformers: pip install 'rlscope[hf]'"]
    assert module_errors("json", "x") == []
    assert install_hint(ModuleNotFoundError("No module named 'peft'", name="peft")) == (
        "this command needs peft: pip install 'rlscope[hf]'")


def test_a_40m_batch_is_rejected_at_once(tmp_path: Path) -> None:
    cfg = _with(_base(tmp_path), "run.batch_size", 40_000_000)
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        validate(cfg)  # type: ignore[arg-type]
    assert time.perf_counter() - t0 < 5.0
    [line] = [x for x in str(info.value).splitlines() if "memory" in x]
    assert "one step needs at least" in line and "GiB" in line and "free" in line
    assert line.endswith("lower --batch_size")
    assert not (tmp_path / "runs").exists()


def test_memory_errors_states_estimate_free_and_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    terms = [MemoryTerm("the model", 2 * 2**30, "lower --d_model"),
             MemoryTerm("the learner's logits", 6 * 2**30, "lower --micro_batch_size")]
    monkeypatch.setattr(checks, "available_memory", lambda device: 4 * 2**30)
    assert memory_errors(terms, "cpu") == [
        "memory: one step needs at least 8.0 GiB on cpu but 4.0 GiB is free; the largest part "
        "is the learner's logits (6.0 GiB): lower --micro_batch_size"]
    monkeypatch.setattr(checks, "available_memory", lambda device: 16 * 2**30)
    assert memory_errors(terms, "cpu") == []

    def never(device: str) -> int:
        raise AssertionError("a small estimate must not query the device")

    monkeypatch.setattr(checks, "available_memory", never)
    assert memory_errors([MemoryTerm("tiny", 2**20, "lower --batch_size")], "cuda:0") == []


def test_the_default_configs_pass(tmp_path: Path) -> None:
    """The defaults of every task validate (no false alarm from the new checks)."""
    from rlscope.tasks import TASKS

    for task in TASKS:
        if task == "preference_rm":
            continue  # needs --rm_path by design
        method = "ce" if task == "digits_bandit" else "reinforce"
        validate(_with(_with(_base(tmp_path), "task", task), "method", method))  # type: ignore[arg-type]
    assert checks.available_memory("cpu") is not None


def test_step_memory_reads_a_local_model_config(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """--arch hf: the sizes come from the model's config.json (a 7B-like model: about 6.5e9
    parameters, 16 bytes each with Adam), so the estimate names the model as the largest part."""
    import json

    from rlscope.config import LearnerConfig, derive, step_memory
    from rlscope.methods import resolve_method
    from rlscope.policy import ModelConfig
    from rlscope.tasks import TaskConfig, make_task

    (tmp_path / "config.json").write_text(json.dumps({
        "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 11008, "vocab_size": 151936}))
    # full logits (--logprob_chunk 0): the learner holds every position's float32 logits
    cfg = TrainConfig(model=ModelConfig(arch="hf", path=str(tmp_path)),
                      learner=LearnerConfig(logprob_chunk=0))
    task = make_task(cfg.task, TaskConfig())
    terms = step_memory(cfg, task, derive(cfg, resolve_method(cfg.method), task))
    params = 32 * (4 * 4096**2 + 3 * 4096 * 11008) + 2 * 151936 * 4096
    assert terms[0].bytes == params * 16
    assert terms[0].fix == "train LoRA adapters (--lora_rank 16) or use a smaller model"
    rows, seq = 96, task.prompt_len + task.completion_len
    assert terms[1].bytes >= rows * seq * 151936 * 4 * 2  # the learner's float32 logits
    monkeypatch.setattr(checks, "available_memory", lambda device: 80 * 2**30)
    [message] = memory_errors(terms, "cuda:0")
    assert "on cuda:0 but 80.0 GiB is free" in message
    assert message.endswith("(--lora_rank 16) or use a smaller model")
    tiny = TrainConfig()
    assert sum(t.bytes for t in step_memory(tiny, task, derive(
        tiny, resolve_method(tiny.method), task))) < 256 * 2**20  # never queries the device


def test_every_environment_problem_is_listed_together(tmp_path: Path) -> None:
    """A bad device does not hide a missing --resume checkpoint, and a run with a bad float
    still hears about its paths (one report, every problem)."""
    (tmp_path / "run").mkdir()
    cfg = TrainConfig(run=RunConfig(runs_dir=str(tmp_path), device="nonsense",
                                    resume=str(tmp_path / "run"), name="a/b"))
    with pytest.raises(ConfigError) as info:
        validate(dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, lr=math.nan)))
    problems = str(info.value).splitlines()[1:]
    assert [p.split()[1].split("=")[0] for p in problems] == [
        "optim.lr", "run.device", "--name", "--resume"]
