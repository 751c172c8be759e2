"""`specchat bench`: plain vs speculative decoding vs Hugging Face assisted decoding, side by side.

Layout: ``prompts.json`` (the shipped prompt set) and :mod:`prompts` (loading it), :mod:`costs`
(measuring c and v(γ)), :mod:`hf_peer` (transformers' assisted generation as the peer),
:mod:`runner` (every method on every prompt, interleaved, one record per run), :mod:`report`
(aggregates, the summary, terminal tables, JSON), :mod:`plot` (matplotlib) and :mod:`cli`
(the click command). Importing this package loads nothing heavy.
"""

from __future__ import annotations

from specchat.errors import SpecchatError


class BenchError(SpecchatError):
    """A benchmark setting or output that cannot work (unknown category, missing matplotlib, …)."""
