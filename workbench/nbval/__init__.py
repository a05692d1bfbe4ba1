"""The nbval sanitizer the workbench ships (``sanitize.cfg``) and how it is combined.

nbval reads one sanitizer file (``--nbval-sanitize-with``), as ``regex:`` / ``replace:``
pairs on consecutive lines, applied in file order with ``re.sub`` to every output on both
sides of the comparison. ``--nbval-workbench`` (``plugin``) hands it one merged file: the
user's own rules first (written against raw output, before the shipped whitespace rule
rewrites spaces), then this machine's host name, then the shipped rules.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path

__all__ = [
    "MIN_HOST_CHARS",
    "SANITIZER",
    "host_rule",
    "merged_rules",
    "read_rules",
    "sanitize",
]

SANITIZER = Path(__file__).with_name("sanitize.cfg")

# nbval's own reading of a sanitizer file (``nbval.plugin.get_sanitize_patterns``).
_PAIR = re.compile(r"^regex: (.*)$\n^replace: (.*)$", re.MULTILINE)
_REGEX_LINE = re.compile(r"^regex:", re.MULTILINE)
# A shorter host name ("vm") is also an ordinary word; masking it everywhere would mask
# words in the output. Such hosts are masked where the workbench names a host.
MIN_HOST_CHARS = 4


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
        re.compile(regex)  # a bad pattern fails here, naming itself, not inside nbval
    return pairs


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
    if user_text is not None:
        read_rules(user_text, source="your --nbval-sanitize-with file")
        parts.append(f"# from your --nbval-sanitize-with file\n{user_text.rstrip()}\n")
    rule = host_rule(host)
    if rule is not None:
        parts.append(f"[this-host]\nregex: {rule[0]}\nreplace: {rule[1]}\n")
    parts.append(SANITIZER.read_text())
    return "\n".join(parts)
