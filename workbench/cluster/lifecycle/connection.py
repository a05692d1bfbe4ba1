"""Finding a running ipyparallel controller to connect to (``profile=`` / ``cluster_id=``)."""

from __future__ import annotations

from pathlib import Path

from workbench import validate

__all__ = ["find_connection_file"]


def find_connection_file(
    profile: str | None,
    cluster_id: str | None,
    *,
    names: tuple[str, str] = ("profile", "cluster_id"),
) -> Path:
    """The client connection file of the running ipyparallel cluster named by ``profile``
    (default ``'default'``) and ``cluster_id``, or a ``ConfigError`` naming them, the file
    looked for and the clusters that do run in that profile. ``names`` are how the caller
    spells the two settings (``("--profile", "--cluster-id")`` for ``%wb start``)."""
    from IPython.paths import get_ipython_dir

    for name, value in zip(names, (profile, cluster_id), strict=True):
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise validate.invalid(name, value, "not a name", "use a non-empty name, or None")
    name, value = (names[0], profile) if profile is not None else (names[1], cluster_id)
    profile_name = profile or "default"
    security = Path(get_ipython_dir()) / f"profile_{profile_name}" / "security"
    wanted = f"ipcontroller-{cluster_id}-client.json" if cluster_id else "ipcontroller-client.json"
    path = security / wanted
    if path.is_file():
        return path
    running = sorted(
        f.name.removeprefix("ipcontroller-").removesuffix("-client.json")
        for f in security.glob("ipcontroller-*-client.json")
    )
    found = (
        f"running cluster ids in profile {profile_name!r}: {', '.join(running)}"
        if running
        else f"no running cluster in profile {profile_name!r}"
    )
    raise validate.invalid(
        name,
        value,
        f"no ipyparallel controller to connect to (looked for {path}; {found})",
        f"start one with `ipcluster start --profile={profile_name}"
        + (f" --cluster-id={cluster_id}`" if cluster_id else "`")
        + ", or leave out "
        f"{names[0]} and {names[1]} to let the workbench start its own engines",
    )
