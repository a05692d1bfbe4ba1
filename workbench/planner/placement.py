"""Where the parameters are: what each pipeline stage's ranks hold, parameter by parameter.

A ``Placement`` is the planner's picture of a layout as built: per pipeline stage, the
parameters one tensor-parallel rank of that stage holds (each as a ``Piece``: its elements
there and the length of its first dimension), and the blocks the stage runs. The bridge
(``workbench.parallel.placement``) derives it from the model and the same ``Layout``, TP
plan and split points that ``parallel/`` applies, so the planner's model state is the
workbench's to the byte: which modules a TP plan shards and which stay whole, a tied head's
copy on the last stage, biases and norms, uneven stages.

Data-parallel sharding is arithmetic on the pieces, as the workbench's wrappers do it:

- FSDP (ZeRO-2/3) shards every parameter on dim 0 and pads it to equal shards:
  ⌈rows / n⌉ · (elements per row) on every rank; a gathered parameter (ZeRO-2 keeps them
  between steps) lives in its padded all-gather output, n times the shard; optimizer
  state, made from the shard, is unpadded (the last ranks' shards may be shorter);
- ZeRO-1 (``ZeroRedundancyOptimizer``) places whole parameters: largest first, each on
  the rank holding the fewest elements so far (the first such rank on a tie).
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.errors import ConfigError
from workbench.planner.specs import ModelSpec, ParallelSpec

__all__ = ["Piece", "Placement", "dimension_placement", "zero1_shares"]


@dataclass(frozen=True, slots=True)
class Piece:
    """One parameter as one rank holds it before data-parallel sharding."""

    numel: int  # elements on this rank (after any tensor-parallel split)
    rows: int  # length of dim 0 (FSDP shards it); 1 for a scalar
    trainable: bool = True

    def shard(self, parts: int) -> int:
        """Elements one of ``parts`` FSDP ranks holds: dim 0 split, padded to equal shards."""
        if parts == 1 or self.numel == 0:
            return self.numel
        return -(-self.rows // parts) * (self.numel // self.rows)

    def local(self, parts: int, rank: int) -> int:
        """Elements of FSDP rank ``rank``'s shard without the padding (``torch.chunk``'s
        split: ⌈rows / n⌉ rows each, the last ranks fewer or none): what optimizer state
        made from the sharded parameter holds."""
        if parts == 1 or self.numel == 0:
            return self.numel
        size = -(-self.rows // parts)
        rows = max(0, min(size, self.rows - rank * size))
        return rows * (self.numel // self.rows)


def zero1_shares(pieces: tuple[Piece, ...], parts: int) -> list[int]:
    """Trainable elements whose optimizer state each of ``parts`` ZeRO-1 ranks holds
    (``ZeroRedundancyOptimizer``'s partition: sorted by size, largest first, stable; each
    to the first rank with the fewest elements so far)."""
    sizes = [0] * parts
    for numel in sorted((p.numel for p in pieces if p.trainable), reverse=True):
        sizes[sizes.index(min(sizes))] += numel
    return sizes


@dataclass(frozen=True, slots=True)
class Placement:
    """Per pipeline stage: the pieces one of its TP ranks holds and the blocks it runs.

    ``attn_tp`` / ``mlp_tp`` are the degrees the blocks' attention and MLP are split by
    (the TP degree, or 1 where the plan leaves that part whole, as the Megatron teaching
    view does with attention): the activation formula divides each part by its own, and
    the logits by ``vocab_tp``.
    """

    stages: tuple[tuple[Piece, ...], ...]
    layers: tuple[int, ...]
    attn_tp: int = 1
    mlp_tp: int = 1
    vocab_tp: int = 1  # the degree the embedding / head (and so the logits) are split by
    source: str = ""
    # Interleaved schedule: per stage, the blocks of each of its virtual chunks (0 for a
    # chunk holding only the embedding or only the head, as Llama 3's first and last).
    chunks: tuple[tuple[int, ...], ...] | None = None
    # ZeRO-1 as ZeroRedundancyOptimizer (whole parameters per rank), or as Megatron's
    # distributed optimizer (a flat buffer cut evenly): False.
    zero1_whole: bool = True

    def __post_init__(self) -> None:
        if not self.stages or len(self.stages) != len(self.layers):
            raise ConfigError(
                f"a placement needs one entry of layers per stage: {len(self.stages)} stages, "
                f"layers={self.layers}"
            )
        if self.chunks is not None and (
            len(self.chunks) != len(self.layers)
            or any(sum(c) != n for c, n in zip(self.chunks, self.layers, strict=False))
            or len({len(c) for c in self.chunks}) != 1
        ):
            raise ConfigError(
                f"chunks={self.chunks} must give every stage the same number of virtual "
                f"chunks, their blocks adding up to the stage's layers={self.layers}"
            )
        if min(self.attn_tp, self.mlp_tp, self.vocab_tp) < 1:
            raise ConfigError(
                f"attn_tp={self.attn_tp}, mlp_tp={self.mlp_tp}, vocab_tp={self.vocab_tp} "
                "must be >= 1"
            )

    @property
    def pp(self) -> int:
        return len(self.stages)

    def params(self, stage: int) -> int:
        """Elements one TP rank of ``stage`` holds."""
        return sum(p.numel for p in self.stages[stage])

    def trainable(self, stage: int) -> int:
        return sum(p.numel for p in self.stages[stage] if p.trainable)

    def state_elements(
        self, stage: int, group: int, zero: int, grads_sharded: bool, dp_rank: int = 0
    ) -> tuple[int, int, int]:
        """(weights, gradient, optimizer-state) elements on data-parallel rank ``dp_rank``
        of ``stage`` under ZeRO stage ``zero`` over ``group`` ranks."""
        pieces = self.stages[stage]
        train = [p for p in pieces if p.trainable]
        sharded = group > 1

        def fsdp(items: list[Piece]) -> int:
            return sum(p.shard(group) for p in items)

        if zero >= 3 and sharded:
            weights = fsdp(list(pieces))
        elif zero == 2 and sharded:  # kept gathered: FSDP's padded all-gather outputs
            weights = sum(p.shard(group) * group for p in pieces)
        else:
            weights = self.params(stage)
        grads = fsdp(train) if grads_sharded and sharded else self.trainable(stage)
        if zero >= 2 and sharded:
            optimizer = sum(p.local(group, dp_rank) for p in train)
        elif zero == 1 and sharded and self.zero1_whole:
            optimizer = zero1_shares(pieces, group)[dp_rank]
        elif zero == 1 and sharded:
            optimizer = -(-self.trainable(stage) // group)
        else:
            optimizer = self.trainable(stage)
        return weights, grads, optimizer

    def frozen_elements(self, stage: int, group: int, zero: int) -> int:
        """Elements of the frozen parameters (``trainable=False``) one data-parallel rank
        of ``stage`` holds: the part of ``state_elements``' weights they are."""
        frozen = [p for p in self.stages[stage] if not p.trainable]
        if zero >= 3 and group > 1:
            return sum(p.shard(group) for p in frozen)
        if zero == 2 and group > 1:
            return sum(p.shard(group) * group for p in frozen)
        return sum(p.numel for p in frozen)

    def collective_elements(self, stage: int, group: int, zero: int) -> tuple[int, int]:
        """(gradient, weight) elements one rank hands to data-parallel collectives per
        pass: FSDP's padded full buffers, or the plain tensors for all-reduce/broadcast."""
        pieces = self.stages[stage]
        if zero >= 2 and group > 1:
            grads = sum(p.shard(group) * group for p in pieces if p.trainable)
            return grads, sum(p.shard(group) * group for p in pieces)
        return self.trainable(stage), self.params(stage)


