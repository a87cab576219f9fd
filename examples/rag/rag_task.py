"""The two-hop question task of the RAG example: a generated knowledge base, its questions, and the reward.

A *world* is a small encyclopedia drawn from a seed: films, people, cities and countries, linked by three relations
(a film is directed by a person, a person is born in a city, a city lies in a country), each entity rendered as one
short document (``title`` + ``text``). Every question needs two documents, found one after the other::

    Where was the director of "Nightjar" born?     Nightjar -> its director -> where they were born
    In which country was "Ada" born?               Ada -> her birth city -> its country

A task records the titles of the two gold documents (``gold_titles``, hop 1 then hop 2), so the retrieval hit rate of
an episode can be measured. The reward is the token F1 of the final answer against the gold answer (SQuAD's
normalisation: lower case, no punctuation, no articles).

`load_musique` reads MuSiQue's JSONL format (``paragraphs``, ``question``, ``answer``, ``question_decomposition``)
from local files into the same tasks and documents, for users who have the data set.
"""

from __future__ import annotations

import json
import random
import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "CITIES",
    "COUNTRIES",
    "FILMS",
    "PEOPLE",
    "DataError",
    "Document",
    "RagTask",
    "World",
    "best_f1",
    "load_musique",
    "make_world",
    "normalize_answer",
    "read_corpus",
    "read_tasks",
    "split_tasks",
    "token_f1",
    "write_jsonl",
]

PEOPLE = (
    "Ada", "Bo", "Cal", "Dara", "Eli", "Fen", "Gil", "Hana", "Ivo", "Juno", "Kit", "Lena", "Milo", "Nia",
    "Otto", "Pia", "Quin", "Rae", "Sol", "Tess", "Uma", "Vik", "Wes", "Yara", "Zed", "Abel", "Bria", "Cora",
    "Dov", "Edda", "Finn", "Greta", "Hugo", "Iris", "Jonas", "Kira", "Lars", "Mara", "Nils", "Olga", "Pavel",
    "Rosa", "Sven", "Tilda", "Ugo", "Vera", "Wim", "Yuri", "Zora", "Anouk", "Bruno", "Clara", "Dirk", "Elsa",
)  # fmt: skip
FILMS = (
    "Afterglow", "Backwater", "Bluebell", "Brimstone", "Cinder", "Clockwork", "Cobalt", "Crossroads",
    "Daybreak", "Driftwood", "Ember", "Evergreen", "Firefly", "Foxglove", "Gaslight", "Goldfinch", "Hailstorm",
    "Harvest", "Hinterland", "Ironwood", "Juniper", "Kingfisher", "Lodestar", "Marigold", "Meridian", "Midnight",
    "Moonrise", "Nightjar", "Nocturne", "Oakheart", "Outpost", "Quicksilver", "Rainfall", "Redwing", "Riverbend",
    "Saltmarsh", "Sandglass", "Shoreline", "Skylark", "Snowdrift", "Starling", "Stormcrow", "Sunburst",
    "Thistle", "Thunderhead", "Tidewater", "Undertow", "Wildfire", "Willow", "Windmill", "Wintergreen",
    "Wolfsbane", "Zephyr", "Lantern",
)  # fmt: skip
CITIES = (
    "Kelb", "Arvo", "Toran", "Mesk", "Pirin", "Sulo", "Varda", "Nox", "Olm",
    "Brisa", "Calder", "Dunmor", "Essen", "Fallow", "Gresk", "Hollin", "Ivra", "Jorn",
)  # fmt: skip
COUNTRIES = ("Norland", "Ostra", "Calva", "Drem", "Sarn", "Tovia")
"""The names a world draws from: single words, each a single token of the example's tokenizer."""


class DataError(ValueError):
    """A task or corpus file that cannot be read; the message names the file, the line and what is wrong."""


@dataclass(frozen=True)
class Document:
    """One document of the search index.

    Attributes:
        title: The entity's name (searched with a heavier weight than the text).
        text: One or two short sentences about it.
    """

    title: str
    text: str

    def to_dict(self) -> dict[str, str]:
        """A JSON-friendly form (one line of ``corpus.jsonl``)."""
        return {"title": self.title, "text": self.text}


