"""The game engine: TextWorld's PDDL engine playing one ALFWorld `game.tw-pddl`, with ALFWorld's names.

It plays exactly as TextWorld's `PddlEnv` (ALFWorld's own engine) does — same text, same admissible commands,
"Nothing happens." for anything else — but does not redo per game and per step what does not change:

- `CompiledGame`: a game's parsed grammar (`grammar.game_logic`), its fast-downward translation and initial
  facts, and its entity names, computed once per process and shared by every engine that plays the game (a
  GRPO group resets G engines on one game). `PddlEnv` translates the problem twice on load and twice more on
  every reset; the planner's own translation is made only when the oracle is first asked.
- `AlfredEngine.reset` rebuilds the initial state from the compiled game (a `load_sas` and a list of facts);
  `step` answers a command that is not admissible without touching the state (the state did not change, so
  neither do the commands).

fast-downward (inside TextWorld) replans from any state in a few milliseconds, which is our oracle.
"""

from __future__ import annotations

import json
import os
import threading
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agentgym_opsd.environments.alfworld.names import display_names

__all__ = ["AlfredEngine", "CompiledGame", "EngineState", "NOTHING_HAPPENS", "PARSE_LOCK", "compile_game",
           "clear_compiled_games"]

NOTHING_HAPPENS = "Nothing happens."
"""The engine's answer to a command that is not admissible."""

PARSE_LOCK = threading.RLock()
"""TextWorld's TatSu parsers are module-level objects, and fast-downward's translator swaps `sys.stdout` and
sets module options: two threads in them at once crash ("pop from empty list") or garble each other. Every
engine call in this package holds this lock, so engines are safe in EnvPool threads (they never ran in
parallel anyway: the GIL serialises this pure-Python work)."""

_COMPILED_GAMES = 64
"""How many compiled games a process keeps (about 0.6 MB each)."""


@dataclass(frozen=True)
class EngineState:
    """What the player learns after reset or one command."""

    observation: str
    admissible_commands: list[str]
    won: bool


