"""A deterministic closed world written as encyclopedia passages, with questions over it.

The world holds fictional countries, cities, organisations, people and works, linked by relations
(a person is born in a city and works for an organisation; an organisation has a founder and a seat; a work
has a creator). A share of people and organisations get a *twin*: a different entity whose name differs by
one letter, so retrieval must match names exactly. Each entity is described by one to three passages, each
stating different facts, so a question's gold passage is a specific one.

Questions come in three kinds (`data.QUESTION_KINDS`) and record their hop chain: the lookups an expert
makes, each with a query that finds the passage stating the fact. The same `WorldConfig` always gives the
same corpus and questions (only `random.Random(seed)` is used, never hash order).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from agentgym_opsd.environments.search_qa.data import SPLITS, Hop, Passage, QADataset, Question

__all__ = ["WorldConfig", "SIZE_PRESETS", "generate_dataset", "preset"]

_ONSETS = ("b", "br", "c", "d", "dr", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "st", "t", "th", "v",
           "w", "z", "gr", "kl", "sh", "tr")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "io", "ou", "y")
_CODAS = ("", "", "n", "r", "l", "s", "th", "nd", "rk", "m", "x", "ck")
_OCCUPATIONS = ("painter", "chemist", "novelist", "architect", "composer", "astronomer", "engineer", "sculptor",
                "historian", "physician", "cartographer", "poet", "botanist", "mathematician", "playwright")
_INDUSTRIES = ("shipping", "publishing", "mining", "textile", "banking", "railway", "brewing", "optics",
               "printing", "glassworks", "insurance", "telegraph")
_ORG_SUFFIXES = ("Company", "Society", "Institute", "Guild", "Works", "Foundation", "Holdings", "Academy")
_WORK_KINDS = ("novel", "opera", "symphony", "film", "play", "atlas", "treatise", "poem cycle")
_ADJECTIVES = ("Silent", "Crimson", "Hollow", "Distant", "Golden", "Broken", "Northern", "Quiet", "Amber",
               "Restless", "Winter", "Pale", "Iron", "Hidden", "Last", "Seventh")
_NOUNS = ("Harbor", "Orchard", "Lantern", "Meridian", "Tide", "Garden", "Bell", "Compass", "River", "Archive",
          "Tower", "Voyage", "Mirror", "Season", "Crown", "Letter")
_FILLER = (
    "Contemporary accounts describe the period as one of rapid change.",
    "Records from that time survive in several regional archives.",
    "Later historians have revisited these events more than once.",
    "Little else is documented about this in surviving sources.",
    "The details were summarised in a short article published decades later.",
    "Local newspapers covered the matter only briefly.",
)


@dataclass(frozen=True)
class WorldConfig:
    """Size and seed of a generated world. Passage count is about 3.2 x `num_people`."""

    num_people: int = 500
    """People, including twins; cities, organisations, works and countries scale from it."""
    twin_fraction: float = 0.2
    """Share of people and organisations that get a near-identical-name twin."""
    questions_per_kind: int = 200
    """Questions of each kind before the train/test split."""
    test_fraction: float = 0.25
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_people < 12:
            raise ValueError(f"WorldConfig.num_people must be >= 12 (a world needs a few of each entity), got "
                             f"{self.num_people}")
        if not 0.0 <= self.twin_fraction <= 0.5:
            raise ValueError(f"WorldConfig.twin_fraction must be in [0, 0.5], got {self.twin_fraction}")
        if self.questions_per_kind < 2:
            raise ValueError(f"WorldConfig.questions_per_kind must be >= 2, got {self.questions_per_kind}")
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(f"WorldConfig.test_fraction must be in (0, 1), got {self.test_fraction}")


SIZE_PRESETS: dict[str, WorldConfig] = {
    "tiny": WorldConfig(num_people=40, questions_per_kind=12),         # ~130 passages: unit tests
    "small": WorldConfig(num_people=400, questions_per_kind=200),      # ~1.3k passages: default env
    "10k": WorldConfig(num_people=3_100, questions_per_kind=500),
    "100k": WorldConfig(num_people=31_000, questions_per_kind=1_000),
    "1m": WorldConfig(num_people=312_000, questions_per_kind=1_000),  # >= 1M passages: benchmarks
}


def preset(name: str) -> WorldConfig:
    """The `WorldConfig` of a size preset (`tiny`, `small`, `10k`, `100k`, `1m`)."""
    if name not in SIZE_PRESETS:
        raise ValueError(f"unknown corpus size {name!r}; choose one of {', '.join(SIZE_PRESETS)}")
    return SIZE_PRESETS[name]


# ---- entities ------------------------------------------------------------------------------------------
@dataclass
class _Entity:
    name: str
    year: int                      # birth year (people), founding year (cities, organisations), year (works)
    passages: dict[str, str]       # section -> passage id, filled when passages are written


@dataclass
class _Country(_Entity):
    pass


@dataclass
class _City(_Entity):
    country: str = ""


@dataclass
class _Org(_Entity):
    industry: str = ""
    seat: int = 0                  # city index
    founder: int = -1              # person index


@dataclass
class _Person(_Entity):
    occupation: str = ""
    birthplace: int = 0            # city index
    employer: int = 0              # organisation index


@dataclass
class _Work(_Entity):
    kind: str = ""
    creator: int = 0               # person index


class _Names:
    """Unique pronounceable names; `twin` changes one letter of an existing name."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def _word(self, syllables: int) -> str:
        r = self.rng
        parts = [r.choice(_ONSETS) + r.choice(_VOWELS) for _ in range(syllables)]
        return ("".join(parts) + r.choice(_CODAS)).capitalize()

    def fresh(self, make: Callable[[], str]) -> str:
        while True:
            name = make()
            if name not in self.used:
                self.used.add(name)
                return name

    def person(self) -> str:
        return self.fresh(lambda: f"{self._word(self.rng.randint(1, 2))} {self._word(self.rng.randint(2, 3))}")

    def place(self) -> str:
        return self.fresh(lambda: self._word(self.rng.randint(2, 3)))

    def twin(self, name: str, word: int) -> str | None:
        """The same name with one vowel of word number `word` replaced (None when every variant is taken)."""
        start = sum(len(w) + 1 for w in name.split(" ")[:word])
        end = start + len(name.split(" ")[word])
        positions = [i for i in range(start, end) if name[i] in "aeiou"]
        self.rng.shuffle(positions)
        for i in positions:
            for vowel in "aeiou":
                candidate = name[:i] + vowel + name[i + 1:]
                if candidate not in self.used:
                    self.used.add(candidate)
                    return candidate
        return None


