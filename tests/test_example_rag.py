"""The RAG example (examples/rag): generated worlds, the FTS5 index, the F1 reward, the MuSiQue loader, and the
Agents SDK agent run by a real runner through the LLM proxy against a scripted model server."""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

RAG = Path(__file__).resolve().parent.parent / "examples" / "rag"
sys.path.insert(0, str(RAG))
try:
    import rag_index  # pyright: ignore[reportMissingImports]
    import rag_task  # pyright: ignore[reportMissingImports]
finally:
    sys.path.remove(str(RAG))


def test_worlds_are_deterministic_and_every_question_follows_its_relations() -> None:
    world = rag_task.make_world(3)
    assert world.tasks == rag_task.make_world(3).tasks
    assert world.tasks != rag_task.make_world(4).tasks
    assert len(world.tasks) == 54 + 54 and len(world.documents) == 54 + 54 + 18
    for task in world.tasks:
        first, second = task.gold_titles
        if task.kind == "director_birthplace":
            assert task.question == f'Where was the director of "{first}" born?'
            assert world.directed_by[first] == second and world.born_in[second] == task.answer
        else:
            assert task.question == f'In which country was "{first}" born?'
            assert world.born_in[first] == second and world.country_of[second] == task.answer
        # each hop's document names the entity the next step needs
        assert f'"{second}"' in world.document(first).text and f'"{task.answer}"' in world.document(second).text
    # balanced: every country answers as many questions, every city as many (no constant answer beats chance)
    for kind in ("birth_country", "director_birthplace"):
        answers = Counter(t.answer for t in world.tasks if t.kind == kind)
        assert len(set(answers.values())) == 1 and len(answers) == (6 if kind == "birth_country" else 18)
    assert len(rag_task.make_world(3, cities_per_country=2, people_per_city=4).tasks) == 2 * 6 * 2 * 4
    with pytest.raises(ValueError, match="people_per_city"):
        rag_task.make_world(3, people_per_city=9)


def test_split_is_disjoint_and_seeded() -> None:
    tasks = rag_task.make_world(0).tasks
    train, val = rag_task.split_tasks(tasks, 0.3, seed=1)
    assert len(val) == 32 and len(train) + len(val) == len(tasks)
    assert not {t.question for t in train} & {t.question for t in val}
    assert (train, val) == rag_task.split_tasks(tasks, 0.3, seed=1)
    with pytest.raises(ValueError, match="between 0 and 1"):
        rag_task.split_tasks(tasks, 1.0, seed=1)


def test_shipped_data_matches_the_generator() -> None:
    world = rag_task.make_world(20261201)
    train = rag_task.read_tasks(RAG / "data" / "train.jsonl")
    val = rag_task.read_tasks(RAG / "data" / "val.jsonl")
    assert sorted(t.question for t in train + val) == sorted(t.question for t in world.tasks)
    assert rag_task.read_corpus(RAG / "data" / "corpus.jsonl") == world.documents


def test_index_ranks_each_hops_document_first(tmp_path: Path) -> None:
    world = rag_task.make_world(5)
    index = rag_index.SearchIndex(rag_index.build_index(world.documents, tmp_path / "index.sqlite"))
    for task in world.tasks:
        for title in task.gold_titles:
            found = index.search(title, k=2)
            assert found and found[0].title == title
    # free text is never an FTS5 syntax error; text without words finds nothing
    assert index.search('"The" AND (film* OR NEAR(x', k=3)
    assert index.search("?!", k=2) == [] and index.search("Zzyzx", k=2) == []
    index.close()