@dataclass(frozen=True)
class RagTask:
    """One multi-hop question.

    Attributes:
        question: What the agent is asked.
        answer: The gold answer.
        gold_titles: Titles of the documents each hop needs, in order.
        aliases: Other answers that count as right (MuSiQue's ``answer_aliases``).
        kind: Which question template made it (``director_birthplace``, ``birth_country`` or ``musique``).
        task_id: A stable id.
    """

    question: str
    answer: str
    gold_titles: tuple[str, ...]
    aliases: tuple[str, ...] = ()
    kind: str = "musique"
    task_id: str = ""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly form: what a rollout's ``input`` holds and one line of ``train.jsonl``."""
        return {
            "id": self.task_id,
            "question": self.question,
            "answer": self.answer,
            "aliases": list(self.aliases),
            "gold_titles": list(self.gold_titles),
            "kind": self.kind,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RagTask:
        """The inverse of `to_dict` (``aliases`` and ``kind`` optional).

        Raises:
            ValueError: A field is missing or has the wrong type.
        """
        question, answer, titles = data.get("question"), data.get("answer"), data.get("gold_titles")
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"'question' must be a non-empty string, got {question!r}")
        if not isinstance(answer, str) or not answer.strip():
            raise ValueError(f"'answer' must be a non-empty string, got {answer!r}")
        if not isinstance(titles, list) or not titles or not all(isinstance(t, str) for t in titles):
            raise ValueError(f"'gold_titles' must be a non-empty list of strings, got {titles!r}")
        aliases = data.get("aliases") or []
        if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
            raise ValueError(f"'aliases' must be a list of strings, got {aliases!r}")
        return cls(
            question=question,
            answer=answer,
            gold_titles=tuple(titles),
            aliases=tuple(aliases),
            kind=str(data.get("kind") or "musique"),
            task_id=str(data.get("id") or ""),
        )


@dataclass
class World:
    """A generated encyclopedia: its relations, documents and every question it supports.

    Attributes:
        directed_by: Film title -> director's name.
        born_in: Person's name -> city.
        country_of: City -> country.
        documents: One document per entity (films, people, cities).
        tasks: Every two-hop question of the world, in a fixed order.
    """

    directed_by: dict[str, str] = field(default_factory=dict[str, str])
    born_in: dict[str, str] = field(default_factory=dict[str, str])
    country_of: dict[str, str] = field(default_factory=dict[str, str])
    documents: list[Document] = field(default_factory=list[Document])
    tasks: list[RagTask] = field(default_factory=list[RagTask])

    def document(self, title: str) -> Document:
        """The document titled ``title``.

        Raises:
            KeyError: No such document.
        """
        for document in self.documents:
            if document.title == title:
                return document
        raise KeyError(title)


def film_document(title: str, director: str) -> Document:
    """The document of a film."""
    return Document(title, f'a film directed by "{director}".')


def person_document(name: str, city: str) -> Document:
    """The document of a person."""
    return Document(name, f'a person born in "{city}".')


def city_document(city: str, country: str) -> Document:
    """The document of a city."""
    return Document(city, f'a city in "{country}".')


