"""Interactions: ``Gsm8kInteraction`` (verl's replies and strict scores, worked out by hand), ``BaseInteraction``
defaults, ``load_interactions`` (the shipped file, verl's names, every error path), and one conversation through
the real ``tool_agent`` loop against a scripted server (a stand-in for the model)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import attrs
import pytest
import yaml

import verl.interactions
from verl.agents.base import AgentLoopContext
from verl.agents.tool_agent import ToolAgentLoop
from verl.config import RootConfig
from verl.interactions import BaseInteraction
from verl.interactions.config import load_interactions
from verl.interactions.gsm8k import CORRECT, INCORRECT, Gsm8kInteraction
from verl.testing.distributed import load_script
from verl.testing.tiny import make_tiny_tokenizer

CONFIGS = Path(verl.interactions.__file__).with_name("configs")
SCRIPTED = Path(__file__).parents[1] / "agents" / "scripted.py"


def run(coro):
    return asyncio.run(coro)


def conversation(*assistant: str) -> list[dict]:
    messages = [{"role": "user", "content": "2+3?"}]
    for text in assistant:
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "again"}]
    return messages[:-1]  # the model's turn is last


def test_gsm8k_replies_and_scores():
    inter = Gsm8kInteraction({"name": "gsm8k"})
    instance = run(inter.start_interaction("r1", ground_truth="5", name="gsm8k", query="2+3?"))
    assert instance == "r1"
    # strict: only the number after "####" counts, so a bare "5" is not an answer
    assert run(inter.generate_response(instance, conversation("5"))) == (False, INCORRECT, 0.0, {})
    assert run(inter.generate_response(instance, conversation("5", "#### 4"))) == (False, INCORRECT, 0.0, {})
    assert run(inter.generate_response(instance, conversation("5", "#### 4", "so #### 5"))) == (True, CORRECT, 1.0, {})
    assert run(inter.calculate_score(instance)) == 1.0
    assert CORRECT == "Your response is correct!"
    assert INCORRECT == "Your response is incorrect! You need to reflect on your answer and try again."
    run(inter.finalize_interaction(instance))
    run(inter.finalize_interaction(instance))
    with pytest.raises(KeyError, match="unknown instance 'r1'; call start_interaction first"):
        run(inter.generate_response(instance, conversation("#### 5")))


def test_gsm8k_reads_the_last_assistant_message_and_keeps_instances_apart():
    inter = Gsm8kInteraction({"name": "g"})
    a = run(inter.start_interaction(ground_truth="7"))
    b = run(inter.start_interaction(ground_truth=8))
    assert a != b and len(a) == 36  # uuid4 when no id is given
    messages = [{"role": "assistant", "content": "#### 7"}, {"role": "user", "content": "#### 8"}]
    assert run(inter.generate_response(a, messages))[:3] == (True, CORRECT, 1.0)
    assert run(inter.generate_response(b, messages))[:3] == (False, INCORRECT, 0.0)  # the user's text is not read
    assert run(inter.generate_response(b, [{"role": "user", "content": "#### 8"}]))[0] is False  # no model turn yet
    with pytest.raises(
        ValueError, match=r"interaction 'g': start_interaction needs ground_truth; .*interaction_kwargs"
    ):
        run(inter.start_interaction())


def test_base_interaction_defaults_and_errors():
    class Plain(BaseInteraction):
        pass

    plain = Plain({})
    assert plain.name == "interaction_agent" and repr(plain) == "Plain(name='interaction_agent')"
    assert run(plain.start_interaction("x")) == "x"
    assert run(plain.calculate_score("x")) == 0.0
    assert run(plain.finalize_interaction("x")) is None
    with pytest.raises(NotImplementedError, match="Plain must implement generate_response"):
        run(plain.generate_response("x", []))
    with pytest.raises(TypeError, match="config must be a mapping"):
        Plain(["name"])
    with pytest.raises(TypeError, match="config name must be a non-empty string, got 3"):
        Plain({"name": 3})


def write(tmp_path: Path, content) -> Path:
    path = tmp_path / f"inter_{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
    return path


def test_shipped_file_and_verl_names(tmp_path):
    loaded = load_interactions(CONFIGS / "gsm8k_interaction_config.yaml")
    assert list(loaded) == ["gsm8k"] and isinstance(loaded["gsm8k"], Gsm8kInteraction)
    assert loaded["gsm8k"].config == {"name": "gsm8k"}
    entries = [
        {"class_name": "verl.interactions.gsm8k_interaction.Gsm8kInteraction", "config": {"k": 1}},  # verl's path
        {"name": "second", "class_name": "verl.interactions.gsm8k.Gsm8kInteraction"},
    ]
    loaded = load_interactions(write(tmp_path, {"interaction": entries}))
    assert list(loaded) == ["gsm8k", "second"]  # no name: the class name without "Interaction", lower-case
    assert loaded["gsm8k"].config == {"k": 1, "name": "gsm8k"} and loaded["second"].name == "second"
    assert load_interactions(write(tmp_path, "interaction: []\n")) == {}


G = "verl.interactions.gsm8k.Gsm8kInteraction"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("interaction: [\n", "not valid YAML"),
        ("tools: []\n", "expected a top-level 'interaction:' list"),
        ("interaction: {a: 1}\n", "'interaction' must be a list of entries"),
        ({"interaction": ["gsm8k"]}, "interaction[0] must be a mapping with name, class_name, config"),
        ({"interaction": [{"name": "x"}]}, "interaction[0] has no class_name: give the interaction's dotted class"),
        ({"interaction": [{"class_name": G, "kwargs": {}}]}, "interaction[0]: unknown key(s) ['kwargs']"),
        ({"interaction": [{"class_name": G, "name": ""}]}, "interaction[0].name must be a non-empty string"),
        ({"interaction": [{"class_name": G, "config": [1]}]}, "interaction[0].config must be a mapping"),
        ({"interaction": [{"class_name": "verl.tools.gsm8k.Gsm8kTool"}]}, "is not a subclass of verl.interactions"),
        ({"interaction": [{"class_name": "verl.interactions.gsm8k.Nope"}]}, "has no 'Nope' (BaseInteraction classes"),
        ({"interaction": [{"class_name": "nope_pkg_q.Mod"}]}, "module 'nope_pkg_q' does not import"),
        (
            {"interaction": [{"class_name": G, "config": {"name": 5}}]},
            "",  # the entry's name wins over config.name: no error
        ),
        (
            {"interaction": [{"class_name": G}, {"name": "gsm8k", "class_name": G}]},
            "interaction[1]: interaction name 'gsm8k' is already used by interaction[0]",
        ),
    ],
)
def test_errors_name_file_entry_and_fix(tmp_path, content, message):
    path = write(tmp_path, content)
    if not message:
        assert load_interactions(path)["gsm8k"].name == "gsm8k"
        return
    with pytest.raises(ValueError) as info:
        load_interactions(path)
    assert str(info.value).startswith(str(path)) and message in str(info.value), str(info.value)


def test_constructor_errors_name_the_entry(tmp_path, monkeypatch):
    module = f"intertest_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        "from verl.interactions import BaseInteraction\n\n"
        "class Needy(BaseInteraction):\n    def __init__(self, config):\n        super().__init__(config)\n"
        "        raise ValueError('config needs a rubric')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    path = write(tmp_path, {"interaction": [{"class_name": f"{module}.Needy"}]})
    with pytest.raises(ValueError, match=r"interaction\[0\] \(Needy\): ValueError: config needs a rubric"):
        load_interactions(path)
    with pytest.raises(ValueError, match=r"missing\.yaml: no such file"):
        load_interactions(tmp_path / "missing.yaml")


def test_the_tool_agent_loop_retries_until_the_interaction_says_correct():
    scripted = load_script(SCRIPTED, "interactions_scripted")
    tok = make_tiny_tokenizer()
    server = scripted.ScriptedServer(tok, ["#### 4<|im_end|>", "#### 5<|im_end|>", "#### 6<|im_end|>"])
    cfg = RootConfig().actor_rollout_ref.rollout
    context = AgentLoopContext(
        rollout_config=attrs.evolve(cfg, mode="async"),
        tokenizer=tok,
        client=server,
        response_length=300,
        tools={},
        interactions=load_interactions(CONFIGS / "gsm8k_interaction_config.yaml"),
    )
    row = {
        "raw_prompt": [{"role": "user", "content": "2+3?"}],
        "request_id": "r0",
        "prompt_ids": [],
        "interaction_kwargs": {"name": "gsm8k", "query": "2+3?", "ground_truth": "5"},
    }
    out = run(ToolAgentLoop(context).run({"temperature": 1.0, "seed": 3}, **row))
    assert out.extra_fields["turn_scores"] == [0.0, 1.0]  # wrong, then right: the conversation ends there
    assert len(server.calls) == 2 and out.num_turns == 4  # prompt + 2 model turns + 1 user turn
    sent = tok.decode(server.calls[1]["prompt_ids"], skip_special_tokens=False)
    assert sent.endswith(f"#### 4<|im_end|>\n<|im_start|>user\n{INCORRECT}<|im_end|>\n<|im_start|>assistant\n")
    assert context.interactions["gsm8k"]._instances == {}  # finalized
