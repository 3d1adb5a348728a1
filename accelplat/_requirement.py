"""Requirement expressions: ``"xpu or (cuda and capability>=90)"``, parsed once, decided per device.

The one grammar every requirement is written in (the marker, :func:`accelplat.has`,
``accelplat.testing.requires``, project capabilities' ``requires``); ``docs/capabilities.md``
has the vocabulary and the vLLM predicate each word equals. Parsing is linear in the text.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from accelplat._types import DeviceInfo
from accelplat._util import shorten, shown
from accelplat.errors import ConfigurationError

if TYPE_CHECKING:
    from accelplat._platform import Platform


@dataclass(frozen=True, slots=True)
class Capability:
    """Whether a device can do one thing, and why.

    Attributes:
        available: ``True`` when it can.
        reason: One sentence naming the fact the answer came from.
        value: The variant where there are several (fp8: ``"e4m3fn"``, ``"e4m3fnuz"``), or ``None``.
    """

    available: bool
    reason: str
    value: str | None = None

    def __bool__(self) -> bool:
        return self.available


MAX_TEXT = 1000  # characters of one requirement; longer is refused, not parsed
MAX_DEPTH = 32  # nested parentheses and "not"s
_REASON = 160  # characters of one atom's reason quoted in a compound reason

# Platform words besides the registered platforms: vLLM's other platforms, so that "not tpu"
# reads as it does in vLLM's tests (true wherever accelplat runs on no such platform).
OTHER_PLATFORMS = frozenset({"tpu", "hpu", "npu", "mps"})

_TOKEN_RE = re.compile(
    r"\s*(?:(?P<paren>[()])"
    r"|(?P<cmp>capability)\s*(?P<op>>=|<=|==|!=|>|<)\s*(?P<num>\d{1,4}x?)(?![\w.+*-])"
    r"|(?P<word>[a-z0-9_][a-z0-9_.+*-]*)|(?P<bad>\S))",
    re.IGNORECASE,
)
_SM_RE = re.compile(r"^sm_(\d{1,2})(\d|x)(\+?)$")  # sm_90, sm_80+, sm_10x
_SM_RANGE_RE = re.compile(r"^sm_(\d{2,3})\.\.sm_(\d{2,3})$")  # sm_80..sm_89
_GFX_RE = re.compile(r"^gfx\d{1,2}(?:[0-9a-f]{2}|[0-9a-f]?\*)$")  # gfx942, gfx94*, gfx9*
MAX_SM_MAJOR = 15  # 12 is Blackwell (2025); higher is a typo
KNOWN_OTHER_ARCHS = frozenset(
    {"pvc", "dg2", "bmg", "lnl", "mtl", "arl", "ptl"}  # Intel GPUs (Level Zero device ids)
    | {"x86_64", "x86-64-v2", "x86-64-v3", "x86-64-v4", "aarch64", "arm64", "ppc64le", "s390x"}
    | {"riscv64"}
)
_KEYWORDS = frozenset({"and", "or", "not"})


def sm_number(text: str) -> tuple[int, int]:
    """``(8, 9)`` of ``"89"``: ``ValueError`` for a major that does not exist."""
    major, minor = int(text[:-1]), int(text[-1])
    if not 1 <= major <= MAX_SM_MAJOR:
        raise ValueError(f"compute capability {major}.{minor} does not exist")
    return major, minor


@dataclass(frozen=True, slots=True)
class Arch:
    """An architecture pattern: exact, at least (``sm_80+``), a family, or a range."""

    text: str
    low: tuple[int, int] | None = None  # NVIDIA patterns: the compute capability bounds
    high: tuple[int, int] | None = None

    def matches(self, info: DeviceInfo) -> bool:
        arch = (info.arch or "").lower()
        if self.low is not None:  # an sm_ pattern: an NVIDIA arch within the bounds
            cc = info.compute_capability
            inside = cc is not None and cc >= self.low and (self.high is None or cc <= self.high)
            return arch.startswith("sm_") and inside
        if self.text.endswith("*"):
            return arch.startswith(self.text[:-1])
        return arch == self.text


def parse_arch(text: object, where: str = "") -> Arch:
    """Return an arch pattern: ``sm_90``, ``sm_80+``, ``sm_10x``, ``sm_80..sm_89``, ``gfx94*``….

    Raises:
        ConfigurationError: Not a known arch or pattern (the message lists the forms).
    """
    if not isinstance(text, str) or not text.strip():
        raise ConfigurationError(f"{where}an arch must be a non-empty string, got {shown(text)}")
    return _parse_arch(text.strip().lower(), where)


@functools.lru_cache(maxsize=256)
def _parse_arch(text: str, where: str) -> Arch:
    try:
        if m := _SM_RANGE_RE.match(text):
            low, high = sm_number(m.group(1)), sm_number(m.group(2))
            if low > high:
                raise ValueError(f"the range {text} is empty")
            return Arch(text, low, high)
        if m := _SM_RE.match(text):
            major = m.group(1)
            if m.group(2) == "x":  # a family: every minor of one major (CUDA 13's sm_10x)
                if m.group(3):
                    raise ValueError("a family takes no '+' (sm_100+ is 10.0 or newer)")
                low = sm_number(major + "0")
                return Arch(text, low, (low[0], 9))
            low = sm_number(major + m.group(2))
            return Arch(text, low, None if m.group(3) else low)
    except ValueError as exc:
        raise ConfigurationError(f"{where}{text!r} is no NVIDIA architecture: {exc}") from None
    if _GFX_RE.match(text) or text in KNOWN_OTHER_ARCHS:
        return Arch(text)
    raise ConfigurationError(
        f"{where}unknown arch {shown(text, 80)}; use sm_90, sm_80+, sm_10x or sm_80..sm_89 "
        f"(NVIDIA), gfx942 or gfx94* (AMD), or one of {', '.join(sorted(KNOWN_OTHER_ARCHS))}"
    )


# -- the tree: the one tree of the grammar, built by the parser and the vLLM translator -------


@dataclass(frozen=True, slots=True)
class Name:
    """A capability or a platform: a capability where the device's table has the name."""

    name: str