def test_cached_index_is_built_once_per_corpus(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    rag_task.write_jsonl(corpus, [{"title": "Kelb", "text": "a city in Drem."}])
    path = rag_index.cached_index(corpus, tmp_path)
    assert path == rag_index.cached_index(corpus, tmp_path) and path.stat().st_size > 0
    assert [d.title for d in rag_index.SearchIndex(path).search("kelb")] == ["Kelb"]
    rag_task.write_jsonl(corpus, [{"title": "Arvo", "text": "a city in Ostra."}])
    assert rag_index.cached_index(corpus, tmp_path) != path
    assert not list(tmp_path.glob("*.partial"))


@pytest.mark.parametrize(
    ("prediction", "gold", "f1"),
    [
        ("Kelb", "Kelb", 1.0),
        ("kelb.", "Kelb", 1.0),
        ("The Kelb", "Kelb", 1.0),
        ("Port Kelb", "Kelb", 2 / 3),
        ("Ada Moss", "Kelb", 0.0),
        ("", "Kelb", 0.0),
        ("the", "Kelb", 0.0),
    ],
)
def test_token_f1(prediction: str, gold: str, f1: float) -> None:
    assert rag_task.token_f1(prediction, gold) == pytest.approx(f1)


def test_best_f1_takes_aliases() -> None:
    assert rag_task.best_f1("NYC", ["New York City", "NYC"]) == 1.0
    assert rag_task.best_f1("anything", []) == 0.0


def _musique_line(**changes: Any) -> str:
    line: dict[str, Any] = {
        "id": "2hop__1_2",
        "paragraphs": [
            {
                "idx": 0,
                "title": "Lake Ouro",
                "paragraph_text": "Lake Ouro lies in Brenn county.",
                "is_supporting": True,
            },
            {"idx": 1, "title": "Brenn", "paragraph_text": "Brenn county's seat is Dalby.", "is_supporting": True},
            {"idx": 2, "title": "Dalby", "paragraph_text": "Dalby is a market town.", "is_supporting": False},
        ],
        "question": "What is the seat of the county where Lake Ouro is?",
        "question_decomposition": [
            {"id": 1, "question": "Lake Ouro >> located in", "answer": "Brenn", "paragraph_support_idx": 0},
            {"id": 2, "question": "#1 >> seat", "answer": "Dalby", "paragraph_support_idx": 1},
        ],
        "answer": "Dalby",
        "answer_aliases": ["Dalby town"],
        "answerable": True,
    }
    line.update(changes)
    return json.dumps(line)


def test_musique_loader_reads_hand_written_lines(tmp_path: Path) -> None:
    path = tmp_path / "musique.jsonl"
    path.write_text(
        _musique_line()
        + "\n\n"
        + _musique_line(id="2hop__3_4", question="Which town is the seat of Brenn county?", answer="Dalby")
        + "\n"
        + _musique_line(id="2hop__5_6", answerable=False)
        + "\n",
        encoding="utf-8",
    )
    tasks, documents = rag_task.load_musique(path)
    assert [t.task_id for t in tasks] == ["2hop__1_2", "2hop__3_4"]  # the unanswerable twin is skipped
    assert tasks[0].gold_titles == ("Lake Ouro", "Brenn") and tasks[0].aliases == ("Dalby town",)
    assert rag_task.best_f1("dalby town", [tasks[0].answer, *tasks[0].aliases]) == 1.0
    assert [d.title for d in documents] == ["Lake Ouro", "Brenn", "Dalby"]  # shared paragraphs indexed once
    assert len(rag_task.load_musique(path, answerable_only=False)[0]) == 3
    # the loaded tasks round-trip through the task files train.py reads
    rag_task.write_jsonl(tmp_path / "tasks.jsonl", (t.to_dict() for t in tasks))
    assert rag_task.read_tasks(tmp_path / "tasks.jsonl") == tasks


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        (_musique_line(question_decomposition=[{"id": 1, "paragraph_support_idx": 9}]), "names no paragraph"),
        (json.dumps({"question": "q?", "answer": "a", "paragraphs": []}), "without 'question_decomposition'"),
        (_musique_line(paragraphs=[{"idx": 0, "title": "x"}]), "'paragraph_text'"),
    ],
)
def test_musique_loader_names_the_bad_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(_musique_line() + "\n" + line + "\n", encoding="utf-8")
    with pytest.raises(rag_task.DataError, match=message) as caught:
        rag_task.load_musique(path)
    assert str(caught.value).startswith(f"{path}:2:")


def test_task_files_refuse_bad_rows(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps({"question": "Where?", "answer": "Kelb", "gold_titles": []}) + "\n", encoding="utf-8")
    with pytest.raises(rag_task.DataError, match=r":1: 'gold_titles' must be a non-empty list"):
        rag_task.read_tasks(path)
    path.write_text("\n", encoding="utf-8")
    with pytest.raises(rag_task.DataError, match="holds no tasks"):
        rag_task.read_tasks(path)
    with pytest.raises(rag_task.DataError, match="does not exist"):
        rag_task.read_corpus(tmp_path / "missing.jsonl")


