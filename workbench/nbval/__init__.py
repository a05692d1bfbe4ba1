"""The nbval sanitizer the workbench ships (``sanitize.cfg``) and how it is combined.

nbval reads one sanitizer file (``--nbval-sanitize-with``), as ``regex:`` / ``replace:``
pairs on consecutive lines, applied in file order with ``re.sub`` to every output on both
sides of the comparison. ``--nbval-workbench`` (``plugin``) hands it one merged file: the
user's own rules first (written against raw output, before the shipped whitespace rule
rewrites spaces), then this machine's host name, then the shipped rules. A user rule with
the same regex as a shipped one replaces it (nbval keeps one replacement per regex).
The user's file must be a regular text file; an invalid regex in it is one error naming it.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path

__all__ = [
    "MAX_USER_BYTES",
    "MIN_HOST_CHARS",
    "SANITIZER",
    "host_rule",
    "merged_rules",
    "read_rules",
    "read_user_file",
    "sanitize",
]

SANITIZER = Path(__file__).with_name("sanitize.cfg")

# nbval's own reading of a sanitizer file (``nbval.plugin.get_sanitize_patterns``).
_PAIR = re.compile(r"^regex: (.*)$\n^replace: (.*)$", re.MULTILINE)
_REGEX_LINE = re.compile(r"^regex:", re.MULTILINE)
# A shorter host name ("vm") is also an ordinary word; masking it everywhere would mask
# words in the output. Such hosts are masked where the workbench names a host.
MIN_HOST_CHARS = 4
MAX_USER_BYTES = 1024 * 1024


def read_rules(text: str, *, source: str = "the sanitizer") -> list[tuple[str, str]]:
    """The (regex, replacement) pairs nbval would read from ``text``. A ``regex:`` line that
    nbval would silently drop (no ``replace: `` line right after it) is an error here."""
    pairs = _PAIR.findall(text)
    if len(pairs) != len(_REGEX_LINE.findall(text)):
        raise ValueError(
            f"{source} has {len(_REGEX_LINE.findall(text))} 'regex:' lines but nbval reads "
            f"{len(pairs)} rules from it: each 'regex: ' line needs a 'replace: ' line directly "
            "after it (a space after each colon; no blank line between them)"
        )
    for regex, _ in pairs:
        try:  # a bad pattern fails here, naming itself, not inside nbval
            re.compile(regex)
        except (re.error, RecursionError, OverflowError) as exc:  # re.error: no ValueError
            raise ValueError(f"{source}: regex {regex!r} is not valid: {exc}") from None
    return pairs


def read_user_file(path: str) -> str:
    """The text of the user's sanitizer file: a regular file of at most
    ``MAX_USER_BYTES`` (a FIFO would block, ``/dev/zero`` never end); ValueError or
    OSError naming what is wrong."""
    from workbench.files import read_regular

    return read_regular(path, MAX_USER_BYTES).decode("utf-8", errors="replace")


def sanitize(text: str, rules: list[tuple[str, str]]) -> str:
    """``text`` as nbval compares it under ``rules`` (in order, as nbval applies them)."""
    for regex, replacement in rules:
        text = re.sub(regex, replacement, text)
    return text


def host_rule(host: str | None = None) -> tuple[str, str] | None:
    """A rule masking this machine's host name wherever it appears (an output of a local
    cluster names no other host); None for a name too short to mask everywhere."""
    name = socket.gethostname() if host is None else host
    short = name.split(".")[0]
    if len(short) < MIN_HOST_CHARS:
        return None
    names = sorted({re.escape(name), re.escape(short)}, key=len, reverse=True)
    return rf"(?<![\w.-])(?:{'|'.join(names)})(?![\w-])", "HOST"


def merged_rules(user_text: str | None = None, *, host: str | None = None) -> str:
    """One sanitizer file's text: the user's rules, this host's name, the shipped rules."""
    parts = []
    shipped = SANITIZER.read_text()
    if user_text is not None:
        mine = read_rules(user_text, source="your --nbval-sanitize-with file")
        parts.append(f"# from your --nbval-sanitize-with file\n{user_text.rstrip()}\n")
        shipped = _without(shipped, {regex for regex, _ in mine})
    rule = host_rule(host)
    if rule is not None:
        parts.append(f"[this-host]\nregex: {rule[0]}\nreplace: {rule[1]}\n")
    parts.append(shipped)
    return "\n".join(parts)


def _without(text: str, regexes: set[str]) -> str:
    """``text`` without its rules whose regex is one of ``regexes``: nbval keeps one
    replacement per regex, the last one read, so a shipped rule after the user's would
    silently win. The user's rule replaces the shipped one of the same pattern."""
    return _PAIR.sub(lambda m: "" if m.group(1) in regexes else m.group(0), text)
