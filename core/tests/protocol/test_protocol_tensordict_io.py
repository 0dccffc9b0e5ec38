"""DataProto.to_tensordict / DataProto.from_tensordict (verl/protocol.py, verl/utils/tensordict_utils.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

from verl.protocol import DataProto, DataProtoError, DataProtoKeyError, DataProtoTypeError


def agent_loop_batch() -> DataProto:
    # The shape of verl's agent-loop output (its test_to_tensordict_agent_loop_scenario).
    return DataProto.from_dict(
        tensors={"prompts": torch.tensor([[1, 2, 3], [4, 5, 6]]), "responses": torch.tensor([[7, 8], [9, 10]])},
        non_tensors={
            "data_source": ["lighteval/MATH", "lighteval/MATH"],
            "num_turns": np.array([2, 4], dtype=np.int32),
            "acc": np.array([1.0, 0.0]),
            "turn_scores": [[], [0.5, 0.8]],
            "reward_extra_info": [{"acc": 1.0}, {"acc": 0.0}],
            "raw_prompt": [[{"content": "Compute 4 @ 2", "role": "user"}], [{"content": "8 @ 7", "role": "user"}]],
        },
        meta_info={"global_steps": 42, "temperature": 0.7},
    )


def test_to_tensordict_layout():
    data = agent_loop_batch()
    td = data.to_tensordict()
    assert tuple(td.batch_size) == (2,)
    assert td.get("prompts") is data.batch["prompts"]  # shared, not copied
    assert isinstance(td.get("turn_scores"), NonTensorStack)
    assert isinstance(td.get("global_steps"), NonTensorData)
    assert td["global_steps"] == 42 and td["temperature"] == 0.7
    assert list(td["data_source"]) == ["lighteval/MATH", "lighteval/MATH"]
    assert list(td["turn_scores"][0]) == [] and list(td["turn_scores"][1]) == [0.5, 0.8]
    assert dict(td["reward_extra_info"][1]) == {"acc": 0.0}
    assert dict(td["raw_prompt"][0][0]) == {"content": "Compute 4 @ 2", "role": "user"}
    assert "prompts" in data.batch.keys() and "turn_scores" not in data.batch.keys()  # self unchanged


def test_round_trip_keeps_every_field_and_typed_arrays():
    data = agent_loop_batch()
    back = DataProto.from_tensordict(data.to_tensordict())
    assert sorted(back.batch.keys()) == ["prompts", "responses"]
    assert torch.equal(back.batch["prompts"], data.batch["prompts"])
    assert back.meta_info == {"global_steps": 42, "temperature": 0.7}
    assert set(back.non_tensor_batch) == set(data.non_tensor_batch)
    for key, original in data.non_tensor_batch.items():
        assert back.non_tensor_batch[key].tolist() == original.tolist(), key
    # numpy-scalar columns come back typed (verl returns object arrays); Python-object columns stay object.
    assert back.non_tensor_batch["num_turns"].dtype == np.int32
    assert back.non_tensor_batch["acc"].dtype == np.float64
    assert back.non_tensor_batch["turn_scores"].dtype == object and back.non_tensor_batch["turn_scores"].shape == (2,)


def test_from_tensordict_as_verls_get_tensordict_builds_it():
    # verl: tu.get_tensordict({"obs": tensor, "labels": [...]}, {"name": "abdce"}) -> DataProto.from_tensordict
    td = TensorDict(
        {
            "obs": torch.tensor([1, 2, 3]),
            "labels": NonTensorStack.from_list([NonTensorData(x) for x in ["a", "b", "c"]]),
            "name": NonTensorData("abdce"),
        },
        batch_size=[3],
    )
    caller_meta = {"extra": 1}
    data = DataProto.from_tensordict(td, meta_info=caller_meta)
    assert data.non_tensor_batch["labels"].tolist() == ["a", "b", "c"]
    assert data.batch["obs"].tolist() == [1, 2, 3]
    assert data.meta_info == {"extra": 1, "name": "abdce"}
    assert caller_meta == {"extra": 1}  # verl writes into the caller's dict; here it is copied


def test_round_trip_without_batch_and_with_an_empty_batch():
    arrays_only = DataProto.from_dict(non_tensors={"uid": ["x", "y"]}, meta_info={"k": "v"})
    back = DataProto.from_tensordict(arrays_only.to_tensordict())
    assert back.batch is None and back.non_tensor_batch["uid"].tolist() == ["x", "y"] and back.meta_info == {"k": "v"}
    empty_keys = DataProto(batch=TensorDict({}, batch_size=[5]))
    back = DataProto.from_tensordict(empty_keys.to_tensordict())
    assert len(back) == 5 and len(back.batch.keys()) == 0


def test_round_trip_keeps_jagged_nested_tensors_and_nested_keys():
    jagged = torch.nested.as_nested_tensor([torch.arange(3.0), torch.arange(5.0)], layout=torch.jagged)
    data = DataProto.from_dict(tensors={"resp": jagged, "x": torch.zeros(2)})
    data.batch["sub", "y"] = torch.tensor([7, 8])
    back = DataProto.from_tensordict(data.to_tensordict())
    assert [t.tolist() for t in back.batch["resp"].unbind()] == [[0.0, 1.0, 2.0], [0.0, 1.0, 2.0, 3.0, 4.0]]
    assert back.batch["sub", "y"].tolist() == [7, 8]


def test_key_collisions_and_bad_input_raise():
    data = DataProto.from_dict(tensors={"a": torch.zeros(2)}, non_tensors={"u": ["x", "y"]}, meta_info={"a": 1})
    with pytest.raises(DataProtoKeyError, match=r"meta_info keys \['a'\] are also batch or non_tensor_batch keys"):
        data.to_tensordict()
    with pytest.raises(DataProtoTypeError, match="expects a TensorDict, got dict"):
        DataProto.from_tensordict({"a": torch.zeros(2)})
    with pytest.raises(DataProtoError, match="num_batch_dims=1 only"):
        DataProto.from_tensordict(TensorDict({"a": torch.zeros(2, 3)}, batch_size=[2, 3]), num_batch_dims=2)
