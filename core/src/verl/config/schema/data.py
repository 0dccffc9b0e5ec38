"""``data.*``: prompt dataset, lengths and batch sizes (verl ``legacy_data.yaml``)."""

from __future__ import annotations

from typing import Literal

import attrs

from verl.config.schema._fields import FreeDict, fld, free_dict

Truncation = Literal["error", "left", "right", "middle"]
# A single path is accepted and stored as a 1-tuple, like verl which takes a str or a list.
FileList = tuple[str, ...] | None


@attrs.frozen(kw_only=True)
class DataConfig:
    """Dataset files, prompt/response lengths and the prompt batch size.

    Deviation from verl: ``dataloader_num_workers`` defaults to 0 (load in the driver
    process): rows are read, not tokenised, in the loader, and each worker process costs a
    torch import (~300 MiB) on small CPU machines.
    """

    train_files: FileList = fld(None, doc="training parquet/jsonl file(s) in verl's column format")
    val_files: FileList = fld(None, doc="validation parquet/jsonl file(s); null = no validation set")
    prompt_key: str = fld("prompt", doc="column holding the chat messages of the prompt")
    reward_fn_key: str = fld("data_source", doc="column that selects the reward function")
    image_key: str = fld(
        "images",
        doc="column holding a row's images (verl's multimodal rows); a row with images is refused: "
        "vision-language prompts are not built yet",
    )
    max_prompt_length: int = fld(512, doc="prompt length in tokens; prompts are left-padded to it")
    max_response_length: int = fld(512, doc="response length in tokens; responses are right-padded to it")
    train_batch_size: int = fld(1024, doc="prompts per training step (before repeating by rollout.n)")
    gen_batch_size: int | None = fld(
        None,
        doc="prompts the loader hands out per generation round; null = train_batch_size. Differs from it only "
        "with algorithm.filter_groups.enable (DAPO rounds of this many prompts until train_batch_size are kept)",
    )
    val_batch_size: int | None = fld(None, doc="prompts per validation batch; null = the whole validation set")
    return_raw_chat: bool = fld(True, doc="keep the raw chat messages (raw_prompt) in each sample")
    shuffle: bool = fld(True, doc="shuffle the training set every epoch")
    seed: int | None = fld(None, doc="seed of the shuffling sampler; null = the sampler's default (1, as in verl)")
    filter_overlong_prompts: bool = fld(False, doc="drop prompts longer than max_prompt_length when loading")
    filter_overlong_prompts_workers: int = fld(
        1, doc="processes that render and tokenise the prompts when the dataset is built (1 = in this process)"
    )
    truncation: Truncation = fld(
        "error", doc="what to do with a prompt longer than max_prompt_length: error|left|right|middle"
    )
    skip_bad_rows: bool = fld(
        False,
        doc="drop rows with a missing/empty prompt or a bad reward_model instead of failing (counted in "
        "data/skipped_rows); not a verl key",
    )
    train_max_samples: int = fld(-1, doc="use at most this many training rows; -1 = all")
    val_max_samples: int = fld(-1, doc="use at most this many validation rows; -1 = all")
    apply_chat_template_kwargs: FreeDict = free_dict(doc="extra kwargs for tokenizer.apply_chat_template")
    trust_remote_code: bool = fld(
        False,
        doc="allow tokenizer code from the model repository when the driver loads the tokenizer for the dataset "
        "(also on with actor_rollout_ref.model.trust_remote_code)",
    )
    dataloader_num_workers: int = fld(
        0, doc="DataLoader worker processes reading rows (resume stays exact); 0 = load in the driver"
    )

    @filter_overlong_prompts_workers.validator
    def _check_workers(self, attribute: attrs.Attribute, value: int) -> None:
        if value < 1:
            # (message, attribute): the config converter turns this into an error on the key.
            raise ValueError(f"must be a process count >= 1, got {value}", attribute, value)
