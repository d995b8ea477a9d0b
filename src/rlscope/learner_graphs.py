"""`learner.update` replayed from CUDA graphs (the tiny transformer on CUDA).

At sandbox sizes one optimizer step is ~300 kernels of a few microseconds each, and launching
them from Python costs several times more than running them (7 ms against 1 ms on an H200).
`GraphedUpdate` records one minibatch step — forward and backward of every micro-batch,
gradient clipping and the ``capturable`` AdamW step — once per minibatch position as a CUDA
graph over static buffers; per update it copies the batch in once and replays the graphs
``inner_epochs`` times. The warm-up step a capture needs is undone exactly.

What changes between steps must live on the device, since a graph bakes Python numbers in:
β, the entropy coefficient c (adaptive entropy control moves it) and the row count
``Denominators.n_seqs`` are 0-d tensors filled before the replays.

Rows. Mixed-group selection drops rows, and a graph needs a fixed row count. With one
minibatch per pass the kept rows are padded back to the full count with copies of real rows
whose loss mask is 0: every aggregation masks them and ``n_seqs`` stays the kept count, so the
update is unchanged. With several minibatches padding would move the minibatch boundaries, so
such a batch (and any batch of a layout not seen in the first few) runs `learner.update`.

The result equals `learner.update` with the same optimizer up to float rounding. Capturable
AdamW itself differs from the default one by computing 1 − β^t in float32 on the device.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from rlscope.batch import RolloutBatch
from rlscope.learner import (
    FIELDS_READ,
    Denominators,
    LearnerInputs,
    MicroResult,
    UpdatePlan,
    UpdateResult,
    concat_results,
    micro_batch_loss,
    micro_group_size,
    update,
)
from rlscope.policy.base import Policy
from rlscope.policy.value_head import ValueHead
from rlscope.sampling.graphs import capture

MAX_LAYOUTS = 4
"""Batch layouts (shapes) captured at most; later new layouts run eagerly."""


@dataclass
class _Captured:
    """The graphs of one batch layout and the static tensors they read and write."""

    batch: RolloutBatch
    inputs: LearnerInputs
    n_seqs: torch.Tensor
    beta: torch.Tensor
    entropy_coef: torch.Tensor
    graphs: list[torch.cuda.CUDAGraph]
    outputs: list[tuple[MicroResult, torch.Tensor]]
    """Per minibatch position: its micro-batches' results stitched, and the gradient norm."""


def _layout(batch: RolloutBatch, inputs: LearnerInputs) -> tuple[object, ...]:
    """Shapes (past the row dimension) and dtypes of every tensor the graphs read."""
    tensors = [getattr(batch, name) for name in FIELDS_READ]
    tensors += [getattr(inputs, f.name) for f in dataclasses.fields(inputs)]
    return tuple(None if t is None else (tuple(t.shape[1:]), t.dtype) for t in tensors)


def _pad_rows(batch: RolloutBatch, inputs: LearnerInputs, rows: int
              ) -> tuple[RolloutBatch, LearnerInputs]:
    """``rows`` rows: the real ones, then copies of them with a zero loss mask."""
    n = batch.batch_size
    if n == rows:
        return batch, inputs
    index_R = torch.arange(rows, device=inputs.mask_BT.device) % n
    batch, inputs = batch.select(index_R), inputs.select(index_R)
    mask_BT = inputs.mask_BT.clone()
    mask_BT[n:] = 0
    return batch, dataclasses.replace(inputs, mask_BT=mask_BT)


def _copy_into(static: object, source: object, names: list[str]) -> None:
    for name in names:
        target = getattr(static, name)
        if target is not None:
            target.copy_(getattr(source, name))


def _make_capturable(optimizer: torch.optim.Optimizer) -> None:
    """Adam's step counters on the device (a resumed non-capturable optimizer keeps them on
    the host), so that its step can be captured."""
    for group in optimizer.param_groups:
        group["capturable"] = True
    for param, state in optimizer.state.items():
        if "step" in state:
            state["step"] = state["step"].to(param.device, torch.float32)