@dataclass(frozen=True, slots=True)
class ArchIs:
    """The device's architecture matches a pattern."""

    arch: Arch


@dataclass(frozen=True, slots=True)
class Compare:
    """``capability>=90``: vLLM's cross-vendor number, major * 10 + minor."""

    op: str
    number: int
    family: bool  # capability==10x: vLLM's is_device_capability_family(100)


@dataclass(frozen=True, slots=True)
class Not:
    operand: Node


@dataclass(frozen=True, slots=True)
class Join:
    """``a and b and …`` (``op`` ``"and"``) or ``a or b or …`` (``"or"``)."""

    op: str
    operands: tuple[Node, ...]


Node = Name | ArchIs | Compare | Not | Join
_OPS: dict[str, Callable[[int, int], bool]] = {
    ">=": lambda a, b: a >= b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    "<": lambda a, b: a < b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
}


def joined(op: str, nodes: Iterable[Node]) -> Node:
    """``a <op> b <op> …``: nested joins of ``op`` flattened, repeats dropped; one: itself."""
    flat: list[Node] = []
    for node in nodes:  # (a and b) and c -> a and b and c
        flat.extend(node.operands if isinstance(node, Join) and node.op == op else (node,))
    unique = tuple(dict.fromkeys(flat))
    return unique[0] if len(unique) == 1 else Join(op, unique)


def negate(node: Node) -> Node:
    """``not node``, pushed down to the words (De Morgan); a word's ``not`` stays a ``not``.

    A comparison is never flipped: ``not capability>=90`` holds on a CPU host, where
    ``capability<90`` does not (a device without a number fails every comparison).
    """
    if isinstance(node, Not):
        return node.operand
    if isinstance(node, Join):
        return joined("or" if node.op == "and" else "and", (negate(o) for o in node.operands))
    return Not(node)


