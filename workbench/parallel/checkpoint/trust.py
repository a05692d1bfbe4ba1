"""What a checkpoint load trusts: a key kept outside the checkpoint and a signed manifest.

At save time ``manifest.json`` lists the SHA-256 sum of every file in the checkpoint and
an HMAC-SHA256 over that list, keyed with a secret that never lives in the checkpoint (by
default ``<state dir>/checkpoint.key``, created on first use with mode 0600). A load
checks the HMAC and the sums before anything in the checkpoint is parsed beyond JSON, so
a checkpoint written or changed by anyone without the key is refused, however it was
crafted. The state dir is ``$WORKBENCH_STATE_DIR``, else ``$XDG_STATE_HOME/workbench``,
else ``~/.local/state/workbench``.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

from workbench.config import not_private, state_dir  # the checkpoint key lives there
from workbench.errors import CheckpointError

__all__ = [
    "MANIFEST",
    "checkpoint_key",
    "file_digest",
    "key_path",
    "read_capped",
    "read_manifest",
    "read_verified",
    "state_dir",
    "stream_digest",
    "verify_files",
    "write_manifest",
]

MANIFEST = "manifest.json"
_MANIFEST_FORMAT = 1
_KEY_BYTES = 32
_KEY_FILE = "checkpoint.key"
_MAX_MANIFEST_BYTES = 16 * 1024 * 1024  # a manifest is a few hundred bytes per file
_CHUNK = 1024 * 1024
# meta.json and a rank's RNG files are a few KiB: nothing reads more of them than this, so a
# huge (or sparse) file put in their place costs neither memory nor time to refuse.
SMALL_FILE_BYTES = 16 * 1024 * 1024


def key_path() -> Path:
    return state_dir() / _KEY_FILE


def _check_private(path: Path) -> None:
    """Refuse a key others could read or replace (as ssh does with private keys)."""
    problem = not_private(path)
    if problem == "owner":
        raise CheckpointError(
            f"the checkpoint key {str(path)!r} belongs to another user; remove it (a new one "
            "is created) or point WORKBENCH_STATE_DIR at a directory of your own"
        )
    if problem is not None:
        raise CheckpointError(
            f"the checkpoint key {str(path)!r} is readable or writable by others "
            f"({problem}); run `chmod 600 {path}`"
        )


def checkpoint_key(path: str | os.PathLike[str] | None = None) -> bytes:
    """The secret that signs checkpoint manifests; created (mode 0600) on first use."""
    file = Path(path) if path is not None else key_path()
    if not file.exists():
        file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Written whole under a private name, then linked into place: a concurrent first
        # use (two engines on one host) sees either no key or the complete one.
        tmp = file.with_name(f".{file.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(_KEY_BYTES) + "\n")
                f.flush()
                os.fsync(f.fileno())
            with contextlib.suppress(FileExistsError):  # another process was first: use theirs
                os.link(tmp, file)
        finally:
            tmp.unlink(missing_ok=True)
    _check_private(file)
    text = file.read_text().strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < 16:
        raise CheckpointError(
            f"the checkpoint key {str(file)!r} is not a hex key of at least 16 bytes; "
            "remove it and a new one is created (checkpoints signed with the old key can "
            "then no longer be loaded)"
        )
    return key


def open_regular(path: Path, what: str) -> BinaryIO:
    """``path`` opened for reading only if it is a regular file: never through a link,
    and never waiting on a FIFO or device swapped in after a check (``files``).
    FileNotFoundError when absent."""
    from workbench.files import open_regular as open_file

    try:
        return open_file(path, follow=False)
    except FileNotFoundError:
        raise
    except ValueError as exc:
        raise CheckpointError(f"{what} is {exc}; refusing to read it") from None
    except OSError as exc:  # ELOOP: a symbolic link
        raise CheckpointError(f"{what} cannot be read ({exc.strerror}); refusing it") from None


def file_digest(path: Path) -> str:
    with open_regular(path, f"{path.name} of the checkpoint at {str(path.parent)!r}") as f:
        return stream_digest(f)


def stream_digest(stream: BinaryIO) -> str:
    """SHA-256 of what is left to read in ``stream``, read in chunks."""
    h = hashlib.sha256()
    while chunk := stream.read(_CHUNK):
        h.update(chunk)
    return h.hexdigest()


def read_capped(path: Path, what: str) -> bytes:
    """The bytes of one of a checkpoint's small files, at most ``SMALL_FILE_BYTES``."""
    with open_regular(path, what) as f:
        data = f.read(SMALL_FILE_BYTES + 1)
    if len(data) > SMALL_FILE_BYTES:
        raise CheckpointError(
            f"{what} is larger than {SMALL_FILE_BYTES // 2**20} MiB, which no checkpoint's "
            "small file is; refusing to read it"
        )
    return data


