"""verl console logs: ``step:N - key:value - key:np.float64(value) - ...`` lines.

verl's console logger prints one line per training step with every metric as ``key:value``
joined by `` - ``; values may be plain numbers or numpy reprs (``np.float64(0.5)``,
``np.int32(2)``). Real logs interleave other text (warnings, progress bars, Ray's
``(TaskRunner pid=…)`` prefixes) and a terminal may wrap a long line in the middle of a key or
a number. The parser streams the file line by line (memory does not grow with its size):

- a record starts at ``step:N - `` anywhere in a line (a prefix before it is dropped);
- the next physical line continues the record when joining it is the only sensible reading:
  it starts with `` - `` or ``- ``, the record so far ends in `` -``, or its text up to the
  first `` - `` has no space (a key or number fragment), and it does not itself start a record;
- each ``key:value`` is parsed, separated by `` - `` or, where a wrap swallowed its spaces,
  by ``-`` alone (``a:0.5-b:0.7``); an unparsable value is reported with the line number where
  its record started and skipped.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from rlscope.doctor.table import MetricTable

RECORD = re.compile(r"(?:^|[^\w/.-])step:\s*(\d+)\s+-\s")
# tensor's value stops at its first comma ([^,]: ``.*?`` there backtracked quadratically)
_WRAPPED_VALUE = re.compile(
    r"^(?:np\.)?(?:float|int|uint|bool)\w*\((.*)\)$|^tensor\(([^,]*?)(?:,.*)?\)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_SEPARATOR = re.compile(r"\s-(?:\s|$)")  # " - ", or " -" where a wrap dropped the space


def parse_value(text: str) -> float | None:
    """A verl value as a float: plain numbers, ``np.float64(…)``, ``np.int32(…)``,
    ``tensor(…)``, ``True``/``False``, ``nan``/``inf``; None when it is none of these."""
    text = text.strip()
    m = _WRAPPED_VALUE.match(text)
    if m:
        text = (m.group(1) if m.group(1) is not None else m.group(2)).strip()
    if text in ("True", "False"):
        return float(text == "True")
    try:
        return float(text)
    except ValueError:
        return None


def _continues(previous: str, line: str) -> bool:
    """Whether a physical line is the tail of a wrapped record line ending in ``previous``."""
    if not line or RECORD.search(line):
        return False
    if line.startswith((" - ", "- ")) or previous.endswith((" -", " - ")):
        return True
    head = _SEPARATOR.split(line, maxsplit=1)[0]
    return bool(head) and not any(ch.isspace() for ch in head)


MAX_KEY = 255
"""The longest key `_PAIR` reads (verl's are under 100 characters): unbounded, a long token
without a colon made the search quadratic in the line (an 80 KB token: a minute)."""
_PAIR = re.compile(
    rf"(?P<key>[A-Za-z_][^\s:]{{0,{MAX_KEY}}}):\s*(?P<value>.*?)"
    rf"(?=\s*-\s*[A-Za-z_][^\s:()]{{0,{MAX_KEY}}}:|\s*$)")
"""One ``key:value``; the value runs to the next ``-key:`` (with or without the spaces of
`` - ``, which a terminal wrap may swallow) or to the end. Keys start with a letter, so a
negative number or an exponent (``-0.5``, ``1e-05``) never starts a new pair."""


def parse_record(text: str, line_no: int, table: MetricTable,
                 rename: Callable[[str], str]) -> None:
    """Add one joined record line (starting at ``step:N - ``) to ``table``."""
    m = RECORD.search(text)
    if m is None:
        return
    step = float(m.group(1))
    for part in text[m.end():].split(" - "):
        part = part.strip()
        if not part:
            continue
        key, sep, raw = part.partition(":")
        value = parse_value(raw) if sep and key and " " not in key else None
        if value is not None:  # the common case: one clean key:value
            table.add(step, rename(key), value)
        else:  # pairs joined by a wrap that swallowed spaces, or a malformed pair
            _parse_pairs(part, step, line_no, table, rename)


def _parse_pairs(body: str, step: float, line_no: int, table: MetricTable,
                 rename: Callable[[str], str]) -> None:
    pos = 0
    for pair in _PAIR.finditer(body):
        _junk(body[pos:pair.start()], line_no, table)
        pos = pair.end()
        key, raw = pair.group("key"), pair.group("value")
        value = parse_value(raw)
        if value is None:
            table.problem(line_no, f"{key}: unparsable value {raw.strip()[:40]!r}")
            continue
        table.add(step, rename(key), value)
    _junk(body[pos:], line_no, table)


def _junk(text: str, line_no: int, table: MetricTable) -> None:
    """Report text between pairs that is not a separator."""
    text = text.strip().strip("-").strip()
    if text:
        table.problem(line_no, f"not a key:value pair: {text[:60]!r}")


def read_verl(lines: Iterable[str], table: MetricTable, rename: Callable[[str], str]) -> None:
    """Stream a verl console log into ``table``."""
    record: list[str] = []
    start = 0
    for line_no, raw in enumerate(lines, 1):
        line = _ANSI.sub("", raw.rstrip("\r\n"))
        if "\x00" in line:
            table.problem(line_no, "binary data skipped")
            continue
        if record and _continues(record[-1], line):
            record.append(line)
            continue
        if record:
            parse_record("".join(record), start, table, rename)
            record = []
        if RECORD.search(line):
            record, start = [line], line_no
    if record:
        parse_record("".join(record), start, table, rename)