@dataclass
class _World:
    countries: list[_Country]
    cities: list[_City]
    orgs: list[_Org]
    people: list[_Person]
    works: list[_Work]


def _build_world(cfg: WorldConfig, rng: random.Random) -> _World:
    names = _Names(rng)
    n = cfg.num_people
    countries = [_Country(names.place(), 0, {}) for _ in range(max(6, n // 100))]
    cities = [_City(names.place(), rng.randint(900, 1700), {}, country=rng.choice(countries).name)
              for _ in range(max(8, n // 8))]
    orgs: list[_Org] = []
    for _ in range(max(6, n // 6)):
        if orgs and rng.random() < cfg.twin_fraction and (twin := names.twin(orgs[-1].name, 0)) is not None:
            base = twin  # a near-identical name for a different organisation
        else:
            base = names.fresh(lambda: f"{names._word(2)} {rng.choice(_INDUSTRIES).capitalize()} "
                                       f"{rng.choice(_ORG_SUFFIXES)}")
        orgs.append(_Org(base, rng.randint(1700, 1900), {}, industry=rng.choice(_INDUSTRIES),
                         seat=rng.randrange(len(cities))))
    people: list[_Person] = []
    while len(people) < n:
        twin = names.twin(people[-1].name, 1) if people and rng.random() < cfg.twin_fraction else None
        people.append(_Person(twin or names.person(), rng.randint(1750, 1960), {},
                              occupation=rng.choice(_OCCUPATIONS), birthplace=rng.randrange(len(cities)),
                              employer=rng.randrange(len(orgs))))
    for org in orgs:
        org.founder = rng.randrange(len(people))
    works = [_Work(names.fresh(lambda: f"The {rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)} of {names._word(2)}"),
                   0, {}, kind=rng.choice(_WORK_KINDS), creator=rng.randrange(len(people)))
             for _ in range(max(6, n // 3))]
    for work in works:
        work.year = people[work.creator].year + rng.randint(20, 60)
    return _World(countries, cities, orgs, people, works)


# ---- passages ------------------------------------------------------------------------------------------
def _write_passages(world: _World, rng: random.Random) -> list[Passage]:
    passages: list[Passage] = []

    def add(entity: _Entity, section: str, text: str) -> None:
        pid = str(len(passages))
        entity.passages[section] = pid
        passages.append(Passage(pid, entity.name, f"{text} {rng.choice(_FILLER)}"))

    cities, orgs, people = world.cities, world.orgs, world.people
    for c in cities:
        add(c, "overview", f"{c.name} is a city in the country of {c.country}. It lies within {c.country} "
                           f"and was founded in {c.year}.")
        add(c, "history", f"The city of {c.name} grew around its market square; its charter dates from "
                          f"{c.year}, and its old quarter still keeps the original street plan.")
    for o in orgs:
        seat = cities[o.seat].name
        add(o, "overview", f"{o.name} is a {o.industry} organisation headquartered in {seat}. "
                           f"{o.name} was founded in {o.year}.")
        add(o, "history", f"{o.name} was founded by {people[o.founder].name}, who led it through its first "
                          f"years in the {o.industry} trade.")
    created: dict[int, list[_Work]] = {}
    for w in world.works:
        created.setdefault(w.creator, []).append(w)
    for i, p in enumerate(people):
        add(p, "bio", f"{p.name} (born {p.year}) was a {p.occupation}. {p.name} was born in the city of "
                      f"{cities[p.birthplace].name} in {p.year}.")
        add(p, "career", f"{p.name} worked for {orgs[p.employer].name} as a {p.occupation}; the employer of "
                         f"{p.name} was {orgs[p.employer].name}.")
        if i in created:
            titles = ", ".join(f"the {w.kind} {w.name}" for w in created[i])
            add(p, "works", f"{p.name} is remembered for {titles}.")
    for w in world.works:
        creator = people[w.creator].name
        add(w, "overview", f"{w.name} is a {w.kind} created by {creator} in {w.year}. The creator of "
                           f"{w.name} was {creator}.")
    return passages


# ---- questions -----------------------------------------------------------------------------------------
def _hop(entity: _Entity, relation: str, section: str, query_words: str, value: str) -> Hop:
    return Hop(entity=entity.name, relation=relation, query=f"{entity.name} {query_words}",
               passage_id=entity.passages[section], value=value)


class _QuestionMaker:
    def __init__(self, world: _World, rng: random.Random) -> None:
        self.w, self.rng = world, rng

    # single hop: one fact of one entity
    def single_hop(self) -> tuple[str, str, list[Hop]]:
        w, r = self.w, self.rng
        choice = r.randrange(6)
        p = r.choice(w.people)
        if choice == 0:
            city = w.cities[p.birthplace].name
            return f"In which city was {p.name} born?", city, [_hop(p, "birthplace", "bio", "born in city", city)]
        if choice == 1:
            return (f"In what year was {p.name} born?", str(p.year),
                    [_hop(p, "birth_year", "bio", "born year", str(p.year))])
        if choice == 2:
            org = w.orgs[p.employer].name
            return f"Which organisation did {p.name} work for?", org, [_hop(p, "employer", "career", "worked for", org)]
        if choice == 3:
            o = r.choice(w.orgs)
            founder = w.people[o.founder].name
            return f"Who founded {o.name}?", founder, [_hop(o, "founder", "history", "founded by", founder)]
        if choice == 4:
            c = r.choice(w.cities)
            return (f"In which country is the city of {c.name}?", c.country,
                    [_hop(c, "country", "overview", "city in the country of", c.country)])
        wk = r.choice(w.works)
        creator = w.people[wk.creator].name
        return f"Who created the {wk.kind} {wk.name}?", creator, [_hop(wk, "creator", "overview", "created by", creator)]

    # multi hop: each step looks up the entity the previous step found
    def multi_hop(self) -> tuple[str, str, list[Hop]]:
        w, r = self.w, self.rng
        choice = r.randrange(5)
        p = r.choice(w.people)
        city, org = w.cities[p.birthplace], w.orgs[p.employer]
        if choice == 0:
            return (f"In which country was {p.name} born?", city.country,
                    [_hop(p, "birthplace", "bio", "born in city", city.name),
                     _hop(city, "country", "overview", "city in the country of", city.country)])
        if choice == 1:
            founder = w.people[org.founder].name
            return (f"Who founded the organisation that {p.name} worked for?", founder,
                    [_hop(p, "employer", "career", "worked for", org.name),
                     _hop(org, "founder", "history", "founded by", founder)])
        if choice == 2:
            seat = w.cities[org.seat]
            return (f"In which country is the headquarters of the organisation that {p.name} worked for?",
                    seat.country,
                    [_hop(p, "employer", "career", "worked for", org.name),
                     _hop(org, "headquarters", "overview", "headquartered in", seat.name),
                     _hop(seat, "country", "overview", "city in the country of", seat.country)])
        wk = r.choice(w.works)
        creator = w.people[wk.creator]
        birth_city = w.cities[creator.birthplace]
        if choice == 3:
            return (f"In which city was the creator of the {wk.kind} {wk.name} born?", birth_city.name,
                    [_hop(wk, "creator", "overview", "created by", creator.name),
                     _hop(creator, "birthplace", "bio", "born in city", birth_city.name)])
        employer = w.orgs[creator.employer]
        return (f"In what year was the employer of the creator of {wk.name} founded?", str(employer.year),
                [_hop(wk, "creator", "overview", "created by", creator.name),
                 _hop(creator, "employer", "career", "worked for", employer.name),
                 _hop(employer, "founding_year", "overview", "founded in year", str(employer.year))])

    # comparison: two lookups, then compare the values
    def comparison(self) -> tuple[str, str, list[Hop]]:
        w, r = self.w, self.rng
        if r.random() < 0.5:
            a, b = r.sample(w.people, 2)
            while a.year == b.year:
                a, b = r.sample(w.people, 2)
            winner = a if a.year < b.year else b
            return (f"Who was born earlier, {a.name} or {b.name}?", winner.name,
                    [_hop(a, "birth_year", "bio", "born year", str(a.year)),
                     _hop(b, "birth_year", "bio", "born year", str(b.year))])
        x, y = r.sample(w.orgs, 2)
        while x.year == y.year:
            x, y = r.sample(w.orgs, 2)
        first = x if x.year < y.year else y
        return (f"Which was founded first, {x.name} or {y.name}?", first.name,
                [_hop(x, "founding_year", "overview", "founded in year", str(x.year)),
                 _hop(y, "founding_year", "overview", "founded in year", str(y.year))])


def _make_questions(world: _World, cfg: WorldConfig, rng: random.Random) -> dict[str, list[Question]]:
    maker = _QuestionMaker(world, rng)
    splits: dict[str, list[Question]] = {s: [] for s in SPLITS}
    for kind in ("single_hop", "multi_hop", "comparison"):
        seen: set[str] = set()
        made: list[tuple[str, str, list[Hop]]] = []
        attempts = 0
        while len(made) < cfg.questions_per_kind and attempts < 20 * cfg.questions_per_kind:
            attempts += 1
            item = getattr(maker, kind)()
            if item[0] not in seen:  # no question text twice (a test question must not be in train)
                seen.add(item[0])
                made.append(item)
        num_test = max(1, round(len(made) * cfg.test_fraction))
        for j, (text, answer, hops) in enumerate(made):
            split = "test" if j < num_test else "train"
            qid = f"{split}-{kind}-{j}"
            splits[split].append(Question(qid, text, (answer,), kind, tuple(hops)))
    return splits


def generate_dataset(cfg: WorldConfig | str = "small") -> QADataset:
    """Generate the corpus and the train/test questions of a world (same config, same output)."""
    cfg = preset(cfg) if isinstance(cfg, str) else cfg
    rng = random.Random(cfg.seed)
    world = _build_world(cfg, rng)
    passages = _write_passages(world, random.Random(cfg.seed + 1))
    questions = _make_questions(world, cfg, random.Random(cfg.seed + 2))
    return QADataset(passages=passages, questions=questions)