class CompiledGame:
    """What does not change while one game is played: build with `compile_game`; read-only afterwards."""

    def __init__(self, data: Mapping[str, Any], lib: Any) -> None:
        import fast_downward
        from textworld.logic import Type
        from textworld.utils import check_flag

        from agentgym_opsd.environments.alfworld.grammar import game_logic

        self.domain, self.problem = data["pddl_domain"], data["pddl_problem"]
        walkthrough = data.get("walkthrough")
        self.walkthrough: tuple[str, ...] | None = tuple(walkthrough) if walkthrough is not None else None
        self.logic = game_logic(self.domain, data["grammar"])
        self.task, self.sas = fast_downward.pddl2sas(self.domain, self.problem, verbose=check_flag("TW_PDDL_DEBUG"))
        self._sas = self.sas.encode("utf-8")
        self._replan_sas: bytes | None = None
        # What PddlState.__init__ derives from the translation, in its order.
        self.fd_actions = {a.name: a for a in self.task.actions}
        for fd_type in self.task.types:
            try:
                self.logic.types.add(Type(fd_type.name, fd_type.supertype_names))
            except ValueError:
                pass  # already known (PddlState ignores it the same way)
        self.name2type = {o.name: o.type_name for o in self.task.objects}
        self.initial_facts = (*self._init_facts(), *self._state_facts(lib))
        self.entity_infos = self._entity_infos(self.initial_state(lib))
        self.names = {pddl_id: info.name for pddl_id, info in self.entity_infos.items()}

    def _init_facts(self) -> list[Any]:
        """PddlState's facts from the problem's `:init` (no equalities, costs or distances)."""
        from fast_downward.translate.pddl import conditions, f_expression
        from textworld.logic import Proposition, Variable

        def proposition(name: str, args: Any) -> Proposition:
            return Proposition(name, [Variable(arg, self.name2type[arg]) for arg in args])

        facts = []
        for atom in self.task.init:
            if isinstance(atom, conditions.Atom) and atom.predicate != "=":
                facts.append(proposition(atom.predicate, atom.args))
            elif isinstance(atom, f_expression.Assign) and atom.fluent.symbol != "total-cost":
                name = f"{atom.expression.value}"
                if not str.isdigit(name):
                    facts.append(proposition(name, atom.fluent.args))
        return facts

    def _state_facts(self, lib: Any) -> list[Any]:
        """PddlState's facts from the translated initial state (its true atoms)."""
        from textworld.envs.pddl.logic import Atom

        lib.load_sas(self._sas)
        atoms = (Atom * lib.get_state_size())()
        lib.get_state(atoms)
        facts = [atom.get_fact(self.name2type) for atom in atoms]
        return [fact for fact in facts if not fact.is_negation]

    @staticmethod
    def _entity_infos(state: Any) -> dict[str, Any]:
        """PddlEnv._get_entity_infos, then ALFWorld's names ("mug 1")."""
        from textworld.generator.game import EntityInfo

        infos = {v.name: EntityInfo(v.name, v.type) for fact in state.facts for v in fact.arguments}
        for info in infos.values():
            info.name, info.definite, info.indefinite = info.id, "the", "a"
        for pddl_id, name in display_names(infos).items():
            infos[pddl_id].name = name
        return infos

    def initial_state(self, lib: Any) -> Any:
        """A `PddlState` at the start of the game, with `lib` loaded: what `PddlState(lib, problem, logic)`
        builds, without translating the problem again."""
        from textworld.envs.pddl.logic import PddlState

        state = PddlState.__new__(PddlState)
        state._facts, state._vars_by_name = defaultdict(set), {}
        state._vars_by_type, state._var_counts = defaultdict(set), Counter()
        state._logic, state.downward_lib, state.pddl_problem = self.logic, lib, self.problem
        state.task, state.sas, state._actions, state.name2type = self.task, self.sas, self.fd_actions, self.name2type
        lib.load_sas(self._sas)
        state.add_facts(self.initial_facts)
        return state

    def replan_sas(self) -> bytes:
        """The planner's (optimised) translation, made on first use."""
        if self._replan_sas is None:
            import fast_downward
            from textworld.utils import check_flag

            _, sas = fast_downward.pddl2sas(self.domain, self.problem, verbose=check_flag("TW_PDDL_DEBUG"),
                                            optimize=True)
            self._replan_sas = sas.encode("utf-8")
        return self._replan_sas


class _LRU:
    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[tuple[str, ...], CompiledGame] = OrderedDict()

    def clear(self) -> None:
        self._items.clear()

    def get(self, key: tuple[str, ...], make: Callable[[], CompiledGame]) -> CompiledGame:
        if key in self._items:
            self._items.move_to_end(key)
            return self._items[key]
        value = self._items[key] = make()
        while len(self._items) > self.size:
            self._items.popitem(last=False)
        return value


_CACHE = _LRU(_COMPILED_GAMES)  # a memo of a pure function of the game text: no state a run could depend on


def compile_game(data: Mapping[str, Any], lib: Any) -> CompiledGame:
    """The compiled game for `game.tw-pddl` data (`lib`: a fast-downward library to read the initial state
    with; it is left loaded with this game). Cached per process by the game's text."""
    key = (data["pddl_domain"], data["grammar"], data["pddl_problem"], json.dumps(data.get("walkthrough")))
    with PARSE_LOCK:
        return _CACHE.get(key, lambda: CompiledGame(data, lib))


def clear_compiled_games() -> None:
    """Forget every compiled game (benchmarks measure a game's first load with it)."""
    with PARSE_LOCK:
        _CACHE.clear()


