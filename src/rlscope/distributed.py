"""Data-parallel training over ``torch.distributed`` (docs/scaling.md, "Data parallel").

A run launched by ``torchrun --nproc_per_node N -m rlscope.cli train ...`` (or
``rlscope train --nproc N``, which launches that) trains on N ranks, with the same result as
one process on the whole batch:

- **sampling**: every rank draws the whole step's prompts and row seeds from the run's stream
  (so every stream stays in step), then decodes only its contiguous shard of whole groups
  (`DataParallel.sample_rows`); the sampler's noise is keyed by row seeds, so each row's
  sample is the one-process sample. The shards are gathered (`DataParallel.gather_rollouts`)
  and every later stage before the update (scoring, selection, advantages, reference and
  critic forwards) sees the whole batch: every batch statistic is the global one.
- **update**: each optimizer minibatch is split in whole groups across the ranks
  (`DataParallel.rank_rows`); the loss denominators are those of the whole minibatch
  (`rlscope.learner.Denominators`), so the rank's gradients are its share of the global
  gradient and `DataParallel.sum_grads` SUMS them (DDP would average) before clipping, which
  then sees the global norm. Every rank then takes the same optimizer step.
- **metrics**: the per-row results of the update are gathered (`gather_results`), so every
  metric is computed on the whole batch, exactly as in one process; timings differ per rank
  and are reduced by `reduce_timings` (``time/*``: the slowest rank, and ``time/*_mean``).
- **files**: only rank 0 (`DataParallel.is_main`) writes the run directory, logs and
  checkpoints; the weights are replicated, so rank 0's ordinary checkpoint resumes on any
  number of ranks.

With ``--fsdp`` (`DataParallel.sharded`) the policy and value head are sharded by FSDP2
(`shard`): each rank holds a slice of every weight, gradient and Adam moment, the blocks'
weights are all-gathered for each forward and the gradients reduce-scattered as SUMS (the
divide factor is 1), and clipping reads the global norm of the sharded gradients. Every rank
must then run the same number of forwards and backwards per optimizer step (the learner pads
a rank with fewer micro-batches with zero-weighted ones). Everything outside the learner
(sampling, scoring, evaluation, the no-grad forwards of the preparation) reads a plain full
copy of the policy (`sampling_copy`), refreshed after each update (`sync_copy`), so the decode
loop, which ranks end at different steps, runs no collective. Checkpoints are sharded
(`rlscope.checkpoint.save_sharded`).
"""

from __future__ import annotations

import copy
import dataclasses
import os
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from rlscope.batch import RolloutBatch

_T = TypeVar("_T")
_R = TypeVar("_R")

PAD_VALUES = {"completion_tokens_BT": 0, "completion_mask_BT": 0, "logp_sampler_BT": 0,
              "logp_raw_BT": 0, "keep_mask_BTV": True, "entropy_BT": 0,
              "sum_p2_sampler_BT": 0, "env_mask_BT": 0, "turn_BT": -1}
"""The rollout fields whose width is the decoded length T, and what the sampler writes after a
row's stop (`rlscope.sampling.draw`): a shard that stopped early is padded with these."""

BUCKET_NUMEL = 2**25
"""Numbers per gradient all-reduce (bounds the flat copy's memory)."""
TIMED = "time/"
SLOWEST = ("throughput/",)
"""Rates computed from a rank's own timings: the slowest rank's (the minimum) is logged."""


