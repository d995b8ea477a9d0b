"""The ``tree`` step kind (`rlscope.steps.tree`: ``rlm_grpo`` on ``rlm_papers``): the chat
codec, the recorded generations, segments of scripted trees with their credit, every
rejection of COMPANIONS.md §4, a run through `rlscope.train.train`, exact resume, and the
``rlscope sft --task rlm_papers`` warm start loaded by ``--init``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from rlscope import steps
from rlscope.config import ConfigError, OptimConfig, RunConfig, TrainConfig
from rlscope.envs.rlm import (
    RlmConfig,
    ScriptedPolicy,
    TreeScore,
    load_examples,
    run_trees,
    split_examples,
    tree_metrics,
)
from rlscope.envs.rlm.trainer import RlmTrainConfig
from rlscope.methods import MethodConfig
from rlscope.metrics.schema import unregistered
from rlscope.policy import ModelConfig
from rlscope.policy.hf import HFPolicy, tiny_hf_model
from rlscope.sampling import SamplingConfig
from rlscope.steps.tree import TreeStep, tree_segments
from rlscope.steps.tree_model import (
    ByteChat,
    Generation,
    Message,
    RecordingGenerator,
    transcript_ids,
)
from rlscope.steps.tree_update import UpdateOptions, update_on_segments
from rlscope.supervised.rlm_sft import rlm_sft, rlm_sft_errors
from rlscope.supervised.sft import SftConfig
from rlscope.tasks import TaskConfig
from rlscope.train import train

SMALL = ModelConfig(arch="qwen2", d_model=32, n_layers=1, n_heads=2)
FAST = RlmConfig(max_root_turns=1, max_children=1, max_children_per_call=1,
                 max_plan_tokens=8, max_child_tokens=8)


ONE_EVAL = RlmTrainConfig(eval_examples=1)


def config(tmp_path: Path, rlm: RlmConfig = FAST, model: ModelConfig = SMALL,
           rlm_train: RlmTrainConfig = ONE_EVAL, components: MethodConfig | None = None,
           **run: Any) -> TrainConfig:
    return TrainConfig(method="rlm_grpo", task="rlm_papers", model=model, rlm=rlm,
                       rlm_train=rlm_train, components=components or MethodConfig(),
                       run=RunConfig(**{"num_steps": 1, "batch_size": 2, "group_size": 2,
                                        "eval_every": 0, "runs_dir": str(tmp_path / "runs"),
                                        "progress": False, "device": "cpu", **run}))


def records(run_dir: Path, name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / name).read_text().splitlines()]


def test_the_byte_chat_renders_messages_and_trains_assistant_turns_only() -> None:
    codec = ByteChat()
    # ids: <|system|> 256, <|user|> 257, <|assistant|> 258, <|end|> 259; "a" = 97
    messages: list[Message] = [{"role": "user", "content": "a"},
                               {"role": "assistant", "content": "bc"},
                               {"role": "user", "content": "d"}]
    assert codec.prompt_ids(messages[:1]) == [257, 97, 259, 258]
    ids, mask = transcript_ids(codec, messages, [False, True, False])
    assert ids == [257, 97, 259, 258, 98, 99, 259, 257, 100, 259]
    # trained: "b", "c" and the stop id <|end|> of the assistant turn; never <|assistant|>
    assert mask == [False] * 4 + [True] * 3 + [False] * 3
    assert codec.decode([98, 99, 259]) == "bc"
    with pytest.raises(ValueError, match="only assistant turns are trained"):
        transcript_ids(codec, messages, [True, False, False])


def test_the_recording_generator_keeps_the_sampled_ids_of_every_row() -> None:
    codec = ByteChat()
    policy = HFPolicy(tiny_hf_model("qwen2", codec.vocab_size, seed=0, hidden_size=16,
                                    num_layers=1, num_heads=2, max_len=64))
    generate = RecordingGenerator(policy, codec, False, torch.Generator().manual_seed(0),
                                  torch.device("cpu"))
    conversations: list[list[Message]] = [[{"role": "user", "content": "hi"}],
                                          [{"role": "user", "content": "hello"}]]
    texts = generate(conversations, 6)
    assert len(texts) == 2
    for conversation, text in zip(conversations, texts, strict=True):
        record = generate.take(conversation, text)
        assert record.prompt_ids == tuple(codec.prompt_ids(conversation))
        assert 1 <= len(record.completion_ids) <= 6
        assert codec.decode(record.completion_ids) == text
        # a stop id, if drawn, ends the generation
        assert codec.end_id not in record.completion_ids[:-1]
    with pytest.raises(KeyError, match="no recorded generation"):
        generate.take(conversations[0], texts[0])


class ScriptedRecorder:
    """The scripted policy as the tree step sees a model: its texts, with the byte codec's
    ids recorded (the text's bytes, then <|end|>)."""

    def __init__(self, examples: Sequence[Any]) -> None:
        self.script, self.codec = ScriptedPolicy(examples), ByteChat()
        self.records: dict[str, Generation] = {}

    def __call__(self, conversations: Sequence[list[Message]],
                 max_new_tokens: int) -> list[str]:
        texts = self.script(conversations, max_new_tokens)
        for conversation, text in zip(conversations, texts, strict=True):
            self.records[json.dumps([conversation, text])] = Generation(
                tuple(self.codec.prompt_ids(conversation)),
                (*self.codec.tokenizer.encode(text), self.codec.end_id), text, True)
        return texts

    def take(self, messages: Sequence[Message], text: str) -> Generation:
        return self.records[json.dumps([list(messages), text])]

    def count_tokens(self, messages: list[Message]) -> int:
        return len(self.codec.prompt_ids(messages))


def test_scripted_trees_become_weighted_segments_and_train_root_and_child_turns() -> None:
    """The scripted policy's trees (a root of 3 turns: search, rlm_query, FINAL; one child
    of 2 turns) give root weights 1/3 and child weights 1/(1·2); --no_train_child_trajectories
    zeroes the child's. The update on them moves the weights."""
    train_examples, _ = split_examples(load_examples())
    examples = train_examples[:2]
    recorder = ScriptedRecorder(examples)
    trees = run_trees(examples, recorder, RlmConfig(), recorder.count_tokens)
    assert all(t.has_final and len(t.children) == 1 for t in trees)
    adv_B = torch.tensor([1.0, -1.0])
    segments = tree_segments(trees, recorder.take, adv_B, True)
    for i, tree in enumerate(trees):
        mine = [s for s in segments if s.tree == i]
        roots = [s for s in mine if s.child == -1]
        kids = [s for s in mine if s.child == 0]
        assert len(roots) == tree.root_turns and len(kids) == tree.children[0].turns
        assert sum(s.weight for s in roots) == pytest.approx(1.0)
        assert sum(s.weight for s in kids) == pytest.approx(1.0)
        assert all(s.advantage == float(adv_B[i]) for s in mine)
    assert [s.weight for s in tree_segments(trees, recorder.take, adv_B, False)
            if s.child >= 0] == [0.0] * sum(s.child >= 0 for s in segments)
    codec = ByteChat()
    policy = HFPolicy(tiny_hf_model("qwen2", codec.vocab_size, seed=0, hidden_size=16,
                                    num_layers=1, num_heads=2, max_len=4096))
    reference = HFPolicy(tiny_hf_model("qwen2", codec.vocab_size, seed=0, hidden_size=16,
                                       num_layers=1, num_heads=2, max_len=4096))
    params = list(policy.parameters())
    before = [p.detach().clone() for p in params]
    metrics = update_on_segments(policy, reference, torch.optim.SGD(params, lr=0.1), params,
                                 segments, len(trees), UpdateOptions(),
                                 torch.Generator().manual_seed(0))
    assert metrics["policy/ratio_mean"] == pytest.approx(1.0)
    assert any(not torch.equal(p, b) for p, b in zip(params, before, strict=True))


@pytest.mark.parametrize(("change", "message"), [
    ({"run": {"group_size": 1, "batch_size": 2}}, r"--group_size 1: rlm_grpo compares"),
    ({"run": {"group_size": 2, "batch_size": 3}}, r"--batch_size 3 is not a multiple"),
    ({"rlm": {"max_root_turns": 0}}, r"--max_root_turns must be >= 1"),
    ({"rlm": {"max_plan_tokens": 0}}, r"--max_plan_tokens must be >= 1"),
    ({"rlm": {"repl_timeout": 0.5}}, r"--repl_timeout must be >= 1"),
    ({"rlm": {"max_observation_chars": 0}}, r"--max_observation_chars must be >= 1"),
    ({"rlm": {"max_reward_predictions": 0}}, r"--max_reward_predictions must be >= 1"),
    ({"rlm": {"max_children": -1}}, r"max_children=-1 must be >= 0"),
    ({"rlm": {"max_children": 2, "max_children_per_call": 3}},
     r"--max_children_per_call 3 exceeds --max_children 2"),
    ({"rlm": {"max_children_per_call": 0}}, r"--max_children_per_call must be >= 1"),
    ({"components": {"clip_low": 0.0}}, r"the PPO clip must be > 0"),
    ({"components": {"kl_coef": -0.1}}, r"--kl_coef -0.1 must be >= 0"),
    ({"components": {"advantage": "rloo"}}, r"--advantage: rlm_grpo's update is fixed"),
    ({"rlm": {"reward_mode": "judge"}}, r"--reward_mode judge needs --judge_base_url"),
    ({"rlm": {"reward_mode": "judge", "judge_base_url": "http://x/v1", "judge_model": "m",
              "judge_api_key_env": "RLSCOPE_TEST_UNSET_KEY"}},
     r"set the environment variable RLSCOPE_TEST_UNSET_KEY"),
    ({"rlm_train": {"load_in_4bit": True}}, r"--load_in_4bit needs LoRA"),
    ({"rlm_train": {"load_in_4bit": True}, "model": {"lora_rank": 4}},
     r"--load_in_4bit needs LoRA \(--lora_rank > 0\), --arch hf and a CUDA device"),
    ({"rlm_train": {"enable_thinking": True}}, r"--enable_thinking needs --arch hf"),
    ({"model": {"arch": "tiny"}}, r"--arch tiny: rlm_grpo trains a Hugging Face model"),
    ({"run": {"delay": 1}}, r"--delay is not supported by the 'tree' step"),
    ({"model": {"d_model": 30, "n_heads": 4}}, r"model.d_model=30 must be divisible"),
    ({"sampling": {"temperature": 0.7}}, r"--temperature, --top_p, --top_k, --max_new_tokens: "
                                         r"rlm_grpo samples at temperature 1"),
])
def test_each_rejection_names_what_to_change(tmp_path: Path, change: dict[str, dict[str, Any]],
                                             message: str) -> None:
    base = config(tmp_path)
    parts: dict[str, Any] = {
        "rlm": RlmConfig(**{**vars(FAST), **change.get("rlm", {})}),
        "model": ModelConfig(**{**vars(SMALL), **change.get("model", {})}),
        "rlm_train": RlmTrainConfig(**change.get("rlm_train", {})),
        "components": MethodConfig(**change.get("components", {})),
        "sampling": SamplingConfig(**change.get("sampling", {}))}
    cfg = TrainConfig(method=base.method, task=base.task, run=RunConfig(**{
        **vars(base.run), **change.get("run", {})}), **parts)
    with pytest.raises(ConfigError, match=message):
        steps.validate_run(cfg)


def test_rlm_grpo_and_rlm_papers_belong_to_the_tree_step(tmp_path: Path) -> None:
    assert steps.validate_run(config(tmp_path)) == "tree"
    with pytest.raises(ConfigError, match=r"--method rlm_grpo trains with the 'tree' step, but "
                                          r"--task token_reversal is a task of the 'rollout'"):
        steps.validate_run(TrainConfig(method="rlm_grpo", task="token_reversal"))
    with pytest.raises(ConfigError, match=r"--task rlm_papers is a task of the 'tree' step.*"
                                          r"rlm_grpo"):
        steps.validate_run(TrainConfig(method="grpo", task="rlm_papers"))


def test_a_run_logs_its_metrics_trees_evaluation_and_model(tmp_path: Path) -> None:
    result = train(config(tmp_path, num_steps=2, eval_every=1, log_samples=2, samples_every=1))
    assert result.status == "completed"
    metrics = records(result.run_dir, "metrics.jsonl")
    evals = records(result.run_dir, "eval.jsonl")
    assert [m["step"] for m in metrics] == [0, 1]
    assert [e["step"] for e in evals] == [0, 1, 2]
    for m in metrics:  # 2 trees of one root turn each (max_root_turns 1)
        assert m["rlm/root_segments"] == 2.0 and m["rlm/root_turns_mean"] == 1.0
        assert m["rlm/segments"] == m["rlm/root_segments"] + m["rlm/child_segments"]
        assert 0.0 <= m["reward/mean"] <= m["reward/max"] <= 1.0
    names = {k for record in metrics + evals for k in record}
    assert {"loss/total", "policy/kl_ref_k3", "policy/ratio_mean", "policy/clipfrac_region",
            "rlm/segment_loss_mean", "adv/mean", "group/mixed_rate", "reward/precision",
            "eval/reward", "eval/final_rate", "eval/children_mean"} <= names
    assert unregistered(names) == []
    trees = records(result.run_dir, "samples.jsonl")
    assert [t["step"] for t in trees] == [0, 0, 1, 1]
    assert trees[0]["segments"][0]["prompt"][0]["role"] == "system"
    model = result.run_dir / "model"
    assert (model / "config.json").is_file() and (model / "tokenizer.json").is_file()
    assert (model / "model.safetensors").is_file()  # --lora_rank 0: the full model


def test_a_resumed_run_equals_the_uninterrupted_run(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Rewards by answer length (a mixed group whatever the random model writes) so that
    the updates are not zero; LoRA so the adapter is the trained state."""

    def by_length(self: TreeStep, trees: list[Any], examples: list[Any]
                  ) -> tuple[torch.Tensor, dict[str, float]]:
        rewards = [sum(len(s.text) for s in t.segments) / 8.0 for t in trees]
        return (torch.tensor(rewards, dtype=torch.float64),
                tree_metrics(trees, [TreeScore(r, 0.0, 0.0, 0) for r in rewards]))

    monkeypatch.setattr(TreeStep, "_rewards", by_length)
    lora = ModelConfig(**{**vars(SMALL), "lora_rank": 2, "lora_alpha": 4})
    cfgs = {"model": lora, "rlm_train": RlmTrainConfig(eval_examples=1)}

    def run(folder: str, **run_options: Any) -> Any:
        cfg = config(tmp_path / folder, **{"num_steps": 3, "checkpoint_every": 1,
                                           **run_options}, **cfgs)
        return train(TrainConfig(**{**vars(cfg), "optim": OptimConfig(lr=0.05)}))

    whole = run("a")
    first = run("b", num_steps=2)
    resumed = run("b", resume=str(first.run_dir))
    keys = ("loss/total", "policy/kl_ref_k3", "reward/mean", "rlm/segments")
    ours = [[m[k] for k in keys] for m in records(resumed.run_dir, "metrics.jsonl")]
    theirs = [[m[k] for k in keys] for m in whole.metrics]
    assert ours == theirs
    assert any(m["policy/kl_ref_k3"] > 0 for m in whole.metrics[1:])  # the adapter moved
    assert (resumed.run_dir / "model" / "adapter_model.safetensors").is_file()


def test_the_scripted_warm_start_trains_assistant_turns_and_loads_into_train(
        tmp_path: Path) -> None:
    cfg = SftConfig(task="rlm_papers", model=SMALL, num_steps=2, batch_size=1, eval_every=0,
                    lr=1e-2, runs_dir=str(tmp_path), name="warm", progress=False, device="cpu")
    assert rlm_sft_errors(cfg) == []
    assert "--data: rlm_papers trains on its scripted transcripts" in " ".join(
        rlm_sft_errors(SftConfig(task="rlm_papers", model=SMALL, data="x.jsonl")))
    result = rlm_sft(cfg)
    assert [m["step"] for m in result.metrics] == [0, 1]
    assert result.metrics[1]["sft/loss"] < result.metrics[0]["sft/loss"] * 2  # finite, sane
    assert result.evals[-1]["sft/heldout_loss"] > 0
    run = train(config(tmp_path, init=str(result.out_dir)))
    assert run.status == "completed"


def test_the_smoke_line_is_accepted_by_the_cli_parser() -> None:
    from rlscope.cli import _tyro_parse

    cfg = _tyro_parse(TrainConfig, [
        "--task", "rlm_papers", "--method", "rlm_grpo", "--arch", "qwen2", "--d_model", "64",
        "--n_layers", "2", "--n_heads", "2", "--batch_size", "2", "--group_size", "2",
        "--max_root_turns", "2", "--max_children", "2", "--max_children_per_call", "2",
        "--max_plan_tokens", "32", "--max_child_tokens", "32", "--no_train_child_trajectories",
        "--no_scale_rewards", "--unsafe_sandbox"], "rlscope train")
    assert isinstance(cfg, TrainConfig)
    assert cfg.rlm.max_children == 2 and not cfg.rlm.train_child_trajectories
    assert not cfg.rlm_train.scale_rewards and cfg.task_options == TaskConfig(unsafe_sandbox=True)
    assert steps.validate_run(cfg) == "tree"


@pytest.mark.slow
def test_the_smoke_config_of_section_6_runs_two_steps(tmp_path: Path) -> None:
    cfg = TrainConfig(
        method="rlm_grpo", task="rlm_papers",
        model=ModelConfig(arch="qwen2", d_model=64, n_layers=2, n_heads=2),
        rlm=RlmConfig(max_root_turns=2, max_children=2, max_children_per_call=2,
                      max_plan_tokens=32, max_child_tokens=32),
        run=RunConfig(num_steps=2, eval_every=1, batch_size=2, group_size=2, device="cpu",
                      runs_dir=str(tmp_path), progress=False, output=str(tmp_path / "o.csv")))
    result = train(cfg)
    assert result.status == "completed"
    assert [m["step"] for m in records(result.run_dir, "metrics.jsonl")] == [0, 1]
    assert len((tmp_path / "o.csv").read_text().splitlines()) == 1 + 3


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_a_local_model_directory_trains_with_its_tokenizer_and_chat_template(
        tmp_path: Path) -> None:
    """--arch hf --path DIR: the directory's tokenizer and ChatML template render the
    conversations, <|im_end|> stops a turn, and a LoRA run on it completes."""
    from transformers import AutoTokenizer

    from rlscope.serve.tokenizer_dir import CHAT_SPECIALS, write_tokenizer_dir
    from rlscope.steps.tree_model import TemplateChat

    model_dir = tmp_path / "local"
    tiny_hf_model("qwen2", 256 + len(CHAT_SPECIALS), seed=1, hidden_size=32, num_heads=2,
                  num_layers=1, max_len=4096).save_pretrained(str(model_dir))
    write_tokenizer_dir(model_dir, "tiny-qwen2-chat", marker=False)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    tokenizer.chat_template = CHATML
    tokenizer.save_pretrained(str(model_dir))

    codec = TemplateChat(str(model_dir), enable_thinking=False)
    im_start, im_end = 257, 258  # <|im_start|>, <|im_end|>
    assert im_end in codec.stop_ids
    messages: list[Message] = [{"role": "user", "content": "a"},
                               {"role": "assistant", "content": "b"}]
    nl = 10
    # <|im_start|>user\na<|im_end|>\n then the generation prompt <|im_start|>assistant\n
    assert codec.prompt_ids(messages[:1]) == [im_start, *b"user", nl, 97, im_end, nl,
                                              im_start, *b"assistant", nl]
    ids, mask = transcript_ids(codec, messages, [False, True])
    assert [i for i, m in zip(ids, mask, strict=True) if m] == [98, im_end, nl]
    assert codec.decode([98, im_end]) == "b"

    model = ModelConfig(arch="hf", path=str(model_dir), lora_rank=2, lora_alpha=4)
    rlm = RlmConfig(**{**vars(FAST), "max_prompt_tokens": 3000})
    result = train(config(tmp_path, rlm=rlm, model=model))
    assert result.status == "completed"
    assert (result.run_dir / "model" / "tokenizer_config.json").is_file()
    assert (result.run_dir / "model" / "adapter_config.json").is_file()


def test_a_train_file_of_train_rows_trains_and_evaluates_nothing(tmp_path: Path) -> None:
    shipped = Path(__file__).parents[1] / "src" / "rlscope" / "data" / "rlm_papers.jsonl"
    rows = [json.loads(line) for line in shipped.read_text().splitlines()]
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows if r["split"] == "train"))
    rlm = RlmConfig(**{**vars(FAST), "train_file": str(data), "max_examples": 2})
    result = train(config(tmp_path, rlm=rlm))
    assert result.status == "completed"
    assert "2 train / 0 eval examples" in json.loads(
        (result.run_dir / "config.json").read_text())["task_description"]
    assert [set(e) for e in records(result.run_dir, "eval.jsonl")] == [{"step", "time/eval"}]
