"""ALFWorld's text grammar, parsed once per process instead of once per game and per step.

TextWorld's `PddlEnv` spends most of a reset and a step in its TatSu parsers: loading a game parses the whole
grammar (~13 kB, a quarter of a second), and every derivation re-parses its template and the conditions of
the rules it visits; `copy_context` deep-copies entity infos for every symbol. Here:

- `game_logic(domain, grammar)` parses ALFWorld's grammar with its goal placeholder once; a game, whose grammar
  is that text with the placeholder replaced by its goal sentence, only re-parses the one rule holding it.
  Any other grammar (another ALFWorld version, a goal with quotes or backslashes) is parsed in full.
- `FastGrammar.derive` is TextWorld's `ContextSensitiveGrammar.derive` with the parses memoised and the
  contexts shared instead of deep-copied (nothing in a derivation mutates a context or an entity info), so it
  returns the same text, symbol for symbol. `tests/test_alfworld_engine.py` checks both against TextWorld.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from typing import Any

from textworld.envs.pddl import logic as pddl_logic
from textworld.envs.pddl import textgen
from textworld.envs.pddl.logic import model as logic_model
from textworld.logic import Rule, TypeHierarchy

from agentgym_opsd.environments.alfworld.assets import GOAL_PLACEHOLDER, grammar_text

__all__ = ["FastGrammar", "game_logic", "goal_of"]

_PLAIN_GOAL = re.compile(r'[^"\\\x00-\x1f]*')
"""Goals that pass unchanged through the document parser, JSON and dedent, so that substituting them in one
parsed rule equals parsing the substituted document."""

Context = Mapping[str, Any]


@functools.lru_cache(maxsize=512)
def _symbols(text: str) -> tuple[textgen.Symbol, ...]:
    """A derivation template parsed into symbols (shared: never mutated, contexts travel beside them)."""
    return tuple(textgen._parse_and_convert(text, rule_name="symbols"))


@functools.lru_cache(maxsize=512)
def _query(expression: str) -> Rule:
    return Rule.parse_conjunctive_query(expression)


class FastGrammar(textgen.ContextSensitiveGrammar):
    """`ContextSensitiveGrammar` with memoised parses; `derive` gives the same text as TextWorld's."""

    def derive(self, start: str, context: Context = {}) -> str:  # noqa: B006 (TextWorld's signature)
        stack = [(symbol, context) for symbol in reversed(_symbols(start))]
        derived: list[textgen.Symbol] = []
        while stack:
            symbol, ctx = stack.pop()
            if isinstance(symbol, textgen.TerminalSymbol):
                derived.append(symbol)
            elif isinstance(symbol, textgen.NonterminalSymbol):
                stack += reversed(self._expand_nonterminal(symbol, ctx))
            elif isinstance(symbol, (textgen.ConditionalSymbol, textgen.EvalSymbol, textgen.ListSymbol)):
                stack += reversed(self._expand(symbol, ctx))
            else:
                raise NotImplementedError(f"Unknown symbol: {type(symbol)}")
        return "".join(map(str, derived))

    def _expand_nonterminal(self, symbol: textgen.Symbol, ctx: Context) -> list[tuple[textgen.Symbol, Context]]:
        """TextWorld's `replace`: the right-hand side of the first rule whose condition holds."""
        rules = self._rules.get(str(symbol))
        if not rules:
            raise textgen.CSGUnknownSymbolError(symbol)
        for rule in rules:
            if not rule.condition or _holds(rule.condition, ctx):
                return [(s, ctx) for s in rule.rhs]
        raise IndexError(f"no rule of #{symbol}# applies")  # TextWorld: `rules[0]` of an empty list

    def _expand(self, symbol: textgen.Symbol, ctx: Context) -> list[tuple[textgen.Symbol, Context]]:
        if isinstance(symbol, textgen.EvalSymbol):
            return [(s, ctx) for s in symbol.derive(ctx)]
        if isinstance(symbol, textgen.ConditionalSymbol):
            contexts = _contexts(symbol.given, ctx) if symbol.given else [ctx]
            return [(symbol.expression, c) for c in contexts]
        if isinstance(symbol, textgen.ListSymbol):
            items = self._expand(symbol.symbol, ctx)
            if not items:
                return [(textgen.NonterminalSymbol("list_empty"), ctx)]
            if len(items) == 1:
                return items
            separated = [items[0]]
            for item in items[1:-1]:
                separated += [(textgen.NonterminalSymbol("list_separator"), ctx), item]
            return [*separated, (textgen.NonterminalSymbol("list_last_separator"), ctx), items[-1]]
        raise AttributeError(f"{type(symbol).__name__} cannot be derived inside a list")


