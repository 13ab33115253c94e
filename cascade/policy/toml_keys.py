"""Where each key of a TOML text sits: ``tomllib`` keeps no positions, so policy findings
locate their keys here (tables, dotted keys, inline tables; comments and strings skipped)."""

from __future__ import annotations

from collections.abc import Iterator

KeyPath = tuple[str, ...]


def locate(lines: dict[KeyPath, int], path: KeyPath) -> int:
    """The line of ``path``, or of its longest prefix that has one (1 when none has)."""
    for end in range(len(path), 0, -1):
        if path[:end] in lines:
            return lines[path[:end]]
    return 1


def key_lines(text: str) -> dict[KeyPath, int]:
    """Map every key path of a TOML document to the line it is written on (first wins).

    Handles table headers, dotted and quoted keys, one-line inline tables, multi-line arrays
    and multi-line strings; enough to point at keys, not a TOML parser.
    """
    out: dict[KeyPath, int] = {}
    table: KeyPath = ()
    depth = 0  # open brackets of a value spanning lines
    fence: str | None = None  # the open multi-line string delimiter
    for lineno, raw in enumerate(text.splitlines(), 1):
        if fence is not None:
            if raw.count(fence) % 2 == 1:
                fence = None
            continue
        line = _strip_comment(raw).strip()
        if depth > 0:
            depth = max(0, depth + _bracket_balance(line))
            continue
        if not line:
            continue
        if line.startswith("["):
            inner = line.strip("[]")
            table = _split_key(inner)
            out.setdefault(table, lineno)
            continue
        key, eq, value = _partition_top(line, "=")
        if not eq:
            continue
        path = (*table, *_split_key(key))
        out.setdefault(path, lineno)
        value = value.strip()
        if value.startswith("{"):
            _inline_keys(value, path, lineno, out)
        for delim in ('"""', "'''"):
            if value.startswith(delim) and value.count(delim) == 1:
                fence = delim
        depth = max(0, _bracket_balance(value)) if fence is None else 0
    return out


def _inline_keys(value: str, prefix: KeyPath, lineno: int, out: dict[KeyPath, int]) -> None:
    body = value[1 : value.rindex("}")] if "}" in value else value[1:]
    for item in _split_top(body, ","):
        key, eq, sub = _partition_top(item, "=")
        if not eq:
            continue
        path = (*prefix, *_split_key(key))
        out.setdefault(path, lineno)
        if sub.strip().startswith("{"):
            _inline_keys(sub.strip(), path, lineno, out)


def _scan(text: str) -> Iterator[tuple[int, str, int]]:
    """Yield (index, char, nesting depth) for characters outside strings."""
    quote: str | None = None
    depth = 0
    escaped = False
    for i, ch in enumerate(text):
        if quote is not None:
            if escaped:
                escaped = False
            elif ch == "\\" and quote == '"':
                escaped = True
            elif ch == quote:
                quote = None
            continue
        if ch in "\"'":
            quote = ch
            continue
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        yield i, ch, depth


def _split_top(text: str, sep: str) -> list[str]:
    parts, start = [], 0
    for i, ch, depth in _scan(text):
        if ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _partition_top(text: str, sep: str) -> tuple[str, str, str]:
    for i, ch, depth in _scan(text):
        if ch == sep and depth == 0:
            return text[:i], sep, text[i + 1 :]
    return text, "", ""


def _split_key(key: str) -> KeyPath:
    return tuple(part.strip().strip("\"'") for part in _split_top(key.strip(), "."))


def _strip_comment(line: str) -> str:
    for i, ch, _ in _scan(line):
        if ch == "#":
            return line[:i]
    return line


def _bracket_balance(text: str) -> int:
    """Brackets opened minus brackets closed, outside strings."""
    last = 0
    for _, _, depth in _scan(text):
        last = depth
    return last