def world_size() -> int:
    """The number of ranks torchrun started (1 outside torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def launched() -> bool:
    """Whether this process is one of several ranks started by torchrun."""
    return world_size() > 1


def split(n: int, parts: int, index: int) -> tuple[int, int]:
    """Bounds ``[lo, hi)`` of part ``index`` of ``n`` items cut into ``parts`` contiguous
    parts whose sizes differ by at most one (the first ones larger)."""
    base, extra = divmod(n, parts)
    lo = index * base + min(index, extra)
    return lo, lo + base + (1 if index < extra else 0)


@dataclass(frozen=True)
class DataParallel:
    """This process's place in a data-parallel run (module docstring)."""

    rank: int
    world_size: int
    local_rank: int
    sharded: bool = False
    """``--fsdp``: the trained modules are sharded by FSDP2 (`shard`), which reduces their
    gradients itself."""

    @property
    def is_main(self) -> bool:
        """Rank 0: the only rank that writes files and the console."""
        return self.rank == 0

    def sample_rows(self, n_rows: int, group_size: int) -> slice:
        """This rank's rows of a freshly sampled batch: a contiguous run of whole groups
        (`check_layout` made the groups divide evenly)."""
        lo, hi = split(n_rows // group_size, self.world_size, self.rank)
        return slice(lo * group_size, hi * group_size)

    def rank_rows(self, start: int, stop: int, group_size: int) -> tuple[int, int]:
        """This rank's rows ``[lo, hi)`` of the minibatch ``[start, stop)``: whole groups when
        the minibatch is whole groups (a rank may get none), else single rows."""
        unit = group_size if group_size > 1 and (stop - start) % group_size == 0 \
            and start % group_size == 0 else 1
        lo, hi = split((stop - start) // unit, self.world_size, self.rank)
        return start + lo * unit, start + hi * unit

    def gather_rollouts(self, rollout: RolloutBatch) -> RolloutBatch:
        """Every rank's shard, in rank order, as one batch on every rank; shards that stopped
        decoding early are padded to the longest as the sampler pads finished rows."""
        device = rollout.completion_tokens_BT.device
        shards = _all_gather(rollout.to("cpu"), self.world_size)
        width = max(s.completion_tokens_BT.shape[1] for s in shards)
        changes: dict[str, Any] = {}
        for f in dataclasses.fields(RolloutBatch):
            values = [getattr(s, f.name) for s in shards]
            if not isinstance(values[0], torch.Tensor):
                continue
            if f.name in PAD_VALUES:
                values = [_pad_width(v, width, PAD_VALUES[f.name]) for v in values]
            changes[f.name] = torch.cat(values)
        return dataclasses.replace(rollout, **changes).to(device)

    def gather_results(self, pieces: list[tuple[int, _R]], device: torch.device) -> list[_R]:
        """Every rank's micro-batch results of one pass (`rlscope.learner.MicroResult`s, each
        with its first row), in row order: the pass over the whole batch as one process would
        have computed it."""
        local = [(row, _map_result(r, lambda t: t.cpu())) for row, r in pieces]
        gathered = [p for rank_pieces in _all_gather(local, self.world_size)
                    for p in rank_pieces]
        gathered.sort(key=lambda p: p[0])
        return [_map_result(r, lambda t: t.to(device)) for _, r in gathered]

    def sum_grads(self, params: list[torch.Tensor]) -> None:
        """Sum the gradients of ``params`` over the ranks (all-reduces of flat buckets of one
        dtype, at most `BUCKET_NUMEL` numbers each). A tensor no rank gave a gradient keeps
        none (the optimizer then skips it, as in one process)."""
        if not params:
            return
        present = torch.tensor([float(p.grad is not None) for p in params],
                               dtype=torch.float64, device=params[0].device)
        dist.all_reduce(present, op=dist.ReduceOp.SUM)
        had = present.tolist()
        for bucket in _buckets(params):
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                              for p in bucket])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            offset = 0
            for p in bucket:
                n = p.numel()
                p.grad = flat[offset:offset + n].view_as(p).clone()
                offset += n
        for p, has in zip(params, had, strict=True):
            if not has:
                p.grad = None

    def reduce_timings(self, values: dict[str, float]) -> dict[str, float]:
        """``time/*`` as the slowest rank's, with ``time/*_mean`` the mean over ranks;
        ``throughput/*`` as the slowest rank's (its minimum); the rest is equal on every rank
        and left as is."""
        timed = sorted(k for k in values if k.startswith(TIMED))
        rates = sorted(k for k in values if k.startswith(SLOWEST))
        if not timed and not rates:
            return values
        # NCCL reduces device tensors only; gloo CPU ones
        device = torch.device("cuda", self.local_rank) if dist.get_backend() == "nccl" \
            else torch.device("cpu")
        x = torch.tensor([values[k] for k in timed] + [-values[k] for k in rates],
                         dtype=torch.float64, device=device)
        high = x.clone()
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
        total = x[:len(timed)].clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        out = dict(values)
        for i, k in enumerate(timed):
            out[k] = float(high[i])
            out[f"{k}_mean"] = float(total[i]) / self.world_size
        for i, k in enumerate(rates):
            out[k] = -float(high[len(timed) + i])
        return out

    def broadcast(self, obj: _T) -> _T:
        """Rank 0's ``obj`` on every rank."""
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        dist.barrier()


