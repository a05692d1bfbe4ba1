"""The client side of a run of the user's own model: ``UserSpec`` and ``UserTrainingSession``.

``UserSpec`` holds the shipped factories and the run's options, validated on the client:
the layout against the world size and, when the model factory is local, the TP plan and
pipeline split points against the model built on the meta device (no memory, no engines).
``UserTrainingSession`` is a ``TrainingSession`` whose build and reference run the user's
factories; stepping, events, figures and Perfetto export are the base class's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from workbench import validate
from workbench.cluster.cluster import Cluster
from workbench.engine import user_run
from workbench.engine.shipping import Shipped, ship
from workbench.errors import ConfigError
from workbench.parallel.parallelize import PRESET_LAYOUTS, Layout, layout_for
from workbench.parallel.user_checkpointing import describe
from workbench.parallel.user_options import UserOptions
from workbench.session.run_state import RunState
from workbench.session.training import TrainingSession

__all__ = ["USER_RUN_KEYS", "UserSpec", "UserTrainingSession", "is_user_run", "user_spec"]

# Keywords that only a run of the user's own model takes.
USER_RUN_KEYS = ("data", "loss", "dp", "tp", "pp", "zero", "tp_plan", "pp_split")
_DIMS = ("dp", "tp", "pp", "zero")
CUSTOM = "custom"  # the strategy shown when the layout is given by dimensions


def is_user_run(model: Any, options: Mapping[str, Any]) -> bool:
    """A factory (not a preset name), or any keyword only a user run takes."""
    return not isinstance(model, str) or any(k in options for k in USER_RUN_KEYS)


@dataclass(kw_only=True, frozen=True)
class UserSpec(UserOptions):
    """A user run as the client holds it: the shipped factories, the layout by preset or
    by dimension, and the options it shares with the engines' ``UserRun``
    (``UserOptions``, validated there). ``model`` / ``optimizer`` are display labels."""

    factories: dict[str, Shipped | None]
    strategy: str = "dp"
    dp: int | None = None
    tp: int | None = None
    pp: int | None = None
    zero: int | None = None
    overlap: bool = True
    tp_plan: Mapping[str, Any] | None = None
    pp_split: tuple[str, ...] | None = None
    local_model: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.strategy not in (*PRESET_LAYOUTS, CUSTOM):
            raise ConfigError(
                f"strategy={self.strategy!r} is not valid for your own model; choose one of "
                f"{sorted(PRESET_LAYOUTS)}, or give the dimensions (dp=, tp=, pp=, zero=)"
            )
        if self.strategy == CUSTOM and all(getattr(self, n) is None for n in _DIMS):
            raise ConfigError(
                f"strategy={CUSTOM!r} needs at least one of dp=, tp=, pp=, zero=; or choose "
                f"a preset: {sorted(PRESET_LAYOUTS)}"
            )
        self._layout_kwargs(2)  # checks the dimension values themselves
        super().__post_init__()  # the shared options, checked as before: last

    # -- what the view and repr show ----------------------------------------------------
    @property
    def model(self) -> str:
        return self._label("model")

    @property
    def optimizer(self) -> str:
        return self._label("optimizer") if self.factories.get("optimizer") else "AdamW(lr=1e-3)"

    def _label(self, role: str) -> str:
        shipped = self.factories.get(role)
        return shipped.label if shipped is not None else "-"

    # -- what the engines get ---------------------------------------------------------------
    def _layout_kwargs(self, world_size: int) -> dict[str, Any]:
        extra = {"tp_plan": self.tp_plan, "pp_split": self.pp_split}
        if self.strategy == CUSTOM:
            dims = {n: getattr(self, n) for n in _DIMS if getattr(self, n) is not None}
            return {"overlap": self.overlap, **dims, **extra}
        base = layout_for(self.strategy, max(world_size, 2), overlap=self.overlap)
        return {
            "dp": base.dp if world_size > 1 else 1,
            "tp": base.tp,
            "pp": base.pp,
            "zero": base.zero,
            "overlap": base.overlap,
            **extra,
        }

    def run_world(self, world_size: int) -> int:
        """How many ranks the run spans on a cluster of ``world_size``: one device (rank 0)
        for ``single``, whatever the cluster's size."""
        return 1 if self.strategy == "single" else world_size

    def layout(self, world_size: int) -> Layout:
        return Layout(**self._layout_kwargs(world_size))

    def label(self, world_size: int) -> str:
        """The layout, then what else sets this run apart (``fsdp +ckpt bf16``)."""
        name = self._layout_label(world_size)
        if self.checkpointing is not False:
            name += (
                " +ckpt"
                if self.checkpointing is True
                else f" +ckpt({describe(self.checkpointing)})"
            )
        return name + (" bf16" if self.precision == "bf16" else "")

    def _layout_label(self, world_size: int) -> str:
        if self.strategy == CUSTOM:
            return self.layout(world_size).describe(world_size)
        return self.strategy

    def payload(self, world_size: int) -> dict[str, Any]:
        return {
            "factories": dict(self.factories),
            "layout": self._layout_kwargs(world_size),
            "strategy": self._layout_label(world_size),
            "options": self.options(),
        }

    def validate(self, world_size: int) -> None:
        """Everything that can be checked on the client, before any engine works."""
        world_size = self.run_world(world_size)
        layout = self.layout(world_size)
        dims = layout.dims(world_size)
        self.check_batch(dims)
        if self.local_model is not None and (world_size > 1 or self.checkpointing):
            _check_on_meta(self.local_model, layout, dims, self.seed, self.checkpointing)


