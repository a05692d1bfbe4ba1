"""The dimensions of parallelism as one validated object that builds its DeviceMesh lazily.

After torchtitan's ``parallel_dims.py``: sizes are checked when the object is made (and
against a model with ``validate_for``) so an impossible layout fails with a message naming
the bad value and the valid choices, long before a collective or a tensor split fails deep
inside torch. No process group is needed until ``mesh`` is first read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from workbench.errors import ConfigError, ParallelError

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from workbench.parallel.models import ModelConfig

__all__ = ["MESH_DIM_NAMES", "ParallelDims", "check_batch_split"]

# Outermost first: tensor parallelism innermost so its ranks are neighbours (fastest links).
# Context parallel between them: its ring passes keys and values every layer.
MESH_DIM_NAMES: tuple[str, ...] = ("pp", "dp", "cp", "tp")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(kw_only=True)
class ParallelDims:
    """``dp * cp * tp * pp == world_size``; ``mesh`` has one named dimension per size > 1."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    # Experts spread over the data-parallel ranks (not a dimension of its own: it borrows
    # dp's ranks, as torchtitan does); 1 = every rank holds every expert.
    ep: int = 1
    world_size: int
    device_type: str = "cpu"
    _mesh: DeviceMesh | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "cp", "ep", "world_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ParallelError(f"{name}={value!r} is not valid; it must be an integer >= 1")
        product = self.dp * self.tp * self.pp * self.cp
        if product != self.world_size:
            cp = f"*cp={self.cp}" if self.cp > 1 else ""
            raise ParallelError(
                f"dp*tp*pp = {self.dp}*{self.tp}*{self.pp}{cp} = {product} does not equal "
                f"world_size={self.world_size}; each size must divide {self.world_size} "
                f"(choices: {_divisors(self.world_size)}) and their product must equal it"
            )

        if self.ep > 1 and (self.dp % self.ep or self.world_size != self.dp):
            raise ParallelError(
                f"ep={self.ep} spreads the experts over the data-parallel ranks: it must "
                f"divide dp={self.dp} (choices: {_divisors(self.dp)}), with tp, pp and cp "
                f"1 (world_size={self.world_size})"
            )

    @property
    def sizes(self) -> dict[str, int]:
        return {"pp": self.pp, "dp": self.dp, "cp": self.cp, "tp": self.tp}

    @property
    def active(self) -> tuple[str, ...]:
        """Names of the dimensions with size > 1, outermost first."""
        return tuple(n for n in MESH_DIM_NAMES if self.sizes[n] > 1)

    def validate_for(self, config: ModelConfig) -> None:
        """Check that the model splits evenly: tp | heads and hidden sizes, pp | layers."""
        checks: list[tuple[str, int]] = [("dim", config.dim), ("hidden", config.hidden)]
        if config.kind == "gpt":
            checks.insert(0, ("n_heads", config.n_heads))
        for what, size in checks:
            if size % self.tp:
                valid = [d for d in _divisors(self.world_size) if size % d == 0]
                raise ParallelError(
                    f"tp={self.tp} does not divide the model's {what}={size}; "
                    f"valid tp for this model and world_size={self.world_size}: {valid}"
                )
        if self.ep > 1:
            experts = getattr(config, "n_experts", 0)
            if not experts:
                raise ParallelError(
                    f"ep={self.ep} spreads experts over ranks, but the {config.kind} model "
                    "is dense (no experts); use model='moe-tiny', or strategy='dp'"
                )
            if experts % self.ep:
                raise ParallelError(
                    f"ep={self.ep} does not divide the model's n_experts={experts}; "
                    f"valid ep: {[d for d in _divisors(experts) if d <= self.world_size]}"
                )
        if self.cp > 1:
            seq = getattr(config, "seq_len", None)
            if seq is None:
                raise ParallelError(
                    f"cp={self.cp} splits a sequence; the {config.kind} model has none "
                    "(use a GPT preset: 'gpt-tiny', 'gpt-small', 'moe-tiny')"
                )
            if seq % self.cp:
                raise ParallelError(
                    f"cp={self.cp} does not divide the model's seq_len={seq}; "
                    f"valid cp: {[d for d in _divisors(self.world_size) if seq % d == 0]}"
                )
        if config.n_layers % self.pp:
            valid = [d for d in _divisors(self.world_size) if config.n_layers % d == 0]
            raise ParallelError(
                f"pp={self.pp} does not divide the model's n_layers={config.n_layers}; "
                f"valid pp for this model and world_size={self.world_size}: {valid}"
            )

    @property
    def mesh(self) -> DeviceMesh:
        """The DeviceMesh, built on first use (needs an initialised default process group)."""
        if self._mesh is None:
            import torch.distributed as dist
            from torch.distributed.device_mesh import init_device_mesh

            if not dist.is_initialized():
                raise ParallelError(
                    "ParallelDims.mesh needs an initialised process group; call "
                    "torch.distributed.init_process_group first (or use strategy='single')"
                )
            if dist.get_world_size() != self.world_size:
                raise ParallelError(
                    f"world_size={self.world_size} does not match the process group's "
                    f"{dist.get_world_size()} ranks"
                )
            names = self.active or ("dp",)
            shape = tuple(self.sizes[n] for n in names)
            self._mesh = init_device_mesh(self.device_type, shape, mesh_dim_names=names)
        return self._mesh

    def submesh(self, name: str) -> DeviceMesh:
        """The 1-D mesh of dimension ``name`` (the whole mesh when it is the only one)."""
        if name not in MESH_DIM_NAMES:
            raise ParallelError(
                f"mesh dimension {name!r} is not valid; choose from {MESH_DIM_NAMES}"
            )
        if self.sizes[name] == 1 and name not in (self.active or ("dp",)):
            raise ParallelError(f"mesh dimension {name!r} has size 1 and is not in the mesh")
        mesh = self.mesh
        return mesh if mesh.ndim == 1 else mesh[name]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def check_batch_split(
    batch_size: int, grad_accum: int, microbatches: int, dims: ParallelDims
) -> None:
    """The global batch must split evenly over the dp ranks, then over gradient accumulation
    (or, with pp > 1, over micro-batches): the same rule for presets and your own model."""
    if batch_size % dims.dp:
        raise ConfigError(
            f"batch_size={batch_size} does not split over dp={dims.dp} ranks; "
            f"choose a multiple of {dims.dp}"
        )
    per_rank = batch_size // dims.dp
    if per_rank % grad_accum:
        raise ConfigError(
            f"grad_accum={grad_accum} does not divide the per-rank batch {per_rank} "
            f"(batch_size={batch_size} / dp={dims.dp}); choose among {_divisors(per_rank)}"
        )
    if dims.pp > 1 and per_rank % microbatches:
        where = f"batch_size={batch_size}"
        if dims.dp > 1:  # each data-parallel pipeline cuts its own share into micro-batches
            where = f"the per-rank batch {per_rank} (batch_size={batch_size} / dp={dims.dp})"
        raise ConfigError(
            f"microbatches={microbatches} does not divide {where}; "
            f"choose among {_divisors(per_rank)}"
        )