@functools.lru_cache(maxsize=256)
def word(text: str) -> Node:
    """A requirement as a node, its words unchecked: ``"rocm and (gfx95* or gfx1250)"``."""
    return _parse(text, atom)


def atom(text: str) -> Name | ArchIs:
    """A word that is no keyword or comparison: an arch pattern if it is one, else a name."""
    try:
        return ArchIs(parse_arch(text))
    except ConfigurationError:
        return Name(text)


def render(node: Node, outer: int = 0) -> str:
    """Return the canonical text of ``node``: the grammar's one printer.

    Lower case, single spaces, parentheses where needed and around an "and" inside an "or",
    for the reader: ``xpu or (cuda and fp8)``.
    """
    if isinstance(node, Name):
        return node.name
    if isinstance(node, ArchIs):
        return node.arch.text
    if isinstance(node, Compare):
        return f"capability{node.op}{f'{node.number // 10}x' if node.family else node.number}"
    if isinstance(node, Not):
        return f"not {render(node.operand, 3)}"
    level = 2 if node.op == "and" else 1
    inner = f" {node.op} ".join(render(o, level) for o in node.operands)
    return f"({inner})" if outer not in (0, level) else inner


# -- parsing --------------------------------------------------------------------------------


def _tokens(text: str, error: Callable[[str], ConfigurationError]) -> list[tuple[str, str]]:
    """``(kind, value)`` of each token, and ``("end", "")``: kinds paren, cmp, keyword, word."""
    tokens = []
    for m in _TOKEN_RE.finditer(text):  # every character but a space matches
        if m.group("bad"):
            raise error(f"unexpected {shown(text[m.start('bad') :].strip()[:20])}")
        if m.group("paren"):
            tokens.append(("paren", m.group("paren")))
        elif m.group("cmp"):
            tokens.append(("cmp", f"{m.group('op')} {m.group('num').lower()}"))
        else:
            word = m.group("word").lower()
            tokens.append(("keyword" if word in _KEYWORDS else "word", word))
    if not tokens:
        raise error("is empty")
    return [*tokens, ("end", "")]


def _parse(text: str, classify: Callable[[str], Node]) -> Node:
    """Parse ``text`` (``or`` binds loosest, then ``and``, then ``not``); words by ``classify``."""

    def error(why: str) -> ConfigurationError:
        return ConfigurationError(f"requirement {shown(text, 120)}: {why}")

    tokens = _tokens(text, error)
    pos = 0

    def take() -> tuple[str, str]:
        nonlocal pos
        if tokens[pos][0] == "end":
            raise error("ends too early")
        pos += 1
        return tokens[pos - 1]

    def operand(depth: int, level: int = 0) -> Node:
        """Level 0: an "or" of level 1s; 1: an "and" of level 2s; 2: a word, "not" or "(…)"."""
        nonlocal pos
        if level < 2:
            keyword = "or" if level == 0 else "and"
            parts = [operand(depth, level + 1)]
            while tokens[pos] == ("keyword", keyword):
                pos += 1
                parts.append(operand(depth, level + 1))
            return joined(keyword, parts)
        if depth > MAX_DEPTH:
            raise error(f"nests deeper than {MAX_DEPTH} levels")
        kind, value = take()
        if (kind, value) == ("keyword", "not"):
            return Not(operand(depth + 1, 2))
        if (kind, value) == ("paren", "("):
            node = operand(depth + 1)
            if take() != ("paren", ")"):
                raise error("a '(' is not closed")
            return node
        if kind == "cmp":
            op, num = value.split()
            family = num.endswith("x")
            if family and op not in ("==", "!="):
                raise error(f"a family ({num}) compares only with == or !=")
            return Compare(op, int(num[:-1]) * 10 if family else int(num), family)
        if kind == "word":
            return classify(value)
        raise error(f"unexpected {value!r}")

    node = operand(0)
    if tokens[pos][0] != "end":
        raise error(f"unexpected {tokens[pos][1]!r}")
    return node


