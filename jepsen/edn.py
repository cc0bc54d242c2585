"""A reader and writer for the subset of EDN that Jepsen histories use.

EDN (https://github.com/edn-format/edn) is Clojure's data notation. Jepsen writes every
history as EDN, so reading and writing it exactly is what lets our histories go through any
Jepsen tool and lets Jepsen's own histories be used as test vectors for our checkers.

Mapping between EDN and Python:

=====================  ===========================================================
EDN                    Python
=====================  ===========================================================
``nil``                ``None``
``true`` / ``false``   ``True`` / ``False``
``42``, ``42N``        ``int``
``1.5``, ``1e3``       ``float`` (``1.5M`` reads as ``decimal.Decimal``)
``"text"``             ``str``
``\\c``                ``str`` of length one (written back as a string)
``:name``              ``Keyword`` (a ``str`` subclass: ``Keyword("ok") == "ok"``)
``name``               ``Symbol`` (a ``str`` subclass)
``[a b]``              ``list`` (or ``tuple`` where it must be hashable: a map key or a
                       set element; a plain ``tuple`` is written as a vector)
``(a b)``              ``EdnList`` (a ``tuple`` subclass)
``{k v}``              ``dict`` (insertion order kept, written back in that order)
``#{a b}``             ``frozenset``
``#tag form``          ``Tagged(tag, form)``
``#_ form``            discarded
=====================  ===========================================================

Commas are whitespace and ``;`` starts a comment that runs to the end of the line.

The writer is deterministic: maps are written in insertion order, and sets, whose Python
iteration order depends on per-process string hashing, are written sorted by the text of
their elements. Writing what was read gives back equal data (``loads(dumps(x)) == x``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

__all__ = [
    "EdnError",
    "EdnList",
    "Keyword",
    "Symbol",
    "Tagged",
    "dumps",
    "iter_forms",
    "loads",
    "loads_all",
]


class EdnError(ValueError):
    """The text is not EDN we can read, or the value has no EDN form."""


class Keyword(str):
    """An EDN keyword such as ``:ok``; holds the name without the colon.

    Being a ``str``, a keyword compares equal to, and hashes like, its name, so code can
    write ``op.type == "ok"`` or look up ``value["from"]``; only the writer tells the two
    apart (``:ok`` versus ``"ok"``).
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Keyword({str.__repr__(self)})"


class Symbol(str):
    """An EDN symbol such as ``foo`` or ``my.ns/bar``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Symbol({str.__repr__(self)})"


class EdnList(tuple[Any, ...]):
    """An EDN list ``(a b c)``; a tuple so that it is hashable and distinct from vectors."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"EdnList({tuple.__repr__(self)})"


@dataclass(frozen=True)
class Tagged:
    """A tagged element ``#tag form`` whose tag we do not interpret (``#inst``, ``#uuid``...)."""

    tag: str
    value: Any


# ---------------------------------------------------------------------------------------------
# Reader

# One token per match, after any whitespace, commas and comments. Order matters: strings and
# characters before atoms, `#{` and `#_` before tags.
_TOKEN = re.compile(
    r"""
    (?:[\s,]+|;[^\n]*)*
    (?:
      (?P<atom>[^\s,\[\]{}()";\\\#][^\s,\[\]{}()";\\]*|\#\#[^\s,\[\]{}()";\\]*)
    | (?P<open>\#\{|[\[{(])
    | (?P<close>[\]})])
    | (?P<string>"(?:[^"\\]|\\.)*")
    | (?P<discard>\#_)
    | (?P<tag>\#[A-Za-z][^\s,\[\]{}()";]*)
    | (?P<char>\\(?:newline|space|tab|return|formfeed|backspace|u[0-9A-Fa-f]{4}|[^\s,\[\]{}()]))
    )
    """,
    re.VERBOSE | re.DOTALL,
)
_SKIP = re.compile(r"(?:[\s,]+|;[^\n]*)*")

