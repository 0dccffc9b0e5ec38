"""The reward-model worker: scores (prompt, response) pairs with a sequence-classification model.

``reward_model.enable=true`` with ``reward_model.model.path``: the model is loaded with
``AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)`` (verl's discriminative
RM; the legacy ``verl/workers/fsdp_workers.py:RewardModelWorker`` loads the same checkpoints with
``AutoModelForTokenClassification``, which shares the ``score`` head). The score of a sequence is
the head's output at its last valid token, written as ``rm_scores`` ``(bs, resp_len)`` at the
last valid *response* token (0 elsewhere; an empty response gets no score, as verl's
``_expand_to_token_level`` slices it away).

Own chat template (verl ``RewardModelWorker._switch_chat_template``): when the RM's tokenizer differs
from the policy's (vocabulary or chat template), each row is re-tokenised: the policy's response is
decoded (its EOS text removed), appended to the row's ``raw_prompt`` messages as the assistant turn,
rendered with the RM tokenizer's chat template and tokenised without extra special tokens; the left
side is truncated to ``data.max_prompt_length + data.max_response_length`` tokens (the score is read at
the end). With the same tokenizer the policy's token ids are scored as they are.
"""

from __future__ import annotations

from typing import Any

import torch

from verl.controller import Dispatch, Worker, register


def same_tokenization(a: Any, b: Any) -> bool:
    """True when tokenizers ``a`` and ``b`` have the same vocabulary and chat template (no re-tokenising)."""
    return a.get_vocab() == b.get_vocab() and getattr(a, "chat_template", None) == getattr(b, "chat_template", None)


