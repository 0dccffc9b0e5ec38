"""verl's ``verl.trainer.ppo`` package path, so verl users' imports work unchanged.

Only :mod:`verl.trainer.ppo.core_algos` is provided (a re-export of :mod:`verl.algorithms` under verl's
names); importing this package imports nothing else.
"""