class GraphedUpdate:
    """Callable like ``learner.update(plan, policy, value_head, optimizer, ...)`` with the
    first four arguments bound; ``rows`` is the full batch size."""

    def __init__(self, plan: UpdatePlan, policy: Policy, value_head: ValueHead | None,
                 optimizer: torch.optim.Optimizer, rows: int) -> None:
        if rows % plan.num_minibatches:
            raise ValueError(f"{rows} rows do not split into {plan.num_minibatches} minibatches")
        self.plan, self.policy, self.value_head = plan, policy, value_head
        self.optimizer, self.rows = optimizer, rows
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        self.layouts: dict[tuple[object, ...], _Captured] = {}
        _make_capturable(optimizer)

    def __call__(self, batch: RolloutBatch, inputs: LearnerInputs, beta: float,
                 entropy_coef: float | None = None) -> UpdateResult:
        n = batch.batch_size
        key = _layout(batch, inputs)
        fits = n == self.rows or (n < self.rows and self.plan.num_minibatches == 1)
        if not fits or (key not in self.layouts and len(self.layouts) >= MAX_LAYOUTS):
            return update(self.plan, self.policy, self.value_head, self.optimizer, batch,
                          inputs, beta, entropy_coef)
        padded_batch, padded_inputs = _pad_rows(batch, inputs, self.rows)
        if key not in self.layouts:
            self.layouts[key] = self._capture(padded_batch, padded_inputs)
        c = self.layouts[key]
        _copy_into(c.batch, padded_batch, list(FIELDS_READ))
        _copy_into(c.inputs, padded_inputs, [f.name for f in dataclasses.fields(c.inputs)])
        c.n_seqs.fill_(n // self.plan.num_minibatches)
        c.beta.fill_(beta)
        c.entropy_coef.fill_(self.plan.spec.entropy_coef if entropy_coef is None
                             else entropy_coef)
        passes: list[MicroResult] = []
        norms: list[torch.Tensor] = []
        for epoch in range(self.plan.inner_epochs):
            for graph in c.graphs:
                graph.replay()
            norms += [norm.clone() for _, norm in c.outputs]
            if epoch in (0, self.plan.inner_epochs - 1):
                # stitching copies the outputs before the next replay overwrites them
                passes.append(_real_rows(concat_results([r for r, _ in c.outputs]), n))
        return UpdateResult(first=passes[0], last=passes[-1], grad_norms_S=torch.stack(norms))

    def _capture(self, batch: RolloutBatch, inputs: LearnerInputs) -> _Captured:
        device = self.params[0].device
        static_batch = dataclasses.replace(batch, **{
            name: getattr(batch, name).clone() for name in FIELDS_READ
            if getattr(batch, name) is not None})
        c = _Captured(batch=static_batch,
                      inputs=dataclasses.replace(inputs, **{
                          f.name: getattr(inputs, f.name).clone()
                          for f in dataclasses.fields(inputs)
                          if getattr(inputs, f.name) is not None}),
                      # the log-probs' dtype (at least float32), as the eager path's floats
                      n_seqs=torch.zeros((), device=device, dtype=inputs.logp_old_BT.dtype),
                      beta=torch.zeros((), device=device, dtype=inputs.logp_old_BT.dtype),
                      entropy_coef=torch.zeros((), device=device,
                                               dtype=inputs.logp_old_BT.dtype),
                      graphs=[], outputs=[])
        c.n_seqs.fill_(batch.batch_size // self.plan.num_minibatches)
        saved = _snapshot(self.params, self.optimizer)
        for j in range(self.plan.num_minibatches):
            def step(j: int = j) -> None:
                result = self._minibatch_step(c, j)
                if len(c.outputs) > j:
                    c.outputs[j] = result
                else:
                    c.outputs.append(result)
            c.graphs.append(capture(step))
        _restore(saved, self.params, self.optimizer)
        return c

    def _minibatch_step(self, c: _Captured, j: int) -> tuple[MicroResult, torch.Tensor]:
        """`learner.update`'s body for minibatch ``j`` of the static batch."""
        plan = self.plan
        mb_rows = self.rows // plan.num_minibatches
        start, stop = j * mb_rows, (j + 1) * mb_rows
        micro = min(plan.micro_batch_size, mb_rows)
        group_size = micro_group_size(micro, mb_rows, plan.group_size)
        den = Denominators.of(c.inputs, start, stop, plan.max_len, c.n_seqs)
        self.optimizer.zero_grad(set_to_none=True)
        results = []
        for s in range(start, stop, micro):
            rows = slice(s, min(s + micro, stop))
            res = micro_batch_loss(plan.spec, self.policy, self.value_head,
                                   c.batch.select(rows), c.inputs.select(rows), den, c.beta,
                                   plan.dist, group_size,
                                   entropy_coef=c.entropy_coef)
            res.loss.backward()
            results.append(res)
        norm = torch.nn.utils.clip_grad_norm_(
            self.params, plan.grad_clip if plan.grad_clip > 0 else float("inf"))
        self.optimizer.step()
        return concat_results(results), norm


def _real_rows(result: MicroResult, n: int) -> MicroResult:
    return dataclasses.replace(result, logp_BT=result.logp_BT[:n],
                               entropy_BT=result.entropy_BT[:n],
                               stats={k: v[:n] for k, v in result.stats.items()})


_Snapshot = tuple[list[torch.Tensor], dict[torch.Tensor, dict[str, torch.Tensor]]]


def _snapshot(params: list[torch.Tensor], optimizer: torch.optim.Optimizer) -> _Snapshot:
    """Parameters and optimizer state, so the warm-up step before a capture can be undone."""
    state = {p: {k: v.clone() for k, v in s.items() if isinstance(v, torch.Tensor)}
             for p, s in optimizer.state.items()}
    return [p.detach().clone() for p in params], state


@torch.no_grad()
def _restore(saved: _Snapshot, params: list[torch.Tensor],
             optimizer: torch.optim.Optimizer) -> None:
    """In place (the graphs hold these addresses); state the warm-up created is zeroed, which
    is what a fresh Adam state holds."""
    saved_params, saved_state = saved
    for p, value in zip(params, saved_params, strict=True):
        p.copy_(value)
    for p, state in optimizer.state.items():
        for k, v in state.items():
            if isinstance(v, torch.Tensor):
                v.copy_(saved_state[p][k]) if p in saved_state else v.zero_()