_INT = re.compile(r"[+-]?\d+N?")
_INT_VECTOR = re.compile(r"\[((?:[\s,]*[+-]?\d+(?=[\s,\]]))*)[\s,]*\]")
_FLOAT = re.compile(r"[+-]?\d+(?:\.\d*)?(?:[eE][+-]?\d+)?M?")
_STRING_ESCAPES = {'"': '"', "\\": "\\", "n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}
_CHAR_NAMES = {
    "newline": "\n",
    "space": " ",
    "tab": "\t",
    "return": "\r",
    "formfeed": "\f",
    "backspace": "\b",
}
_CLOSER = {"[": "]", "(": ")", "{": "}", "#{": "}"}
_STRING_ESCAPE = re.compile(r"\\(u[0-9A-Fa-f]{4}|.)", re.DOTALL)


def _unescape(match: re.Match[str]) -> str:
    code = match.group(1)
    if code[0] == "u" and len(code) == 5:
        return chr(int(code[1:], 16))
    try:
        return _STRING_ESCAPES[code]
    except KeyError:
        raise EdnError(f"unknown string escape \\{code}") from None


def _atom(text: str) -> Any:
    if text == "nil":
        return None
    if text == "true":
        return True
    if text == "false":
        return False
    if text[0] == ":":
        if len(text) == 1:
            raise EdnError("empty keyword ':'")
        return Keyword(text[1:])
    if _INT.fullmatch(text):
        return int(text.rstrip("N"))
    if _FLOAT.fullmatch(text):
        if text.endswith("M"):
            return Decimal(text[:-1])
        return float(text)
    if text in ("##Inf", "##-Inf", "##NaN"):
        return {"##Inf": math.inf, "##-Inf": -math.inf, "##NaN": math.nan}[text]
    if text[0].isdigit() or (len(text) > 1 and text[0] in "+-" and text[1].isdigit()):
        raise EdnError(f"malformed number {text!r}")
    return Symbol(text)


def _hashable(value: Any) -> Any:
    """Return a hashable equal form of `value`, for map keys and set elements."""
    if isinstance(value, list):
        return tuple(_hashable(item) for item in value)
    if isinstance(value, dict):
        # Maps as keys are legal EDN but never occur in histories; keep them readable.
        return tuple((_hashable(k), _hashable(v)) for k, v in value.items())
    return value


class _Reader:
    """Iterative parser over one string; an explicit stack avoids any recursion limit."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.position = 0
        self._top_level: list[Any] = []

    def _error(self, message: str) -> EdnError:
        line = self.text.count("\n", 0, self.position) + 1
        return EdnError(f"{message} (line {line})")

    def forms(self) -> Iterator[Any]:
        # A frame is [opener, items, prefixes]; prefixes is a list of pending "#_" markers
        # and tags that apply to the next complete form read into that frame.
        stack: list[list[Any]] = [["", [], []]]
        text = self.text
        match_token = _TOKEN.match
        while True:
            match = match_token(text, self.position)
            if match is None:
                skipped = _SKIP.match(text, self.position)
                assert skipped is not None, "the skip pattern matches the empty string"
                self.position = skipped.end()
                if self.position < len(text):
                    raise self._error(f"unexpected character {text[self.position]!r}")
                if len(stack) > 1:
                    raise self._error(f"unclosed {stack[-1][0]!r}")
                if stack[0][2]:
                    raise self._error("a '#_' or tag with no form after it")
                return
            self.position = match.end()
            kind = match.lastgroup
            assert kind is not None
            token = match.group(kind)
            value: Any
            if kind == "atom":
                # Keywords and plain integers are most of a history; skip the general path.
                first = token[0]
                if first == ":" and len(token) > 1:
                    value = Keyword(token[1:])
                elif first.isdigit() and token.isascii() and token.isdigit():
                    value = int(token)
                else:
                    try:
                        value = _atom(token)
                    except EdnError as error:
                        raise self._error(str(error)) from None
            elif kind == "open":
                if token == "[":
                    # Fast path: a vector of plain integers, as list-append reads are.
                    numbers = _INT_VECTOR.match(text, match.start(kind))
                    if numbers is None:
                        stack.append([token, [], []])
                        continue
                    self.position = numbers.end()
                    value = [int(n) for n in numbers.group(1).replace(",", " ").split()]
                else:
                    stack.append([token, [], []])
                    continue
            elif kind == "close":
                if len(stack) == 1:
                    raise self._error(f"unmatched {token!r}")
                opener, items, prefixes = stack.pop()
                if _CLOSER[opener] != token:
                    raise self._error(f"{opener!r} closed by {token!r}")
                if prefixes:
                    raise self._error("a '#_' or tag with no form after it")
                value = self._collection(opener, items)
            elif kind == "discard":
                stack[-1][2].append(None)
                continue
            elif kind == "tag":
                stack[-1][2].append(token[1:])
                continue
            elif kind == "string":
                value = _STRING_ESCAPE.sub(_unescape, token[1:-1]) if "\\" in token else token[1:-1]
            else:
                name = token[1:]
                if len(name) == 1:
                    value = name
                elif name[0] == "u" and len(name) == 5:
                    value = chr(int(name[1:], 16))
                else:
                    value = _CHAR_NAMES[name]
            frame = stack[-1]
            if frame[2]:
                if self._emit(stack, value):
                    yield self._top_level.pop()
            elif len(stack) == 1:
                yield value
            else:
                frame[1].append(value)

    def _emit(self, stack: list[list[Any]], value: Any) -> bool:
        """Put a complete form into the innermost frame; True if it is a top-level form."""
        frame = stack[-1]
        prefixes = frame[2]
        # Apply pending prefixes, innermost (last read) first.
        while prefixes:
            prefix = prefixes.pop()
            if prefix is None:
                return False
            value = Tagged(prefix, value)
        if len(stack) == 1:
            self._top_level.append(value)
            return True
        frame[1].append(value)
        return False

    def _collection(self, opener: str, items: list[Any]) -> Any:
        if opener == "[":
            return items
        if opener == "(":
            return EdnList(items)
        if opener == "#{":
            return frozenset(_hashable(item) for item in items)
        if len(items) % 2:
            raise self._error("a map with an odd number of forms")
        result: dict[Any, Any] = {}
        for i in range(0, len(items), 2):
            result[_hashable(items[i])] = items[i + 1]
        return result


def iter_forms(text: str) -> Iterator[Any]:
    """Yield each top-level form of `text` in order."""
    return _Reader(text).forms()


def loads_all(text: str) -> list[Any]:
    """Read every top-level form of `text`."""
    return list(iter_forms(text))


def loads(text: str) -> Any:
    """Read exactly one form from `text`."""
    forms = loads_all(text)
    if len(forms) != 1:
        raise EdnError(f"expected one form, found {len(forms)}")
    return forms[0]


# ---------------------------------------------------------------------------------------------
# Writer

_ESCAPE_OUT = str.maketrans({'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"})


def _write(value: Any, out: list[str]) -> None:
    # Order of tests matters: bool before int, Keyword/Symbol before str, EdnList before tuple.
    if value is None:
        out.append("nil")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, Keyword):
        out.append(":" + value)
    elif isinstance(value, Symbol):
        out.append(str.__str__(value))
    elif isinstance(value, str):
        out.append('"' + value.translate(_ESCAPE_OUT) + '"')
    elif isinstance(value, int):
        out.append(str(int(value)))
    elif isinstance(value, float):
        if math.isnan(value):
            out.append("##NaN")
        elif math.isinf(value):
            out.append("##Inf" if value > 0 else "##-Inf")
        else:
            out.append(repr(value))
    elif isinstance(value, Decimal):
        out.append(f"{value}M")
    elif isinstance(value, dict):
        out.append("{")
        first = True
        for key, item in value.items():
            if not first:
                out.append(", ")
            first = False
            _write(key, out)
            out.append(" ")
            _write(item, out)
        out.append("}")
    elif isinstance(value, EdnList):
        _write_sequence("(", value, ")", out)
    elif isinstance(value, list | tuple):
        _write_sequence("[", value, "]", out)
    elif isinstance(value, set | frozenset):
        # Set iteration order depends on hash randomization; sort by written text instead.
        _write_sequence("#{", sorted(dumps(item) for item in value), "}", out, raw=True)
    elif isinstance(value, Tagged):
        out.append("#" + value.tag + " ")
        _write(value.value, out)
    else:
        raise EdnError(f"no EDN form for {type(value).__name__}: {value!r}")


def _write_sequence(
    opener: str, items: Any, closer: str, out: list[str], *, raw: bool = False
) -> None:
    out.append(opener)
    first = True
    for item in items:
        if not first:
            out.append(" ")
        first = False
        if raw:
            out.append(item)
        else:
            _write(item, out)
    out.append(closer)


def dumps(value: Any) -> str:
    """Write `value` as EDN text (no trailing newline)."""
    out: list[str] = []
    _write(value, out)
    return "".join(out)
