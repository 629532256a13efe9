"""Action parsers: model text -> environment action.

Parsers are pure functions of the text. They never raise on model output: text without a usable action
gives a `ParsedAction` with `valid=False` and the reason, and the rollout sends it to the environment as an
invalid action (penalised, episode continues).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "ParsedAction",
    "ActionParser",
    "TagParser",
    "WebShopParser",
    "make_parser",
    "MAX_ACTION_CHARS",
]

MAX_ACTION_CHARS = 2_000
"""Actions longer than this are refused: no environment command is that long and huge strings would only
slow the environment down."""

_CONTROL_CHARS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


@dataclass(frozen=True)
class ParsedAction:
    """`action` is what the environment receives (may be "" when nothing parsed); `kind` is the tag or
    verb that was found (`action`, `search`, `answer`, `click`); `reason` says why `valid` is False;
    `span` is where the action's argument (the tag's content, the text inside `verb[...]`) sits in the
    parsed text, as (start, end) character offsets (the evidence over argument tokens reads it)."""

    action: str
    valid: bool
    kind: str | None = None
    reason: str | None = None
    span: tuple[int, int] | None = None


class ActionParser(Protocol):
    def parse(self, text: str) -> ParsedAction: ...

    def format(self, action: str) -> str:
        """The model text that parses to `action` (used to write demonstrations and scripted policies)."""
        ...


def _clean(content: str) -> str:
    return " ".join(_CONTROL_CHARS.sub(" ", content).split())


def _stripped_span(text: str, start: int, end: int) -> tuple[int, int]:
    """(start, end) of `text[start:end]` without its leading and trailing whitespace (what `_clean` drops)."""
    raw = text[start:end]
    return start + len(raw) - len(raw.lstrip()), end - len(raw) + len(raw.rstrip())


@dataclass(frozen=True)
class TagParser:
    """Finds `<tag>content</tag>` for one of `tags`.

    With `keep_tags=False` (ALFWorld style, one tag) the action is the cleaned content; with
    `keep_tags=True` (Search-R1 style) the action keeps its tag, e.g. `<search>who wrote x</search>`, so the
    environment knows which kind it is. By default the first complete tag is acted on and the rest of the
    response ignored, as Search-R1 does; `strict=True` is verl-agent's stricter projection, where two tags
    (or a repeated one) make the action invalid. `allow_empty` makes `<search></search>` an action with
    empty content, as in Search-R1 (an empty query is searched, an empty answer is scored); otherwise an
    empty tag is invalid. `case_sensitive` matches the tag names exactly (Search-R1); ours accept any case.
    """

    tags: tuple[str, ...] = ("action",)
    keep_tags: bool = False
    strict: bool = False
    allow_empty: bool = False
    case_sensitive: bool = False

    def __post_init__(self) -> None:
        if not self.tags:
            raise ValueError("TagParser needs at least one tag name")
        for tag in self.tags:
            if not re.fullmatch(r"[a-z_][a-z0-9_]*", tag):
                raise ValueError(f"tag names must be lower-case identifiers, got {tag!r}")

    @property
    def _pattern(self) -> re.Pattern[str]:
        alternatives = "|".join(re.escape(t) for t in self.tags)
        flags = re.DOTALL if self.case_sensitive else re.DOTALL | re.IGNORECASE
        return re.compile(rf"<({alternatives})>(.*?)</\1>", flags)

    def parse(self, text: str) -> ParsedAction:
        if not isinstance(text, str):
            return ParsedAction("", False, reason=f"expected text, got {type(text).__name__}")
        matches = list(self._pattern.finditer(text))
        if not matches:
            wanted = " or ".join(f"<{t}>...</{t}>" for t in self.tags)
            return ParsedAction("", False, reason=f"no {wanted} found")
        if self.strict and len(matches) > 1:
            return ParsedAction("", False, reason="more than one action tag in one response")
        tag, content = matches[0].group(1).lower(), _clean(matches[0].group(2))
        if not content and not self.allow_empty:
            return ParsedAction("", False, kind=tag, reason=f"empty <{tag}> tag")
        if len(content) > MAX_ACTION_CHARS:
            return ParsedAction("", False, kind=tag, reason=f"action longer than {MAX_ACTION_CHARS} characters")
        action = f"<{tag}>{content}</{tag}>" if self.keep_tags else content
        return ParsedAction(action, True, kind=tag, span=_stripped_span(text, *matches[0].span(2)))

    def format(self, action: str) -> str:
        if self.keep_tags and self._pattern.fullmatch(action.strip()):
            return action.strip()
        return f"<{self.tags[0]}>{action}</{self.tags[0]}>"


_WEBSHOP_VERB = re.compile(r"\b(search|click|think)\[", re.IGNORECASE)


@dataclass(frozen=True)
class WebShopParser:
    """WebShop-style `search[query]` / `click[name]` (and `think[thought]`, which the environment accepts
    and ignores), bare or inside `<action>...</action>`.

    The first command inside the action tag wins; without a tag, the first command anywhere in the text.
    An action is one line, and its argument runs to the last "]" on that line, as the original WebShop
    reads actions ("search[shirt [xl]] now" -> "search[shirt [xl]]").
    """

    tag: str = "action"

    def parse(self, text: str) -> ParsedAction:
        if not isinstance(text, str):
            return ParsedAction("", False, reason=f"expected text, got {type(text).__name__}")
        tagged = re.search(rf"<{self.tag}>(.*?)</{self.tag}>", text, re.DOTALL | re.IGNORECASE)
        region = tagged.group(1) if tagged else text
        match = _WEBSHOP_VERB.search(region)
        if match is None:
            return ParsedAction("", False, reason="no search[...] or click[...] found")
        verb = match.group(1).lower()
        line = region[match.end():].split("\n", 1)[0]
        close = line.rfind("]")
        if close < 0:
            return ParsedAction("", False, kind=verb, reason=f"{verb}[ without a closing ] on its line")
        argument = _clean(line[:close])
        if not argument:
            return ParsedAction("", False, kind=verb, reason=f"empty {verb}[...]")
        if len(argument) > MAX_ACTION_CHARS:
            return ParsedAction("", False, kind=verb, reason=f"argument longer than {MAX_ACTION_CHARS} characters")
        if verb == "click":
            argument = argument.lower()  # WebShop clickables are matched lower-cased
        start = (tagged.start(1) if tagged else 0) + match.end()
        return ParsedAction(f"{verb}[{argument}]", True, kind=verb, span=_stripped_span(text, start, start + close))

    def format(self, action: str) -> str:
        return f"<{self.tag}>{action}</{self.tag}>"


def make_parser(spec: str) -> ActionParser:
    """Build a parser from a short spec.

    - `tag:action`: the content of the first `<action>...</action>` (ALFWorld, our default form);
    - `tag:search,answer`: several tags, kept in the action; the first complete tag is acted on, empty tags
      are actions and tag names are case-sensitive — Search-R1's rules;
    - `tag-strict:search,answer`: the same, but two tags in one response are invalid (verl-agent);
    - `webshop`: `search[...]` / `click[...]` (and `think[...]`).
    """
    kind, _, argument = spec.partition(":")
    if kind in ("tag", "tag-strict"):
        tags = tuple(t.strip() for t in (argument or "action").split(",") if t.strip())
        multi = len(tags) > 1
        return TagParser(tags=tags, keep_tags=multi, strict=kind == "tag-strict", allow_empty=multi,
                         case_sensitive=multi)
    if kind == "webshop":
        return WebShopParser()
    raise ValueError(f"unknown parser spec {spec!r}; expected 'tag:<name>[,<name>...]', "
                     "'tag-strict:<name>,<name>...' or 'webshop'")