def sequence_scores(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Scalar score of each row at its last valid token, ``(bs,)`` float32.

    Args:
        model: a HF ``*ForSequenceClassification`` with ``num_labels=1`` (backbone under
            ``model.base_model_prefix`` and a ``score`` head, as ``GenericForSequenceClassification``).
        input_ids, attention_mask: ``(bs, seq)``, any padding side; positions come from the mask
            (``clip(cumsum - 1, 0)``), so padded and unpadded rows score the same.

    Raises:
        ValueError: the model has no ``score`` head over a ``base_model_prefix`` backbone.
    """
    backbone = getattr(model, getattr(model, "base_model_prefix", ""), None)
    head = getattr(model, "score", None)
    if backbone is None or head is None:
        raise ValueError(
            f"reward model {type(model).__name__} has no backbone + `score` head (a transformers "
            "*ForSequenceClassification of a decoder LM, e.g. LlamaForSequenceClassification, is needed)"
        )
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    hidden = backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).last_hidden_state
    per_token = head(hidden)[..., 0].float()
    idx = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    last = (idx * attention_mask.bool()).argmax(-1)  # rightmost valid position
    return per_token.gather(1, last.unsqueeze(1)).squeeze(1)


class RewardModelWorker(Worker):
    """One rank of the reward-model role (forward only).

    Args:
        config: :class:`verl.config.RootConfig` with ``reward_model.enable`` and ``reward_model.model.path``.
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config
        self.model = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> dict[str, Any]:
        """Load the reward model and both tokenizers; returns a summary (``switch_chat_template``).

        Raises:
            ValueError: ``reward_model.model.path`` is unset or cannot be loaded as a sequence classifier.
        """
        from transformers import AutoModelForSequenceClassification

        from verl.models import load_tokenizer, resolve_model_path
        from verl.plugins import resolve_platform
        from verl.workers.critic import resolve_model_folder

        cfg = self.config
        rm = cfg.reward_model.model
        if not rm.path:
            raise ValueError("reward_model.enable=true needs reward_model.model.path (a sequence-classification model)")
        platform = resolve_platform(cfg.trainer.device)
        if platform.device_count() > 0 and platform.name != "cpu":
            platform.set_device(self.local_rank % platform.device_count())
        platform.configure_allocator()
        self.device = platform.torch_device()
        path = resolve_model_folder(rm.path)
        try:
            model = AutoModelForSequenceClassification.from_pretrained(
                str(path), num_labels=1, dtype=torch.float32, trust_remote_code=rm.trust_remote_code
            )
        except (OSError, ValueError, KeyError) as exc:
            raise ValueError(
                f"cannot load reward_model.model.path={str(path)!r} as AutoModelForSequenceClassification "
                f"(num_labels=1): {exc}"
            ) from exc
        self.model = model.to(self.device).eval().requires_grad_(False)
        self.rm_tokenizer = load_tokenizer(rm.tokenizer_path or path, trust_remote_code=rm.trust_remote_code)
        arr = cfg.actor_rollout_ref.model
        self.policy_tokenizer = load_tokenizer(
            arr.tokenizer_path or resolve_model_path(arr.path), trust_remote_code=arr.trust_remote_code
        )
        self.switch_chat_template = not same_tokenization(self.rm_tokenizer, self.policy_tokenizer)
        self.max_length = int(cfg.data.max_prompt_length + cfg.data.max_response_length)
        return {"rank": self.rank, "model_path": str(path), "switch_chat_template": self.switch_chat_template}

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_rm_score(self, data: Any) -> Any:
        """``rm_scores`` ``(bs, resp_len)`` float32: the RM score at each row's last valid response token.

        Args:
            data: DataProto with ``input_ids``, ``attention_mask`` ``(bs, P+R)``, ``responses`` ``(bs, R)``, and
                ``non_tensor_batch["raw_prompt"]`` (chat messages) when the chat template is switched.

        Raises:
            KeyError: the template must be switched but ``raw_prompt`` is missing (set ``data.return_raw_chat``).
        """
        from verl.protocol import DataProto

        if self.model is None:
            raise RuntimeError("this worker has no reward model: call init_model first")
        responses = data.batch["responses"]
        bs, resp_len = responses.shape
        resp_lens = data.batch["attention_mask"][:, -resp_len:].sum(-1)
        micro = self.config.reward_model.micro_batch_size_per_gpu or max(1, bs)
        scores = torch.zeros(bs, dtype=torch.float32)
        with torch.no_grad():
            for start in range(0, bs, micro):
                rows = list(range(start, min(bs, start + micro)))
                ids, mask = self._inputs(data, rows)
                scores[rows] = sequence_scores(self.model, ids.to(self.device), mask.to(self.device)).cpu()
        rm_scores = torch.zeros(bs, resp_len, dtype=torch.float32)
        has = resp_lens > 0
        rows = torch.arange(bs)[has]
        rm_scores[rows, resp_lens[has] - 1] = scores[has]
        return DataProto.from_dict(tensors={"rm_scores": rm_scores})

    def _inputs(self, data: Any, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.switch_chat_template:
            return data.batch["input_ids"][rows], data.batch["attention_mask"][rows]
        if "raw_prompt" not in data.non_tensor_batch:
            raise KeyError(
                "the reward model's tokenizer differs from the policy's, so rows are re-rendered with its chat "
                "template from non_tensor_batch['raw_prompt']; it is missing: set data.return_raw_chat=true"
            )
        src, dst = self.policy_tokenizer, self.rm_tokenizer
        resp_len = data.batch["responses"].shape[1]
        seqs = []
        for i in rows:
            n = int(data.batch["attention_mask"][i, -resp_len:].sum())
            text = src.decode(data.batch["responses"][i, :n].tolist(), skip_special_tokens=False)
            if src.eos_token:
                text = text.replace(src.eos_token, "")
            chat = [*list(data.non_tensor_batch["raw_prompt"][i]), {"role": "assistant", "content": text}]
            rendered = dst.apply_chat_template(chat, tokenize=False, add_generation_prompt=False)
            seqs.append(dst(rendered, add_special_tokens=False)["input_ids"][-self.max_length :])
        width = max(len(s) for s in seqs)
        pad = dst.pad_token_id if dst.pad_token_id is not None else 0
        ids = torch.full((len(seqs), width), pad, dtype=torch.long)
        mask = torch.zeros(len(seqs), width, dtype=torch.long)
        for j, s in enumerate(seqs):  # right-padded; positions come from the mask
            ids[j, : len(s)] = torch.tensor(s, dtype=torch.long)
            mask[j, : len(s)] = 1
        return ids, mask