def _holds(condition: str, ctx: Context) -> bool:
    return next(iter(ctx["state"].all_assignments(_query(condition), ctx["mapping"])), None) is not None


def _contexts(given: str, ctx: Context) -> list[Context]:
    """TextWorld's `query`: one context per assignment that satisfies `given`, extending ctx's variables."""
    infos = ctx["entity_infos"]
    out = []
    for mapping in ctx["state"].all_assignments(_query(given), ctx["mapping"]):
        variables = {**ctx["variables"], **{ph.name: infos[var.name] for ph, var in mapping.items()}}
        out.append({**ctx, "variables": variables, "mapping": {**ctx["mapping"], **mapping}})
    return out


# ---- game logic ------------------------------------------------------------------------------------------------
class _Converter(pddl_logic._ModelConverter):
    """TextWorld's model converter, also returning the grammar's rules as JSON data."""

    def walk_PddlDocumentNode(self, node):  # same walk as TextWorld's, plus the raw rules
        actions, raw = {}, {}
        for part in node.parts:
            if isinstance(part, logic_model.ActionTypeNode):
                action = self.walk(part)
                actions[action.name.lower()] = action
                lines = (line for line in action.grammar.split("\n") if not line.lstrip().startswith("#"))
                raw.update(json.loads("\n".join(lines)))
            elif isinstance(part, logic_model.ActionGrammarNode):
                raw.update(json.loads(self._unescape_block(part.code)))
        return actions, raw


class _Template:
    """A grammar with one goal placeholder, parsed once; `logic(goal)` builds a game's logic from it."""

    def __init__(self, domain: str, text: str) -> None:
        actions, raw = _Converter().walk(pddl_logic._PARSER.parse(text, rule_name="pddlStart"))
        grammar = FastGrammar.parse(json.dumps(raw))
        self.domain, self.actions, self.grammar = domain, actions, grammar
        self.types = TypeHierarchy()  # filled by the first state (the domain's types), as each game's would be
        self.goal_rules = [(name, i, rule) for name, rules in raw.items() for i, rule in enumerate(rules)
                           if GOAL_PLACEHOLDER in rule["rhs"] + rule.get("condition", "")]
        in_rules = sum((r["rhs"] + r.get("condition", "")).count(GOAL_PLACEHOLDER) for _, _, r in self.goal_rules)
        self.usable = text.count(GOAL_PLACEHOLDER) == 1 == in_rules

    def logic(self, goal: str) -> pddl_logic.GameLogic:
        grammar = FastGrammar()
        grammar._rules.update({name: list(rules) for name, rules in self.grammar._rules.items()})
        for name, index, rule in self.goal_rules:
            rhs = rule["rhs"].replace(GOAL_PLACEHOLDER, goal)
            grammar._rules[name][index] = textgen.ProductionRule(
                lhs=name, rhs=list(_symbols(rhs)), weight=rule.get("weight", 1),
                condition=rule.get("condition", "").replace(GOAL_PLACEHOLDER, goal))
        return _assemble(self.domain, grammar, self.actions, self.types)


def _assemble(domain: str, grammar: FastGrammar, actions: dict, types: Any) -> pddl_logic.GameLogic:
    logic = pddl_logic.GameLogic.__new__(pddl_logic.GameLogic)  # what GameLogic.__init__ sets, without parsing
    logic.domain, logic.grammar, logic.actions, logic.types = domain, grammar, actions, types
    return logic


@functools.lru_cache(maxsize=4)
def _template(domain: str, text: str) -> _Template:
    return _Template(domain, text)


def goal_of(grammar: str, template: str | None = None) -> str | None:
    """The goal sentence substituted into ALFWorld's grammar (None if `grammar` is not that grammar with a
    plain goal)."""
    prefix, found, suffix = (template or grammar_text()).partition(GOAL_PLACEHOLDER)
    if not found or not (grammar.startswith(prefix) and grammar.endswith(suffix)):
        return None
    goal = grammar[len(prefix):len(grammar) - len(suffix)]
    return goal if len(prefix) + len(suffix) <= len(grammar) and _PLAIN_GOAL.fullmatch(goal) else None


def game_logic(domain: str, grammar: str) -> pddl_logic.GameLogic:
    """`textworld.envs.pddl.logic.GameLogic(domain, grammar)` with a `FastGrammar`; cheap for ALFWorld games."""
    goal = goal_of(grammar)
    if goal is not None:
        template = _template(domain, grammar_text())
        if template.usable:
            return template.logic(goal)
    logic = pddl_logic.GameLogic(domain=domain, grammar=grammar)
    fast = FastGrammar()
    fast.update(logic.grammar)
    logic.grammar = fast
    return logic
