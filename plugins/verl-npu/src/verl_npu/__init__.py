"""verl-npu: the ``npu`` platform (Huawei Ascend through torch-npu and CANN) for verl.

Select it with ``trainer.device=npu``, or leave ``trainer.device: null`` on a host where it is the only
accelerator. ``import verl_npu`` imports neither torch nor torch_npu; ``verl plugins`` shows the probe's
answer (:mod:`verl_npu.probe`).
"""

__all__ = ["NPUPlatform", "__version__", "probe_npu"]

__version__ = "0.1.0"


def __getattr__(name: str):  # lazy: keep `import verl_npu` light
    if name == "NPUPlatform":
        from verl_npu.platform import NPUPlatform

        return NPUPlatform
    if name == "probe_npu":
        from verl_npu.probe import probe_npu

        return probe_npu
    raise AttributeError(name)