def make_world(seed: int, *, cities_per_country: int = 3, people_per_city: int = 3) -> World:
    """Draw a balanced world from ``seed``: every country has as many cities and every city as many people.

    ``len(COUNTRIES) * cities_per_country`` cities, ``people_per_city`` people born in each, one film directed by
    each person: every country answers as many ``birth_country`` questions and every city as many
    ``director_birthplace`` questions, so no constant answer beats chance. Names are single words from fixed
    vocabularies (`PEOPLE`, `FILMS`, `CITIES`, `COUNTRIES`), quoted in the texts, so a name is the same token in
    a question, a document and a search; different seeds give different facts over the same names.

    Raises:
        ValueError: More cities or people than the vocabularies hold, or fewer than one.
    """
    cities = len(COUNTRIES) * cities_per_country
    people = cities * people_per_city
    if min(cities_per_country, people_per_city) < 1 or cities > len(CITIES) or people > len(PEOPLE):
        raise ValueError(
            f"cities_per_country must be 1..{len(CITIES) // len(COUNTRIES)} and people_per_city at least 1 with at"
            f" most {len(PEOPLE)} people in all; got {cities_per_country} and {people_per_city}"
        )
    rng = random.Random(seed)
    chosen_cities = rng.sample(CITIES, cities)
    world = World()
    world.country_of = {city: COUNTRIES[i // cities_per_country] for i, city in enumerate(chosen_cities)}
    chosen_people = rng.sample(PEOPLE, people)
    world.born_in = {person: chosen_cities[i // people_per_city] for i, person in enumerate(chosen_people)}
    films = rng.sample(FILMS, people)
    world.directed_by = dict(zip(films, rng.sample(chosen_people, people), strict=True))
    world.documents = [
        *(film_document(film, director) for film, director in world.directed_by.items()),
        *(person_document(person, city) for person, city in world.born_in.items()),
        *(city_document(city, country) for city, country in world.country_of.items()),
    ]
    for film, director in world.directed_by.items():
        world.tasks.append(
            RagTask(
                question=f'Where was the director of "{film}" born?',
                answer=world.born_in[director],
                gold_titles=(film, director),
                kind="director_birthplace",
                task_id=f"w{seed}-film-{film}",
            )
        )
    for person, city in world.born_in.items():
        world.tasks.append(
            RagTask(
                question=f'In which country was "{person}" born?',
                answer=world.country_of[city],
                gold_titles=(person, city),
                kind="birth_country",
                task_id=f"w{seed}-person-{person}",
            )
        )
    rng.shuffle(world.documents)
    rng.shuffle(world.tasks)
    return world


def split_tasks(tasks: Sequence[RagTask], held_out: float, seed: int) -> tuple[list[RagTask], list[RagTask]]:
    """Shuffle ``tasks`` with ``seed`` and split off a ``held_out`` fraction; the two parts share no question.

    Held-out questions ask about entities no training question starts from (hop 1 differs); documents they read
    at hop 2 may also be read by training questions, as in any shared encyclopedia.

    Raises:
        ValueError: ``held_out`` is not in (0, 1) or either part would be empty.
    """
    if not 0 < held_out < 1:
        raise ValueError(f"held_out must be between 0 and 1, got {held_out}")
    order = list(tasks)
    random.Random(seed).shuffle(order)
    cut = round(len(order) * held_out)
    if cut == 0 or cut == len(order):
        raise ValueError(f"{len(order)} tasks cannot be split {1 - held_out:.2f}/{held_out:.2f}")
    return order[cut:], order[:cut]


# ----- reward --------------------------------------------------------------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD's answer normalisation: lower case, punctuation and articles removed, whitespace collapsed."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION)).split())


def token_f1(prediction: str, gold: str) -> float:
    """Token-level F1 between a predicted and a gold answer after `normalize_answer` (0 when either is empty)."""
    predicted, expected = normalize_answer(prediction).split(), normalize_answer(gold).split()
    common = sum((Counter(predicted) & Counter(expected)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


def best_f1(prediction: str, answers: Iterable[str]) -> float:
    """The best `token_f1` of ``prediction`` against any of ``answers`` (the gold answer and its aliases)."""
    return max((token_f1(prediction, answer) for answer in answers), default=0.0)


# ----- files ---------------------------------------------------------------------------------------------------


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> int:
    """Write ``rows`` as JSON lines; returns how many."""
    lines = [json.dumps(row, ensure_ascii=False) for row in rows]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return len(lines)


def _json_lines(path: Path) -> Iterable[tuple[int, Any]]:
    if not path.is_file():
        raise DataError(f"file {str(path)!r} does not exist")
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as error:
            raise DataError(f"{path}:{number}: not valid JSON ({error.msg} at column {error.colno})") from None


def read_tasks(path: Path) -> list[RagTask]:
    """Tasks from a JSONL file written by `write_jsonl` of `RagTask.to_dict` rows.

    Raises:
        DataError: The file is missing, a line is not a valid task, or it holds none.
    """
    tasks: list[RagTask] = []
    for number, row in _json_lines(path):
        if not isinstance(row, dict):
            raise DataError(f"{path}:{number}: expected a JSON object with 'question', 'answer' and 'gold_titles'")
        try:
            tasks.append(RagTask.from_dict(row))  # pyright: ignore[reportUnknownArgumentType]
        except ValueError as error:
            raise DataError(f"{path}:{number}: {error}") from None
    if not tasks:
        raise DataError(f"task file {str(path)!r} holds no tasks")
    return tasks


def read_corpus(path: Path) -> list[Document]:
    """Documents from a JSONL file of ``{"title": ..., "text": ...}`` lines.

    Raises:
        DataError: The file is missing, a line is not a document, or it holds none.
    """
    documents: list[Document] = []
    for number, row in _json_lines(path):
        title = row.get("title") if isinstance(row, dict) else None
        text = row.get("text") if isinstance(row, dict) else None  # pyright: ignore[reportUnknownMemberType]
        if not isinstance(title, str) or not isinstance(text, str) or not (title.strip() or text.strip()):
            raise DataError(f'{path}:{number}: expected {{"title": str, "text": str}}, got {row!r}')
        documents.append(Document(title, text))
    if not documents:
        raise DataError(f"corpus file {str(path)!r} holds no documents")
    return documents


def load_musique(path: Path, *, answerable_only: bool = True) -> tuple[list[RagTask], list[Document]]:
    """Tasks and documents from a MuSiQue JSONL file (``musique_ans_v1.0_dev.jsonl`` and the like).

    Each line holds ``id``, ``paragraphs`` (``idx``, ``title``, ``paragraph_text``, ``is_supporting``),
    ``question``, ``answer``, ``answer_aliases`` and ``question_decomposition`` (one entry per hop, with the
    ``paragraph_support_idx`` of the paragraph that answers it). Every question's paragraphs go into one corpus
    (each distinct title + text once), and a task's ``gold_titles`` are its hops' supporting paragraphs in order.

    Args:
        path: The JSONL file.
        answerable_only: Skip lines whose ``answerable`` is false (MuSiQue-Full's unanswerable twins).

    Raises:
        DataError: The file is missing, a line lacks a field or points at a paragraph it does not hold, or no
            answerable question is left.
    """
    tasks: list[RagTask] = []
    documents: dict[tuple[str, str], Document] = {}
    for number, row in _json_lines(path):
        where = f"{path}:{number}"
        if not isinstance(row, dict):
            raise DataError(f"{where}: expected a JSON object")
        item: dict[str, Any] = row  # pyright: ignore[reportUnknownVariableType]
        for key in ("paragraphs", "question", "answer", "question_decomposition"):
            if key not in item:
                raise DataError(f"{where}: MuSiQue line without {key!r}")
        if answerable_only and item.get("answerable") is False:
            continue
        paragraphs: dict[int, Document] = {}
        for paragraph in item["paragraphs"]:
            try:
                document = Document(str(paragraph["title"]), str(paragraph["paragraph_text"]))
                paragraphs[int(paragraph["idx"])] = document
            except (KeyError, TypeError, ValueError):
                raise DataError(f"{where}: a paragraph needs 'idx', 'title' and 'paragraph_text'") from None
            documents.setdefault((document.title, document.text), document)
        gold: list[str] = []
        for hop, step in enumerate(item["question_decomposition"], start=1):
            index = step.get("paragraph_support_idx") if isinstance(step, dict) else None
            if not isinstance(index, int) or index not in paragraphs:
                raise DataError(f"{where}: hop {hop}'s paragraph_support_idx {index!r} names no paragraph of the line")
            gold.append(paragraphs[index].title)
        try:
            tasks.append(
                RagTask.from_dict(
                    {
                        "id": item.get("id", f"line{number}"),
                        "question": item["question"],
                        "answer": item["answer"],
                        "aliases": item.get("answer_aliases") or [],
                        "gold_titles": gold,
                    }
                )
            )
        except ValueError as error:
            raise DataError(f"{where}: {error}") from None
    if not tasks:
        raise DataError(f"{str(path)!r} holds no answerable MuSiQue question")
    return tasks, list(documents.values())