def _check_on_meta(factory: Any, layout: Layout, dims: Any, seed: int, blocks: Any) -> None:
    """The TP plan, split points and checkpointed blocks against the model built on the
    meta device. A factory that cannot build there is checked on the engines instead."""
    import torch

    from workbench.parallel.parallelize import check_layout
    from workbench.parallel.user_checkpointing import checkpoint_blocks

    try:
        with torch.device("meta"), torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = factory()
    except Exception:
        return
    if isinstance(model, torch.nn.Module):
        checkpoint_blocks(model, blocks)
        if dims.world_size > 1:
            check_layout(model, layout, dims)


def user_spec(model: Any, strategy: str, options: dict[str, Any]) -> UserSpec:
    """A validated ``UserSpec`` from ``Stepper(model=..., data=..., loss=..., ...)``."""
    missing = [k for k in ("data", "loss") if options.get(k) is None]
    if missing:
        raise ConfigError(
            f"your own model needs {' and '.join(missing)}= as well: "
            "Stepper(model=make_model, data=make_data, loss=loss_fn, optimizer=make_opt)"
        )
    valid = {f.name for f in fields(UserSpec)} - {"factories", "local_model"}
    rest = {k: v for k, v in options.items() if k not in ("data", "loss", "optimizer")}
    validate.option_names("your own model", rest, valid | {"data", "loss", "optimizer"})
    if rest.get("pp_split") is not None and not isinstance(rest["pp_split"], str):
        rest["pp_split"] = tuple(rest["pp_split"])
    factories: dict[str, Shipped | None] = {
        "model": ship("model", model),
        "data": ship("data", options["data"]),
        "loss": ship("loss", options["loss"]),
        "optimizer": (
            ship("optimizer", options["optimizer"]) if options.get("optimizer") else None
        ),
    }
    local = model if callable(model) else None
    if any(rest.get(n) is not None for n in _DIMS):
        strategy = CUSTOM  # dimensions given: they are the layout, not a preset
    return UserSpec(factories=factories, strategy=strategy, local_model=local, **rest)