@dataclass(frozen=True)
class Requirement:
    """A parsed requirement: its canonical ``text``, and how to decide it on a device."""

    text: str
    node: Node

    def names(self) -> frozenset[str]:
        """The capability and platform names it reads."""
        return frozenset(n.name for n in _walk(self.node) if isinstance(n, Name))

    def evaluate(
        self, platform: Platform, info: DeviceInfo | None, table: Mapping[str, Capability]
    ) -> tuple[bool, str]:
        """Return whether it holds on ``info`` (``None``: no device visible), and why.

        ``table`` is the device's capability table (:func:`accelplat.capabilities`).
        """
        return _decide(self.node, platform, info, table)


def _walk(node: Node) -> Iterator[Node]:
    yield node
    if isinstance(node, Not):
        yield from _walk(node.operand)
    elif isinstance(node, Join):
        for operand in node.operands:
            yield from _walk(operand)


def named(info: DeviceInfo) -> str:
    """``"NVIDIA H200 (sm_90)"``: a device as reasons name it."""
    return f"{info.name} ({info.arch or 'architecture unknown'})"


def _decide(
    node: Node, platform: Platform, info: DeviceInfo | None, table: Mapping[str, Capability]
) -> tuple[bool, str]:
    if isinstance(node, Name):
        if (cap := table.get(node.name)) is not None:
            return cap.available, shorten(cap.reason, _REASON)
        return platform.name == node.name, f"the current platform is {platform.name}"
    if isinstance(node, ArchIs | Compare):
        if info is None:  # only the device's own words fail without one ("not" of them holds)
            return False, f"{platform.name} has no visible device"
        if isinstance(node, ArchIs):
            return node.arch.matches(info), f"this is {named(info)}"
        cc = info.compute_capability
        if cc is None:  # vLLM's get_device_capability() is None here: every comparison fails
            return False, f"{named(info)} has no compute capability number"
        number = cc[0] * 10 + (0 if node.family else cc[1])  # a family compares the major
        return _OPS[node.op](number, node.number), f"{named(info)} has capability {cc[0]}{cc[1]}"
    if isinstance(node, Not):
        held, why = _decide(node.operand, platform, info, table)
        return not held, why
    results = [_decide(o, platform, info, table) for o in node.operands]
    if node.op == "and":
        failed = [why for held, why in results if not held]
        return not failed, "; ".join(dict.fromkeys(failed)) or "; ".join(w for _, w in results)
    passed = [why for ok, why in results if ok]
    return bool(passed), "; ".join(dict.fromkeys(passed or [why for _, why in results]))


@functools.lru_cache(maxsize=1024)
def _parse_cached(
    text: str, capabilities: frozenset[str], platforms: frozenset[str]
) -> Requirement:
    def classify(word: str) -> Node:
        if word in capabilities or word in platforms:
            return Name(word)
        if isinstance(node := atom(word), ArchIs):
            return node
        raise ConfigurationError(
            f"unknown word {shown(word, 80)} in a requirement; a word is a capability "
            f"({shorten(', '.join(sorted(capabilities)), 300)}), a platform "
            f"({', '.join(sorted(platforms))}), an arch (sm_90+, gfx94*, pvc, …) or "
            "capability>=NN"
        )

    node = _parse(text, classify)
    return Requirement(render(node), node)


def parse(text: object, *, capabilities: frozenset[str], platforms: frozenset[str]) -> Requirement:
    """Parse one requirement against the known capability and platform names.

    Raises:
        ConfigurationError: Not a string, too long, malformed, or an unknown word (named).
    """
    if not isinstance(text, str):
        raise ConfigurationError(f"a requirement is a string, got {shown(text, 80)}")
    if len(text) > MAX_TEXT:
        raise ConfigurationError(
            f"requirement {shown(text, 80)} is longer than {MAX_TEXT} characters"
        )
    return _parse_cached(text.strip(), capabilities, platforms)