def init(device_kind: str, sharded: bool = False) -> DataParallel | None:
    """Join the process group torchrun describes in the environment (gloo on CPU, NCCL on
    CUDA; a CUDA rank uses ``cuda:LOCAL_RANK``), or None in a single-process run.
    ``sharded``: the run shards its model (``--fsdp``)."""
    if not launched():
        return None
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device_kind == "cuda" else "gloo")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device_kind == "cuda":
        torch.cuda.set_device(local_rank)
    return DataParallel(rank=dist.get_rank(), world_size=dist.get_world_size(),
                        local_rank=local_rank, sharded=sharded)


FORWARD_METHODS = ("forward", "forward_shared_prefix", "final_hidden")
"""The policy methods that run a forward (`rlscope.policy.base.Policy`): FSDP gathers the
root's weights around each (FSDP's own hook covers ``__call__`` only)."""


def transformer_blocks(policy: torch.nn.Module) -> list[torch.nn.Module]:
    """The policy's transformer blocks, each its own FSDP unit: the tiny transformer's
    ``blocks``, a Hugging Face decoder's ``layers``; empty for other models (then the root is
    the only unit)."""
    blocks = getattr(policy, "blocks", None)
    if isinstance(blocks, torch.nn.ModuleList):
        return list(blocks)
    model = getattr(policy, "model", None)  # HFPolicy -> the causal LM -> its decoder
    decoder = getattr(model, "model", None) or getattr(model, "transformer", None)
    for name in ("layers", "h"):
        layers = getattr(decoder, name, None)
        if isinstance(layers, torch.nn.ModuleList):
            return list(layers)
    return []


def sampling_copy(policy: torch.nn.Module) -> torch.nn.Module:
    """A plain deep copy of ``policy`` (taken before `shard`): the full weights every rank
    samples, scores and evaluates with."""
    return copy.deepcopy(policy)


def shard(modules: list[torch.nn.Module]) -> None:
    """FSDP2 over the data-parallel ranks: ``fully_shard`` each transformer block, then each
    module in ``modules`` (the policy, the value head) as a root, in place.

    Gradients are reduce-scattered as SUMS (divide factor 1): each rank's gradient is its
    share of the global loss (`rlscope.learner.Denominators`). Mixed precision is the
    single-process one: the weights are gathered in their own dtype (float32 master weights
    under ``--autocast bf16``, whose forward then multiplies in bf16 as in one process; fp32 and
    fp64 runs keep theirs), gradients reduced in it. Gathering in bf16
    (``MixedPrecisionPolicy(param_dtype=bf16)``) would halve the gather traffic but makes the
    norms read bf16-rounded weights, and on CPU fails ("mixed dtype (CPU): expect parameter to
    have scalar type of Float")."""
    from torch.distributed.fsdp import FSDPModule, fully_shard, register_fsdp_forward_method

    for module in modules:
        for block in transformer_blocks(module):
            fully_shard(block)
            if hasattr(block, "forward_shared_prefix"):
                register_fsdp_forward_method(block, "forward_shared_prefix")
        fully_shard(module)
        if hasattr(module, "init_cache"):  # a policy: rlscope calls its methods directly
            for name in FORWARD_METHODS:  # (``policy.forward(...)``, never ``policy(...)``)
                if hasattr(module, name):
                    register_fsdp_forward_method(module, name)
        for sub in module.modules():
            if isinstance(sub, FSDPModule):
                sub.set_gradient_divide_factor(1.0)
                # plain SUM reductions: a divide factor otherwise selects NCCL's PREMUL_SUM
                # for fp32/bf16, which gloo lacks ("Cannot use ReduceOp.PREMUL_SUM with Gloo")
                sub.set_force_sum_reduction_for_comms(True)