class UserTrainingSession(TrainingSession):
    """A ``TrainingSession`` over the user's own model (``spec`` is a ``UserSpec``)."""

    def __init__(
        self, cluster: Cluster, spec: UserSpec, *, timeout: float | None = 300.0, **checkpoints: Any
    ) -> None:
        """``checkpoints``: ``checkpoint_dir``, ``checkpoint_every``, ``keep_last``,
        ``checkpoint_key``, as for a built-in model's ``TrainingSession``."""
        spec.validate(cluster.world_size)
        super().__init__(cluster, spec, timeout=timeout, **checkpoints)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        spec: UserSpec = self._state.spec  # type: ignore[assignment]
        world = spec.run_world(self.cluster.world_size)
        return (
            f"<TrainingSession model={spec.model!r} "
            f"layout={spec.layout(world).describe(world)!r}"
            f" ranks={self.cluster.world_size} step={self.step_index} "
            f"events={len(self.store)}>"
        )

    def build(self, **changes: Any) -> None:
        spec: UserSpec = self._state.spec  # type: ignore[assignment]
        if changes:
            valid = {f.name for f in fields(UserSpec)} - {"factories", "local_model"}
            unknown = sorted(set(changes) - valid)
            if unknown:
                raise ConfigError(f"unknown option(s) {unknown}; valid options: {sorted(valid)}")
            if changes.get("strategy", CUSTOM) != CUSTOM:  # a preset replaces dimensions
                changes = {**dict.fromkeys(_DIMS), **changes}
            elif any(changes.get(n) is not None for n in _DIMS):
                # New dimensions replace the old ones: rebuild(pp=2) after tp=2 is pp=2 alone.
                changes = {**dict.fromkeys(_DIMS), **changes, "strategy": CUSTOM}
            spec = replace(spec, **changes)
        spec.validate(self.cluster.world_size)
        self._state = RunState(spec=spec)  # type: ignore[arg-type]
        self.store.clear()
        self._reference = []
        self.build_remote(spec)  # type: ignore[arg-type]

    def build_remote(self, spec: Any, *, keep_events: bool = True) -> None:
        results = self._build_on_engines(
            user_run.build_user_run,
            spec.payload(self.cluster.world_size),
            self.autosave_settings(),
            asdict(self.store.policy),
        )
        self._built(results, keep_events=keep_events)

    def reference_losses(self, steps: int | None = None) -> list[float]:
        steps = self.step_index if steps is None else steps
        if len(self._reference) < steps:
            ahead = max(steps, 2 * len(self._reference), 8)
            spec: UserSpec = self._state.spec  # type: ignore[assignment]
            self._reference = self.cluster.run(
                user_run.run_user_reference,
                spec.payload(self.cluster.world_size),
                ahead,
                ranks=[0],
                timeout=self.timeout,
            )[0]
        return self._reference[:steps]

    def check_sharding(self, epoch: int = 0) -> dict[str, Any]:
        """Which samples each rank sees in ``epoch``: disjoint and complete over the
        data-parallel ranks (ranks of one dp group, e.g. TP peers, see the same ones)."""
        self._ensure_built()
        shards = self.cluster.run(
            user_run.user_shard_indices, epoch, ranks=self.run_ranks, timeout=self.timeout
        )
        if not shards[0]["sharded"]:
            return {"sharded": False, "reason": "the data is a callable, not a Dataset"}
        by_dp: dict[int, list[int]] = {}
        for s in shards:
            by_dp.setdefault(int(s["rank"]), s["indices"])
        sets = [set(v) for v in by_dp.values()]
        union = set().union(*sets)
        return {
            "sharded": True,
            "dp": int(shards[0]["replicas"]),
            "samples": int(shards[0]["n"]),
            "per_dp_rank": {r: len(v) for r, v in sorted(by_dp.items())},
            "disjoint": sum(len(s) for s in sets) == len(union),
            "complete": union == set(range(int(shards[0]["n"]))),
            # drop_last: the last n mod dp samples of an epoch wait for the next shuffle
            "left_out": int(shards[0]["n"]) - len(union),
            "same_within_dp_group": all(s["indices"] == by_dp[int(s["rank"])] for s in shards),
        }