def _files(directory: Path) -> list[str]:
    return sorted(
        p.relative_to(directory).as_posix()
        for p in directory.rglob("*")
        if p.is_file() and p.name != MANIFEST
    )


def _signature(key: bytes, digests: dict[str, str]) -> str:
    body = json.dumps(
        {"format": _MANIFEST_FORMAT, "files": digests}, sort_keys=True, separators=(",", ":")
    )
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


def write_manifest(directory: Path, key: bytes) -> dict[str, str]:
    """Sum every file under ``directory`` and write the signed ``manifest.json``."""
    digests = {name: file_digest(directory / name) for name in _files(directory)}
    manifest = {
        "format": _MANIFEST_FORMAT,
        "files": digests,
        "hmac": _signature(key, digests),
    }
    with open(directory / MANIFEST, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    return digests


def read_manifest(directory: Path, key: bytes) -> dict[str, str]:
    """The file -> SHA-256 map of ``directory``, once its HMAC checks out."""
    path = directory / MANIFEST
    where = f"{str(directory)!r}"
    try:
        with open_regular(path, f"{MANIFEST} of the checkpoint at {where}") as f:
            data = f.read(_MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        raise CheckpointError(
            f"the checkpoint at {where} has no {MANIFEST}, so nothing vouches for its files "
            "(saved by an older workbench, or not by you); only checkpoints signed with "
            "your checkpoint key are loaded"
        ) from None
    if len(data) > _MAX_MANIFEST_BYTES:
        raise CheckpointError(f"{MANIFEST} of the checkpoint at {where} is too large")
    try:
        manifest: Any = json.loads(data)
    except RecursionError:
        raise CheckpointError(
            f"{MANIFEST} of the checkpoint at {where} is nested too deeply"
        ) from None
    except ValueError as exc:
        raise CheckpointError(
            f"{MANIFEST} of the checkpoint at {where} is not JSON: {exc}"
        ) from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    signature = manifest.get("hmac") if isinstance(manifest, dict) else None
    if (
        not isinstance(files, dict)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items())
        or not isinstance(signature, str)
        or manifest.get("format") != _MANIFEST_FORMAT
    ):
        raise CheckpointError(
            f"{MANIFEST} of the checkpoint at {where} is malformed (expected format "
            f"{_MANIFEST_FORMAT} with 'files' and 'hmac')"
        )
    if not hmac.compare_digest(_signature(key, files), signature):
        raise CheckpointError(
            f"{MANIFEST} of the checkpoint at {where} is not signed with your checkpoint "
            "key: it was changed after the save, or saved by someone else (or with another "
            f"key than {str(key_path())!r}); refusing to load it"
        )
    for name in files:
        parts = Path(name).parts
        if Path(name).is_absolute() or ".." in parts or not parts:
            raise CheckpointError(f"{MANIFEST} at {where} names a file outside it: {name!r}")
    return dict(files)


def verify_files(directory: Path, digests: dict[str, str], names: Iterable[str]) -> None:
    """Each of ``names`` exists and has the SHA-256 sum the manifest records."""
    for name in names:
        expected = digests.get(name)
        if expected is None:
            raise CheckpointError(
                f"{name} is not listed in {MANIFEST} of the checkpoint at {str(directory)!r}"
            )
        path = directory / name
        if not path.is_file():
            raise CheckpointError(f"{name} of the checkpoint at {str(directory)!r} is missing")
        if not hmac.compare_digest(file_digest(path), expected):
            raise CheckpointError(
                f"{name} of the checkpoint at {str(directory)!r} does not match the SHA-256 "
                f"sum in {MANIFEST} (changed or truncated after the save); refusing to load it"
            )


def read_verified(directory: Path, digests: dict[str, str], name: str) -> bytes:
    """The bytes of ``name``, read once and checked against the manifest (what is parsed
    is exactly what was checked)."""
    if name not in digests:
        raise CheckpointError(
            f"{name} is not listed in {MANIFEST} of the checkpoint at {str(directory)!r}"
        )
    path = directory / name
    if not path.is_file():
        raise CheckpointError(f"{name} of the checkpoint at {str(directory)!r} is missing")
    data = read_capped(path, f"{name} of the checkpoint at {str(directory)!r}")
    if not hmac.compare_digest(hashlib.sha256(data).hexdigest(), digests[name]):
        raise CheckpointError(
            f"{name} of the checkpoint at {str(directory)!r} does not match the SHA-256 "
            f"sum in {MANIFEST} (changed or truncated after the save); refusing to load it"
        )
    return data
