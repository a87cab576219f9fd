"""examples/sql eval mode: the three-agent LangGraph graph against a real OpenAI-compatible server on 127.0.0.1.

The server is `agentlightning_torch`'s local backend serving a tiny Qwen2 chat model that memorised the replies of
two questions: the right query for one, a wrong one for the other, so the expected accuracy is exactly 0.5.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("agentlightning_torch")
pytest.importorskip("langgraph")

from transformers import AutoModelForCausalLM, AutoTokenizer

from agentlightning_torch import LocalBackend, serve_backend
from agentlightning_torch.testing import make_tiny_chat_model, memorize

SQL = Path(__file__).resolve().parent.parent / "examples" / "sql"
sys.path.insert(0, str(SQL))
try:
    import sql_eval  # pyright: ignore[reportMissingImports]
    import sql_model  # pyright: ignore[reportMissingImports]
    from sql_agent import checker_prompt, writer_prompt  # pyright: ignore[reportMissingImports]
    from sql_data import database_path, execute, make_tasks, result_feedback  # pyright: ignore[reportMissingImports]
finally:
    sys.path.remove(str(SQL))


def test_eval_scores_a_served_model_with_the_real_graph(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    right, wrong = make_tasks(2, seed=3, databases=[100])
    wrong_sql = wrong.gold.split(" WHERE ")[0] if " WHERE " in wrong.gold else wrong.gold.replace("DESC", "ASC")
    pairs: list[tuple[str, str]] = []
    for task, sql in ((right, right.gold), (wrong, wrong_sql)):
        feedback = result_feedback(execute(database_path(task.db_id), sql))
        pairs += [
            (writer_prompt(task.schema, task.question), sql),
            (checker_prompt(task.question, sql, feedback), "OK"),
        ]
    texts = [text for pair in pairs for text in pair]
    folder = make_tiny_chat_model(
        tmp_path / "model", corpus=texts, vocab_size=600, hidden_size=64, num_layers=2, max_positions=256
    )
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    sequences = []
    for prompt, reply in pairs:
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
        prompt_ids = (
            tokenizer(rendered, add_special_tokens=False)["input_ids"] if isinstance(rendered, str) else rendered
        )
        if not isinstance(prompt_ids, list):
            prompt_ids = list(prompt_ids["input_ids"])
        sequences.append((prompt_ids, [*tokenizer.encode(reply, add_special_tokens=False), eos]))
    assert memorize(model, sequences, steps=150) < 0.05

    tasks_file = tmp_path / "tasks.jsonl"
    tasks_file.write_text("\n".join(json.dumps(t.to_dict()) for t in (right, wrong)) + "\n", encoding="utf-8")
    backend = LocalBackend(model, tokenizer, model_name="tiny-sql", tool_parser="hermes")
    server = serve_backend(backend)
    try:
        code = sql_eval.main(
            ["--base-url", server.base_url, "--model", "tiny-sql", "--tasks", str(tasks_file), "--max-tokens", "64"]
        )
    finally:
        server.stop()
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["tasks"] == 2 and summary["accuracy"] == 0.5, summary
    assert summary["by_shape"] == {right.shape: 1.0, wrong.shape: 0.0}
    assert summary["rewriter_rate"] == 0.0  # the checker said OK to both


def test_eval_refuses_a_bad_task_file_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "tasks.jsonl"
    bad.write_text('{"db_id": "shop_1"}\n', encoding="utf-8")
    assert sql_eval.main(["--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--tasks", str(bad)]) == 2
    assert "tasks.jsonl:1: 'schema' must be a non-empty string" in capsys.readouterr().err


@pytest.mark.skipif(not (SQL / "checkpoint" / "config.json").is_file(), reason="examples/sql/checkpoint not shipped")
def test_path_exactness_measures_the_shipped_warm_start() -> None:
    """The warm start's report: how often each trained agent takes the right path, and completes it once taken."""
    model = AutoModelForCausalLM.from_pretrained(SQL / "checkpoint").eval()
    tokenizer = AutoTokenizer.from_pretrained(SQL / "checkpoint")
    report = sql_model.path_exactness(model, tokenizer, size=10, samples=4)
    keys = ("right_choice", "exact_given_right", "accuracy")
    assert set(report) == {f"{agent}_{key}" for agent in ("writer", "rewriter") for key in keys}
    assert all(0.0 <= value <= 1.0 for value in report.values()), report
    assert 0.0 < report["writer_right_choice"] < 0.6, report  # the right path: a minority choice, left to RL
