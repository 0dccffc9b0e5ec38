"""Test helpers for verl and for plugin authors: tiny models, ragged RL batches and conformance suites.

Nothing here downloads anything: tiny models and tokenizers are built from a config.
"""