def full(x: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a sharded (DTensor) parameter or gradient (a collective: every
    rank calls it), or ``x`` itself."""
    from torch.distributed.tensor import DTensor

    return x.full_tensor() if isinstance(x, DTensor) else x


def local(x: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a sharded (DTensor) tensor, or ``x`` itself."""
    from torch.distributed.tensor import DTensor

    return x.to_local() if isinstance(x, DTensor) else x


@torch.no_grad()
def sync_copy(copy_: torch.nn.Module, sharded: torch.nn.Module) -> None:
    """Copy the sharded module's weights into its full copy (`sampling_copy`): one
    all-gather per tensor, on every rank."""
    own = dict(copy_.named_parameters())
    for name, p in sharded.named_parameters():
        own[name].copy_(full(p.detach()))


def nonfinite_any(params: list[torch.Tensor]) -> torch.Tensor:
    """Per tensor of ``params`` (sharded or not), 1 where any rank's part holds a NaN or an
    infinity, else 0 (``[len(params)]`` float64 on the first tensor's device)."""
    device = local(params[0]).device
    bad = torch.stack([(~torch.isfinite(local(p))).any() for p in params]).to(
        device, torch.float64)
    if dist.is_initialized():
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    return bad


def shutdown() -> None:
    """Leave the process group (after the run, before the process exits)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def check_layout(num_prompts: int, ranks: int) -> list[str]:
    """Why a batch of ``num_prompts`` prompt groups cannot be sampled on ``ranks`` ranks
    (a group never spans ranks; empty when it can)."""
    if num_prompts % ranks:
        return [f"data parallel: the batch's {num_prompts} prompt groups (batch_size / "
                f"group_size) do not split evenly over {ranks} ranks: make batch_size / "
                f"group_size a multiple of {ranks}, or use another --nproc"]
    return []


def _buckets(params: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """``params`` in order, cut into runs of one dtype and device of at most `BUCKET_NUMEL`
    numbers (a larger tensor alone); the same cut on every rank."""
    out: list[list[torch.Tensor]] = []
    size = 0
    for p in params:
        last = out[-1][-1] if out else None
        if last is None or (last.dtype, last.device) != (p.dtype, p.device) \
                or size + p.numel() > BUCKET_NUMEL:
            out.append([])
            size = 0
        out[-1].append(p)
        size += p.numel()
    return out


def _pad_width(x: torch.Tensor, width: int, value: float | bool) -> torch.Tensor:
    if x.shape[1] == width:
        return x
    shape = (x.shape[0], width - x.shape[1], *x.shape[2:])
    return torch.cat([x, torch.full(shape, value, dtype=x.dtype)], 1)


def _map_result(r: _R, fn: Any) -> _R:
    """A `rlscope.learner.MicroResult` with ``fn`` applied to each of its tensors."""
    m: Any = r
    return dataclasses.replace(m, loss=fn(m.loss), logp_BT=fn(m.logp_BT),
                               entropy_BT=fn(m.entropy_BT),
                               stats={k: fn(v) for k, v in m.stats.items()},
                               parts={k: fn(v) for k, v in m.parts.items()})


def _all_gather(obj: _T, world_size: int) -> list[_T]:
    out: list[Any] = [None] * world_size
    dist.all_gather_object(out, obj)
    return out


__all__ = ["DataParallel", "check_layout", "full", "init", "launched", "local", "nonfinite_any",
           "sampling_copy", "shard", "shutdown", "split", "sync_copy", "transformer_blocks",
           "world_size"]