class AlfredEngine:
    """One PDDL game at a time. `load` a game, then `reset` / `step`; `plan()` replans from the current state.

    Each instance holds its own copy of the planner library (TextWorld loads one per environment), so
    instances can run side by side in threads.
    """

    def __init__(self) -> None:
        import fast_downward

        self._lib = fast_downward.load_lib()
        self.game_path: str | None = None
        self.game: CompiledGame | None = None
        self._state: Any = None
        self._actions: list[Any] = []
        self._commands: list[str] = []
        self._last: EngineState | None = None
        self._replan_for: CompiledGame | None = None

    def load(self, game: str | os.PathLike[str] | Mapping[str, Any]) -> None:
        """Load a `game.tw-pddl` (path or its parsed JSON) and give its entities ALFWorld's names."""
        if isinstance(game, Mapping):
            data, self.game_path = dict(game), None
        else:
            self.game_path = os.fspath(game)
            with open(self.game_path, encoding="utf-8") as handle:
                data = json.load(handle)
        missing = {"pddl_domain", "grammar", "pddl_problem"} - set(data)
        if missing:
            raise ValueError(f"{self.game_path or 'game data'}: not a game.tw-pddl (missing {sorted(missing)})")
        self.game = compile_game(data, self._lib)
        self._state, self._last = None, None

    @property
    def walkthrough(self) -> tuple[str, ...] | None:
        """The game file's walkthrough (our generated games store the planner's plan), if it has one."""
        return self.game.walkthrough if self.game else None

    def reset(self) -> EngineState:
        game = self._require(self.game, "load() a game first")
        with PARSE_LOCK:
            self._state = game.initial_state(self._lib)
            context = self._context({}, {})
            return self._observe(game.logic.grammar.derive("#intro#", context), context["facts"])

    def step(self, command: str) -> EngineState:
        last = self._require(self._last, "reset() the game first")
        command = command.strip()
        if command not in self._commands:
            return EngineState(NOTHING_HAPPENS, list(last.admissible_commands), last.won)
        with PARSE_LOCK:
            action = self._actions[self._commands.index(command)]
            self._state.apply(action)
            infos = self.game.entity_infos
            context = self._context({ph.name: infos[var.name] for ph, var in action.mapping.items()}, action.mapping)
            return self._observe(self.game.logic.grammar.derive(action.feedback_rule, context), context["facts"])

    def plan(self) -> list[str]:
        """A shortest plan (player commands) from the current state to the goal; [] when none exists or the
        goal already holds."""
        self._require(self._last, "reset() the game first")
        with PARSE_LOCK:
            if self._replan_for is not self.game:
                self._lib.load_sas_replan(self.game.replan_sas())
                self._replan_for = self.game
            return list(self._state.replan(self.game.entity_infos))

    def close(self) -> None:
        self._lib.cleanup()
        self.game, self._state, self._last, self._replan_for = None, None, None, None

    # ---- what PddlEnv does on reset and step -------------------------------------------------------------
    def _context(self, variables: dict[str, Any], mapping: Mapping[Any, Any]) -> dict[str, Any]:
        facts = list(self._state.facts)
        return {"state": self._state, "facts": facts, "variables": variables, "mapping": mapping,
                "entity_infos": self.game.entity_infos}

    def _observe(self, feedback: str, facts: list[Any]) -> EngineState:
        """PddlEnv._gather_infos: the applicable actions and their commands (sorted, unique)."""
        game, state = self.game, self._state
        won = bool(state.check_goal())
        self._actions = state.all_applicable_actions()
        self._commands = []
        for action in self._actions:
            context = {"state": state, "facts": facts, "mapping": action.mapping, "entity_infos": game.entity_infos,
                       "variables": {ph.name: game.entity_infos[var.name] for ph, var in action.mapping.items()}}
            action.command_template = game.logic.grammar.derive(action.command_template, context)
            self._commands.append(action.format_command(game.names))
        self._last = EngineState(feedback, sorted(set(self._commands)), won)
        return EngineState(feedback, list(self._last.admissible_commands), won)

    @staticmethod
    def _require(value: Any, message: str) -> Any:
        if value is None:
            raise RuntimeError(message)
        return value
