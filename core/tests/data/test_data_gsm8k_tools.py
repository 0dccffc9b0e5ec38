"""Multi-turn GSM8K rows offering a tool (``prepare_gsm8k(tool=...)``): verl's columns and values, the system
prompt's schema and example call, the parquet round trip through the dataset, errors, and (with the real
SmolLM2 tokenizer when it is already converted) that every shipped prompt fits the example config."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest
import yaml

from verl.data import gsm8k_tools
from verl.data.gsm8k import default_source_dir, iter_gsm8k_rows, prepare_gsm8k

INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "gsm8k_grpo_tool_smollm2_cpu.yaml"

# verl's schemas as its YAML files write them (examples/sglang_multiturn/config/tool_config/, commit 3467d90ae).
VERL_SCHEMAS = {
    "code_interpreter": {
        "name": "code_interpreter",
        "description": "A tool for executing code.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The code to execute."}},
            "required": ["code"],
        },
    },
    "calc_gsm8k_reward": {
        "name": "calc_gsm8k_reward",
        "description": "A tool for calculating the reward of gsm8k. (1.0 if parsed answer is correct, 0.0 if parsed "
        "answer is incorrect or not correctly parsed)",
        "parameters": {
            "type": "object",
            "properties": {
                "answer": {
                    "type": "string",
                    "description": "The model's answer to the GSM8K math problem, must be a digits",
                }
            },
            "required": ["answer"],
        },
    },
}


@pytest.fixture
def source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    train = [
        {"question": "What is 2+2?", "answer": "2+2=<<2+2=4>>4\n#### 4"},
        {"question": "Big?", "answer": "Lots.\n#### 1,234"},
    ]
    (src / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
    (src / "test.jsonl").write_text(json.dumps({"question": "Owe?", "answer": "Debt.\n#### -5"}) + "\n")
    return src


def test_calc_rows_are_verl_multiturn_rows(source: Path, tmp_path: Path) -> None:
    paths = prepare_gsm8k(tmp_path / "out", source, tool="calc_gsm8k_reward")
    rows = pq.read_table(paths["train"]).to_pylist()
    assert [list(r) for r in rows] == [
        ["data_source", "agent_name", "prompt", "ability", "reward_model", "extra_info"]
    ] * 2
    first = rows[1]
    system = first["prompt"][0]
    assert system["role"] == "system"
    assert first["prompt"][1] == {"role": "user", "content": "Big? " + INSTRUCTION}
    assert first == {
        "data_source": "openai/gsm8k",
        "agent_name": "tool_agent",
        "prompt": [system, {"role": "user", "content": "Big? " + INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "1234"},
        "extra_info": {
            "split": "train",
            "index": 1,
            "answer": "Lots.\n#### 1,234",
            "question": "Big?",
            "need_tools_kwargs": True,
            "tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "1234"}}},
            "interaction_kwargs": {"name": "gsm8k", "query": "Big? " + INSTRUCTION, "ground_truth": "1234"},
        },
    }
    test = pq.read_table(paths["test"]).to_pylist()
    assert test[0]["extra_info"]["tools_kwargs"] == {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "-5"}}}
    assert test[0]["extra_info"]["split"] == "test"


def test_code_interpreter_rows_have_no_create_kwargs(source: Path, tmp_path: Path) -> None:
    paths = prepare_gsm8k(tmp_path / "out", source, tool="code_interpreter")
    row = pq.read_table(paths["train"]).to_pylist()[0]
    assert row["agent_name"] == "tool_agent"
    assert row["reward_model"] == {"style": "rule", "ground_truth": "4"}
    extra = row["extra_info"]
    # parquet cannot store an empty struct: null stands for "no per-sample arguments"
    assert extra["tools_kwargs"] == {"code_interpreter": {"create_kwargs": None}}
    assert extra["need_tools_kwargs"] is True
    assert extra["interaction_kwargs"] == {
        "name": "gsm8k",
        "query": "What is 2+2? " + INSTRUCTION,
        "ground_truth": "4",
    }
    assert "calc_gsm8k_reward" not in row["prompt"][0]["content"]


def test_plain_rows_are_unchanged_by_the_tool_option(source: Path, tmp_path: Path) -> None:
    plain = list(iter_gsm8k_rows(source / "train.jsonl", "train"))
    tool = list(iter_gsm8k_rows(source / "train.jsonl", "train", tool="code_interpreter"))
    for p, t in zip(plain, tool, strict=True):
        assert "agent_name" not in p and set(p["extra_info"]) == {"split", "index", "answer", "question"}
        assert t["prompt"][1:] == p["prompt"]
        assert {k: t["extra_info"][k] for k in p["extra_info"]} == p["extra_info"]
        assert (t["reward_model"], t["data_source"], t["ability"]) == (
            p["reward_model"],
            p["data_source"],
            p["ability"],
        )


def _tools_block(text: str) -> dict:
    match = re.search(r"<tools>\n(.*)\n</tools>", text, re.DOTALL)
    assert match is not None, text
    return json.loads(match.group(1))


@pytest.mark.parametrize("tool", ["code_interpreter", "calc_gsm8k_reward"])
def test_system_prompt_offers_the_schema_and_one_valid_call(tool: str) -> None:
    text = gsm8k_tools.system_prompt(tool)
    assert _tools_block(text) == VERL_SCHEMAS[tool]
    calls = re.findall(r"<tool_call>(.*?)</tool_call>", text, re.DOTALL)
    assert len(calls) == 1, "exactly one worked example"
    call = json.loads(calls[0])
    assert set(call) == {"name", "arguments"} and call["name"] == tool
    params = VERL_SCHEMAS[tool]["parameters"]
    assert set(call["arguments"]) == set(params["required"]) == set(params["properties"])
    assert all(isinstance(v, str) for v in call["arguments"].values())  # every argument is typed string
    assert "\n" not in calls[0]  # one line, as the text says


def test_both_examples_show_the_same_made_up_problem() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(gsm8k_tools.EXAMPLE_ARGUMENTS["code_interpreter"]["code"], {})  # valid Python that prints a number
    assert out.getvalue() == gsm8k_tools.EXAMPLE_ARGUMENTS["calc_gsm8k_reward"]["answer"] + "\n"


SHIPPED_CONFIGS = {"code_interpreter": "code_interpreter_config.yaml", "calc_gsm8k_reward": "gsm8k_tool_config.yaml"}


@pytest.mark.parametrize("tool", ["code_interpreter", "calc_gsm8k_reward"])
def test_schema_matches_the_shipped_tool_config(tool: str) -> None:
    path = REPO / "core" / "src" / "verl" / "tools" / "configs" / SHIPPED_CONFIGS[tool]
    if not path.is_file():
        pytest.skip(f"{path} is not shipped yet (verl.tools)")
    entries = yaml.safe_load(path.read_text())["tools"]
    schemas = [e["tool_schema"] for e in entries if e["tool_schema"]["function"]["name"] == tool]
    assert len(schemas) == 1
    shipped = schemas[0]["function"]
    ours = gsm8k_tools.TOOL_SCHEMAS[tool]["function"]
    # the model is told the shipped tool's name and arguments; the description may be worded differently
    assert ours["name"] == shipped["name"]
    assert ours["parameters"]["required"] == shipped["parameters"]["required"]
    assert set(ours["parameters"]["properties"]) == set(shipped["parameters"]["properties"])
    for name, prop in ours["parameters"]["properties"].items():
        assert prop["type"] == shipped["parameters"]["properties"][name]["type"], name


def test_rows_load_through_the_dataset(source: Path, tmp_path: Path) -> None:
    from verl.data.dataset import RLHFDataset, collate_to_dicts
    from verl.testing.tiny import make_tiny_tokenizer

    paths = prepare_gsm8k(tmp_path / "out", source, tool="calc_gsm8k_reward")
    ds = RLHFDataset(str(paths["train"]), make_tiny_tokenizer(), SimpleNamespace(max_prompt_length=1024))
    tensors, extra = collate_to_dicts([ds[0], ds[1]])
    system = gsm8k_tools.system_prompt("calc_gsm8k_reward")
    user = "What is 2+2? " + INSTRUCTION
    # char-level ChatML: <|im_start|> role \n content <|im_end|> \n per message, then <|im_start|>assistant\n
    expected = (1 + len("system\n") + len(system) + 1 + 1) + (1 + len("user\n") + len(user) + 1 + 1) + 1 + 10
    assert int(tensors["attention_mask"][0].sum()) == expected
    assert list(extra["agent_name"]) == ["tool_agent", "tool_agent"]
    assert extra["raw_prompt"][0] == [{"role": "system", "content": system}, {"role": "user", "content": user}]
    assert extra["extra_info"][1]["tools_kwargs"]["calc_gsm8k_reward"]["create_kwargs"] == {"ground_truth": "1234"}


@pytest.mark.parametrize("bad", ["calculator", "", "Code_Interpreter"])
def test_unknown_tool_is_refused_before_writing(source: Path, tmp_path: Path, bad: str) -> None:
    with pytest.raises(ValueError, match="code_interpreter, calc_gsm8k_reward.*--tools") as err:
        prepare_gsm8k(tmp_path / "out", source, tool=bad)
    assert repr(bad) in str(err.value)
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match="not a GSM8K tool"):
        next(iter_gsm8k_rows(source / "missing.jsonl", "train", tool=bad))  # refused before the file is opened


def test_default_out_dirs() -> None:
    assert gsm8k_tools.default_out_dir(None) == Path("~/data/gsm8k")
    assert gsm8k_tools.default_out_dir("code_interpreter") == Path("~/data/gsm8k_tool_code_interpreter")
    assert gsm8k_tools.default_out_dir("calc_gsm8k_reward") == Path("~/data/gsm8k_tool_calc_gsm8k_reward")
    with pytest.raises(ValueError, match="--tools"):
        gsm8k_tools.default_out_dir("nope")


def _smollm2_tokenizer():
    from verl.models import cache_root, load_tokenizer

    folder = cache_root() / "models" / "smollm2-135m-instruct"
    if not (folder / "tokenizer.json").is_file():
        pytest.skip(f"SmolLM2 is not converted in {folder} (verl train or resolve_model_path converts it once)")
    return load_tokenizer(str(folder))


def _longest_prompt(tokenizer, tool: str) -> int:
    src = default_source_dir()
    longest = 0
    for split in ("train", "test"):
        rows = iter_gsm8k_rows(src / f"{split}.jsonl.gz", split, tool=tool)
        texts = [tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows]
        longest = max([longest, *map(len, tokenizer(texts, add_special_tokens=False)["input_ids"])])
    return longest


@pytest.mark.slow
def test_every_shipped_prompt_fits_the_example_config() -> None:
    tokenizer = _smollm2_tokenizer()
    limit = yaml.safe_load(EXAMPLE.read_text())["data"]["max_prompt_length"]
    longest = _longest_prompt(tokenizer, "code_interpreter")
    assert longest <= limit
    assert limit - longest < 32, "max_prompt_length is far above the longest prompt: shrink it"
    # the calc_gsm8k_reward schema is wordier: the module docstring tells its users to use 448
    assert _longest_prompt(tokenizer, "calc_gsm8k_reward") <= 448