async def test_agent_searches_twice_and_is_rewarded_through_runner_and_proxy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real Agents SDK agent in a real runner: proxy records, spans, transitions, annotations, F1 reward."""
    import agentlightning as agl
    from agentlightning import semconv
    from agentlightning.proxy import LLMProxy
    from agentlightning.testing import ScriptedModelServer, ScriptedReply
    from agentlightning.transitions import results_from_store

    world = rag_task.make_world(11)
    corpus = tmp_path / "corpus.jsonl"
    rag_task.write_jsonl(corpus, (d.to_dict() for d in world.documents))
    monkeypatch.setenv("RAG_CORPUS", str(corpus))
    monkeypatch.syspath_prepend(str(RAG))
    import rag_agent  # pyright: ignore[reportMissingImports]

    rag_agent.search_index.cache_clear()
    good, one_hop = world.tasks[0], world.tasks[-1]

    def script(body: dict[str, Any]) -> ScriptedReply:
        messages = body["messages"]
        question = next(m["content"] for m in messages if m["role"] == "user")
        task = good if question == good.question else one_hop
        searches = sum(1 for m in messages if m["role"] == "tool")
        if task is good and searches < 2:
            return ScriptedReply(tool_calls=[{"name": "search", "arguments": {"query": task.gold_titles[searches]}}])
        if task is one_hop and searches < 1:
            return ScriptedReply(tool_calls=[{"name": "search", "arguments": {"query": task.gold_titles[0]}}])
        return ScriptedReply(content=task.answer if task is good else task.gold_titles[1])

    store = agl.SqliteStore(tmp_path / "store.db")
    with ScriptedModelServer(script) as model:
        async with LLMProxy(store, [model.base_url]) as proxy:
            llm = proxy.llm_resource("toy", sampling_parameters={"temperature": 0.0})
            await store.add_resources(agl.Resources(resources_id="v1", items={"llm": llm}))
            first = await store.enqueue_rollout(good.to_dict())
            second = await store.enqueue_rollout(one_hop.to_dict())
            await agl.Runner(rag_agent.rag_agent, store=store, n_workers=2, stop_when_idle=True).arun()
            await proxy.flush()
    results = {}
    for rollout in (first, second):
        (result,) = await results_from_store(store, [rollout.rollout_id])
        spans = await store.query_spans(rollout.rollout_id)
        (note,) = [s for s in spans if s.attributes.get(semconv.SPAN_KIND) == semconv.KIND_ANNOTATION]
        tools = [s for s in spans if s.attributes.get(semconv.SPAN_KIND) == semconv.KIND_TOOL]
        results[rollout.rollout_id] = (result, note.attributes, len(tools))
    result, note, tools = results[first.rollout_id]
    assert result.final_reward == 1.0 and len(result.transitions) == 3 and tools == 2
    assert all(t.prompt_token_ids and t.response_token_ids and t.agent_name == "researcher" for t in result.transitions)
    prefix = semconv.ANNOTATION_PREFIX
    assert (note[prefix + "searches"], note[prefix + "hop1_hit"], note[prefix + "hop2_hit"]) == (2, True, True)
    result, note, tools = results[second.rollout_id]
    assert result.final_reward == 0.0 and len(result.transitions) == 2 and tools == 1
    assert (note[prefix + "searches"], note[prefix + "hop1_hit"], note[prefix + "hop2_hit"]) == (1, True, False)


def _rag_module(name: str) -> Any:
    sys.path.insert(0, str(RAG))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(RAG))


def test_transcripts_follow_the_agents_protocol_and_render_as_one_sequence() -> None:
    import random

    from agentlightning_torch import tokenize_conversation, train_chat_tokenizer

    rag_model = _rag_module("rag_model")
    world = rag_task.make_world(8)
    index = rag_index.SearchIndex.in_memory(world.documents)
    film = next(t for t in world.tasks if t.kind == "director_birthplace")
    person = next(t for t in world.tasks if t.kind == "birth_country")
    rng = random.Random(0)
    tokenizer = train_chat_tokenizer(
        rag_model.tokenizer_texts(worlds=1), vocab_size=400, chat_template=rag_model.CHAT_TEMPLATE
    )
    for task in (film, person):
        expected = {
            "two_hops": (2, task.answer),
            "one_hop": (1, task.gold_titles[1]),
            "no_search": (0, task.gold_titles[0]),  # the guess: the name asked about, always wrong
        }
        for behaviour, (searches, answer) in expected.items():
            record = rag_model.conversation(index, task, behaviour, rng)
            messages = record["messages"]
            assert messages[0] == {"role": "system", "content": rag_model.INSTRUCTIONS}
            assert record["tools"] == [rag_model.SEARCH_TOOL]
            queries = [
                json.loads(m["tool_calls"][0]["function"]["arguments"])["query"]
                for m in messages
                if m.get("tool_calls")
            ]
            assert queries == list(task.gold_titles[:searches])
            assert messages[-1] == {"role": "assistant", "content": answer}
            # the template renders every turn as a continuation of the previous one: one training sequence
            (example,) = tokenize_conversation(tokenizer, record)
            text = str(tokenizer.decode(list(example.input_ids)))
            assert text.startswith("<|im_start|>system\n" + rag_model.INSTRUCTIONS + "\nTools: search(query)<|im_end|>")
        wrong = rag_model.conversation(index, task, "wrong_second", rng)["messages"]
        second = json.loads(wrong[4]["tool_calls"][0]["function"]["arguments"])["query"]
        assert second != task.gold_titles[1]
    with pytest.raises(ValueError, match="unknown behaviour"):
        rag_model.conversation(index, film, "guess", rng)


def test_fast_transcript_ids_equal_the_templates_and_the_choice_to_search_is_a_minority() -> None:
    """The warm start's transcripts: slot-filled ids equal the chat template's for every transcript; the loss on
    the first (decision) token makes ``<tool_call>`` a quarter of the first-token targets, while most of a batch
    trains the search path."""
    import random

    from agentlightning_torch import tokenize_conversation, train_chat_tokenizer

    rag_model = _rag_module("rag_model")
    tokenizer = train_chat_tokenizer(
        rag_model.tokenizer_texts(worlds=1), vocab_size=1024, chat_template=rag_model.CHAT_TEMPLATE
    )
    encoder = rag_model.TranscriptEncoder(tokenizer)
    rng = random.Random(1)
    for seed in (11, 12):
        world = rag_task.make_world(seed)
        index = rag_index.SearchIndex.in_memory(world.documents)
        for task in world.tasks[:40]:
            for behaviour in rag_model.BEHAVIOURS:
                record = rag_model.conversation(index, task, behaviour, rng)
                assert encoder.encode(record) == tokenize_conversation(tokenizer, record)[0]
    assert len(encoder._shapes) <= 2 * len(rag_model.BEHAVIOURS) + 2  # pyright: ignore[reportPrivateUsage]
    config = rag_model.WarmStartConfig(batch_size=200, search_share=0.6, search_choice=0.25)
    batch = next(rag_model.warm_batches(tokenizer, config, random.Random(0)))
    call = tokenizer.convert_tokens_to_ids("<tool_call>")
    first_targets = [e.input_ids[e.loss_mask.index(1)] for e in batch]
    decisions = [t for t in first_targets if t == call or t in encoder.name_ids.values()]  # the others start "\n"
    searching = sum(call in e.input_ids for e in batch) / len(batch)
    chosen = sum(d == call for d in decisions) / len(decisions)
    assert 0.5 < searching < 0.7 and 0.15 < chosen < 0.35, (searching, chosen)


def test_eval_scores_any_openai_compatible_endpoint(
    capsys: pytest.CaptureFixture[str], example_script: Callable[[str, str], Any]
) -> None:
    """``train.py eval --base-url --model``: the agent against a plain endpoint (no store, no proxy), one JSON line."""
    from agentlightning.testing import ScriptedModelServer, ScriptedReply

    val = {t.question: t for t in rag_task.read_tasks(RAG / "data" / "val.jsonl")[:4]}
    asked: list[str] = []

    def script(body: dict[str, Any]) -> ScriptedReply:
        asked.append(body["model"])
        task = val[next(m["content"] for m in body["messages"] if m["role"] == "user")]
        searches = sum(1 for m in body["messages"] if m["role"] == "tool")
        if task.kind == "director_birthplace" and searches < 2:  # these are answered right, the others with hop 1
            return ScriptedReply(tool_calls=[{"name": "search", "arguments": {"query": task.gold_titles[searches]}}])
        if searches < 1:
            return ScriptedReply(tool_calls=[{"name": "search", "arguments": {"query": task.gold_titles[0]}}])
        return ScriptedReply(content=task.answer if searches == 2 else task.gold_titles[1])

    train = example_script("rag", "train")  # not `import train`: calc has a train.py too
    with ScriptedModelServer(script, emit_token_ids=False) as server:
        code = train.main(["eval", "--base-url", server.base_url, "--model", "served-model", "--eval-size", "4"])
    assert code == 0 and set(asked) == {"served-model"}
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    right = sum(1 for t in val.values() if t.kind == "director_birthplace") / 4
    assert figures["tasks"] == 4 and figures["f1"] == pytest.approx(right)
    assert figures["searches"] == pytest.approx(1 + right) and figures["hop1_hit"] == 1.0
    assert figures["hop2_hit"] == figures["all_hops_hit"] == pytest.approx(right)