def _layer_pieces(model: ModelSpec, t: int) -> list[Piece]:
    """One block under Megatron TP ``t``: q, k, v, the gate and up projections fused in
    one matrix (SwiGLU) column-split, o and down row-split, norms (and row biases) whole."""
    h, kv, f = model.hidden, model.kv_hidden, model.ffn_size
    up = (2 if model.gated_mlp else 1) * f // t
    out = [Piece(h // t * h, h // t), Piece(kv // t * h, kv // t), Piece(kv // t * h, kv // t)]
    out += [Piece(h * (h // t), h), Piece(up * h, up), Piece(h * (f // t), h)]
    if model.bias:
        out += [Piece(n, n) for n in (h // t, kv // t, kv // t, up, h, h)]
    norms = 4 if model.norm == "layernorm" else 2
    return out + [Piece(h, h)] * norms


def dimension_placement(
    model: ModelSpec,
    parallel: ParallelSpec,
    *,
    chunks: tuple[tuple[int, ...], ...] | None = None,
) -> Placement:
    """The Megatron placement of a model known by its dimensions (its derived count, not
    an explicit ``params``): blocks as ``_layer_pieces``, the embedding (and positions) on
    the first stage, the final norm and the head on the last (a tied head's copy there
    when there are several stages), split by vocabulary when ``vocab_parallel``.
    ``chunks``: the blocks of each virtual chunk per stage (interleaved), which also give
    the stages' layers; else the layout's ``stage_layers``. ZeRO-1 is Megatron's
    distributed optimizer (an even flat split)."""
    t, h, p = parallel.tp, model.hidden, parallel.pp
    vt = t if parallel.vocab_parallel else 1
    layers = tuple(sum(c) for c in chunks) if chunks else parallel.stage_layers(model.layers)
    vocab = model.vocab_size // vt
    norm = [Piece(h, h)] * (2 if model.norm == "layernorm" else 1)
    stages = []
    for i, n in enumerate(layers):
        pieces = _layer_pieces(model, t) * n
        if i == 0:
            pieces = [Piece(vocab * h, vocab), *pieces]
            if model.learned_positions and model.seq:
                pieces.insert(1, Piece(model.seq * h, model.seq))
        if i == p - 1:
            head = [] if model.tied_embeddings and p == 1 else [Piece(vocab * h, vocab)]
            pieces += norm + head
        stages.append(tuple(pieces))
    return Placement(
        stages=tuple(stages),
        layers=layers,
        attn_tp=t,
        mlp_tp=t,
        vocab_tp=vt,
        source=f"{model.name} by its dimensions (Megatron layout)",
        chunks=chunks,
        zero1_whole=False,
    )
