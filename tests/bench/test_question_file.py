"""`bench --prompts FILE.jsonl`: Spec-Bench's and MT-Bench's question files, and hostile ones."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from click.testing import CliRunner

from specchat.bench import BenchError
from specchat.bench.methods import BenchSettings, Method
from specchat.bench.prompts import load_prompts
from specchat.bench.question_file import MAX_LINE_BYTES, read_questions
from specchat.bench.runner import run_bench
from specchat.cli.bench_command import bench
from specchat.engine.session import ChatEngine

# The shapes of the two files as published: MT-Bench's two-turn questions (with a reference on
# some), Spec-Bench's single-turn ones after them.
SPEC_BENCH_LINES = [
    {
        "question_id": 81,
        "category": "writing",
        "turns": ["Write a haiku about the sea.", "Now make it rhyme."],
    },
    {
        "question_id": 111,
        "category": "math",
        "turns": ["What is 2 + 3?", "And times 4?"],
        "reference": ["5", "20"],
    },
    {"question_id": 82, "category": "writing", "turns": ["Write a limerick.", "Shorter, please."]},
    {
        "question_id": "translation_1",
        "category": "translation",
        "turns": ["Translate 'good morning' to German."],
    },
]


def write_lines(path: Path, rows: Sequence[object]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def test_spec_bench_questions_become_prompts_by_their_categories(tmp_path: Path) -> None:
    prompts = read_questions(write_lines(tmp_path / "question.jsonl", SPEC_BENCH_LINES))
    assert [(p.id, p.category, p.quick) for p in prompts] == [
        ("81", "writing", True), ("111", "math", True), ("82", "writing", False),
        ("translation_1", "translation", True),
    ]  # fmt: skip
    first = prompts[0]
    assert first.messages == ({"role": "user", "content": "Write a haiku about the sea."},)
    assert first.follow_ups == ("Now make it rhyme.",)
    assert prompts[3].follow_ups == ()


def test_a_later_turn_follows_the_answer_it_is_given() -> None:
    from specchat.bench.prompts import BenchPrompt

    first = BenchPrompt("81", "writing", ({"role": "user", "content": "one"},), follow_ups=("two", "three"))
    second = first.next_turn("answer one")
    assert second is not None and second.id == "81/t2" and second.turn == 2
    assert [m["content"] for m in second.messages] == ["one", "answer one", "two"]
    assert [m["role"] for m in second.messages] == ["user", "assistant", "user"]
    third = second.next_turn("answer two")
    assert third is not None and third.id == "81/t3" and third.follow_ups == ()
    assert third.next_turn("answer three") is None


def test_quick_categories_and_per_category_read_the_file(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "q.jsonl", SPEC_BENCH_LINES)
    assert [p.id for p in load_prompts(path=path, quick=True)] == ["81", "111", "translation_1"]
    assert [p.id for p in load_prompts(path=path, only=["writing"])] == ["81", "82"]
    assert [p.id for p in load_prompts(path=path, per_category=1)] == ["81", "111", "translation_1"]
    with pytest.raises(BenchError, match="unknown category poetry: use writing, math, translation"):
        load_prompts(path=path, only=["poetry"])


def q(**fields: object) -> bytes:
    """One question line: question_id 1, category qa and one turn unless ``fields`` say otherwise."""
    row = {"question_id": 1, "category": "qa", "turns": ["hi"], **fields}
    return json.dumps(row).encode() + b"\n"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "holds no questions"),
        (b"\n\n  \n", "holds no questions"),
        (q()[:-2] + b"\n", "line 1: not valid JSON"),
        (b"[1, 2]\n", "line 1: a JSON list, not an object"),
        (b"[" * 100_000 + b"\n", "line 1: not valid JSON"),
        (q() + b"\xff\xfe\n", "line 2: not UTF-8"),
        (q().replace(b": 1,", b": NaN,"), "not valid JSON"),
        (q(question_id=1.5), "question_id must be a whole number"),
        (q(question_id=True), "question_id must be a whole number"),
        (q(category="qa\x1b]0;pwned\x07"), "without control characters"),
        (q(category="a\nb"), "without control characters"),
        (q(category="c" * 41), "1 to 40 characters"),
        (q(category="a,b"), "holds a comma"),
        (q(category="All"), "overall row"),
        (q(question_id="x\x9b2J"), "question_id must be 1 to 64"),
        (q(turns=[]), "turns must be a list of one or more"),
        (q(turns="hi"), "turns must be a list"),
        (q(turns=["hi", 3]), "turn 2 must be a non-empty string"),
        (q(turns=["\ud800"]), "unpaired surrogate"),
        (q() + q(turns=["ho"]), "line 2: question_id 1 appears twice"),
        (b"x" * (MAX_LINE_BYTES + 10), "line 1 is longer than 1 MiB"),
    ],
)
def test_a_malformed_or_hostile_file_is_one_clear_error(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "question.jsonl"
    path.write_bytes(content)
    with pytest.raises(BenchError, match=message.replace("(", r"\(")) as caught:
        read_questions(path)
    text = str(caught.value)
    assert "\n" not in text and "\x1b" not in text and "\x9b" not in text and "\x07" not in text


def test_a_byte_order_mark_and_extra_fields_are_fine(tmp_path: Path) -> None:
    path = tmp_path / "q.jsonl"
    row = {"question_id": 7, "category": "qa", "turns": ["hi"], "reference": ["x"], "extra": {"a": 1}}
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(row).encode() + b"\r\n")
    assert [p.id for p in read_questions(path)] == ["7"]


@pytest.mark.parametrize("target", ["/dev/zero", "{tmp}", "{tmp}/missing.jsonl"])
def test_cli_refuses_devices_folders_and_missing_files_in_one_line(tmp_path: Path, target: str) -> None:
    result = CliRunner().invoke(bench, ["--quick", "--prompts", target.format(tmp=tmp_path)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert result.output.startswith("error:")


def test_cli_names_the_bad_line(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "q.jsonl", [SPEC_BENCH_LINES[0], {"question_id": 2}])
    result = CliRunner().invoke(bench, ["--prompts", str(path), "--check"])
    assert result.exit_code == 2, result.output
    assert "line 2: category must be a string" in result.output
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.slow
def test_every_turn_is_a_run_and_the_second_follows_each_methods_own_answer(
    engine: ChatEngine, tmp_path: Path
) -> None:
    path = write_lines(tmp_path / "q.jsonl", SPEC_BENCH_LINES[:2])
    prompts = load_prompts(path=path)
    methods = [Method("plain", "plain"), Method("fixed-2", "specchat", "model", "fixed", 2)]
    seen: list[tuple[str, int]] = []
    records = run_bench(
        engine,
        prompts,
        methods,
        BenchSettings(max_new_tokens=8),
        before_run=lambda p, m: seen.append((p.id, p.turn)),
    )
    assert [(r.prompt_id, r.method) for r in records] == [
        ("81", "plain"), ("81/t2", "plain"), ("81", "fixed-2"), ("81/t2", "fixed-2"),
        ("111", "fixed-2"), ("111/t2", "fixed-2"), ("111", "plain"), ("111/t2", "plain"),
    ]  # fmt: skip
    assert {r.category for r in records} == {"writing", "math"}
    assert ("81/t2", 2) in seen
    # The second turn's prompt held the first turn's reply: its prompt is longer by at least it.
    first, second = records[0], records[1]
    assert second.prompt_tokens > first.prompt_tokens + len(first.token_ids)
    assert all(r.matches_plain for r in records)  # greedy: the same answers, so the same follow-ups


def test_at_t_above_zero_each_method_is_asked_after_its_own_answer(
    engine: ChatEngine, tmp_path: Path
) -> None:
    path = write_lines(tmp_path / "q.jsonl", SPEC_BENCH_LINES[:1])
    methods = [Method("plain", "plain"), Method("fixed-2", "specchat", "model", "fixed", 2)]
    records = run_bench(
        engine, load_prompts(path=path), methods, BenchSettings(max_new_tokens=10, temperature=1.0)
    )
    by_method = {(r.method, r.prompt_id): r for r in records}
    texts = {m.name: by_method[(m.name, "81")].text for m in methods}
    assert texts["plain"] != texts["fixed-2"]  # sampled apart, so their second turns differ
    for method in methods:
        expected = load_prompts(path=path)[0].next_turn(texts[method.name])
        assert expected is not None
        assert by_method[(method.name, "81/t2")].prompt_tokens == len(engine.prompt_ids(expected.messages))


@pytest.mark.slow
def test_a_category_and_id_that_look_like_markup_are_printed_as_they_are(
    pair_folders: tuple[Path, Path], tmp_path: Path, one_thread: None
) -> None:
    target, draft = pair_folders
    rows = [{"question_id": "[/x]", "category": "[/bold]", "turns": ["the cat sat on the mat", "again"]}]
    path = write_lines(tmp_path / "q.jsonl", rows)
    args = [
        "--target", str(target), "--draft", str(draft), "--prompts", str(path), "--max-new-tokens", "4",
        "--gammas", "1", "--no-hf", "--cpu-path", "none", "--detail", "--json", str(tmp_path / "o.json"),
    ]  # fmt: skip
    result = CliRunner().invoke(bench, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "[/bold]" in result.output
    data = json.loads((tmp_path / "o.json").read_text())
    assert {r["prompt_id"] for r in data["records"]} == {"[/x]", "[/x]/t2"}
    assert data["meta"]["prompts_file"] == str(path)


def test_mt_benchs_categories_also_make_spec_benchs_mt_bench_task() -> None:
    from specchat.bench.figures import in_category, report_categories
    from specchat.bench.run_record import RunRecord

    def record(category: str) -> RunRecord:
        return RunRecord("1", category, "plain", "plain", "none", "fixed", 0, 5)

    records = [record(c) for c in ("writing", "coding", "translation")]
    assert report_categories(records) == ["writing", "coding", "translation", "mt_bench"]
    assert [in_category(r, "mt_bench") for r in records] == [True, True, False]
    assert report_categories([record("writing"), record("qa")]) == ["writing", "qa"]  # one is not a task
