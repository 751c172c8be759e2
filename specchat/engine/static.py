"""A static KV cache rolled back by position, with CUDA graphs per pass width (the gpt-fast way).

:class:`StaticLM` is a :class:`~specchat.engine.kv.CachedLM` whose cache is one preallocated
tensor per layer: a pass writes its keys and values at the positions it computes, and rolling
back after a rejection only moves where the next pass writes (positions past it are masked out,
then overwritten). Addresses never change, so on CUDA each pass width (a draft step, each verify
width 1 … γmax+1) is captured once as a CUDA graph and replayed: one launch per forward instead of
hundreds of small ones, which is what decoding a 0.5–7B model on a GPU is bound by.

Beside the ``logits_after(ids)`` every cache offers, :meth:`StaticLM.logits_after_tokens` scores
tokens that exist only on the device (the drafts of this round), so a round needs no host read
until the verdict (see :mod:`specchat.engine.speculative`).

The model's own forward (transformers) runs unchanged: this module hands it a cache object with
the one method its attention layers call (``update``), the positions, and ready-made masks (a
causal mask over the whole cache, and a sliding-window one for layers that have it, Gemma 3's
window among them). The same code runs on a CPU with graphs off, which is how CI checks it
against the dynamic cache.
"""

from __future__ import annotations

import inspect
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeGuard

import torch

from specchat.engine.kv import CachedLM, common_prefix_length, device_sync
from specchat.errors import InvalidSettingError
from specchat.params import GAMMA_MAX

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from specchat.engine.kv import EngineModel

KV_CHOICES = ("auto", "static", "dynamic")
COMPILE_ENV = "SPECCHAT_COMPILE"
"""torch.compile's mode for the CUDA graphs' passes (e.g. ``default``); unset: no compilation."""
DEFAULT_CAPACITY = 1024
"""Positions the cache holds at first; it doubles (up to the model's context) when a reply needs more.
Every pass attends over the whole cache (masked), so a smaller cache is a cheaper pass."""
GRAPH_WIDTHS = GAMMA_MAX + 1
"""Passes up to this many positions (a draft step, any verify pass) replay a CUDA graph; longer
ones (prefills) run eagerly."""
WARMUP_RUNS = 2
"""Eager runs on a side stream before a capture (cuBLAS and the allocator settle their choices)."""


class PositionCache:
    """The cache object a transformers model is handed: per layer, keys and values for every position.

    ``update`` writes the pass's keys and values at :attr:`positions` and returns the whole
    cache; the masks keep each query row from seeing positions after its own (and, for sliding
    layers, before its window). Tensors are made on first use, from the first (eager) pass, so
    they take each layer's own head count, head size and dtype.
    """

    is_compileable = True

    def __init__(self, layers: int, capacity: int) -> None:
        self.capacity = capacity
        self.keys: list[torch.Tensor | None] = [None] * layers
        self.values: list[torch.Tensor | None] = [None] * layers
        self.positions = torch.zeros(0, dtype=torch.long)
        self.length = 0
        """Positions the host knows to be filled (what transformers may ask get_seq_length for)."""

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        if keys is None or values is None:
            keys, values = self._allocate(layer_idx, key_states, value_states)
        keys.index_copy_(2, self.positions, key_states)
        values.index_copy_(2, self.positions, value_states)
        return keys, values

    def _allocate(
        self, layer_idx: int, key_states: torch.Tensor, value_states: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        batch, heads, _, _ = key_states.shape
        keys = key_states.new_zeros(batch, heads, self.capacity, key_states.shape[-1])
        values = value_states.new_zeros(batch, heads, self.capacity, value_states.shape[-1])
        self.keys[layer_idx], self.values[layer_idx] = keys, values
        return keys, values

    def grown(self, capacity: int) -> PositionCache:
        """A larger cache holding all of this one (drafts the host has not read back included)."""
        bigger = PositionCache(len(self.keys), capacity)
        bigger.length = self.length
        for i, (keys, values) in enumerate(zip(self.keys, self.values, strict=True)):
            if keys is None or values is None:
                continue
            new_keys, new_values = bigger._allocate(i, keys, values)
            new_keys[:, :, : self.capacity] = keys
            new_values[:, :, : self.capacity] = values
        return bigger

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def __len__(self) -> int:
        return len(self.keys)


@dataclass(frozen=True)
class MaskPlan:
    """How a model wants its masks: which layer kinds, which window, boolean or additive."""

    kinds: tuple[str, ...]
    """The layer kinds to make masks for ("full_attention", "sliding_attention"); one mask, not a
    dict, for models whose forward takes a single 4-D mask."""
    window: int | None
    as_dict: bool
    additive: bool
    """Eager attention adds the mask to the scores; SDPA and specchat's kernels take booleans."""

    @classmethod
    def of(cls, model: PreTrainedModel) -> MaskPlan:
        config = model.config
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        window = getattr(text_config, "sliding_window", None)
        layer_types = getattr(text_config, "layer_types", None)
        as_dict = _forward_takes_mask_dict(model)
        if as_dict and layer_types:
            kinds = tuple(sorted(set(layer_types)))
        else:
            # One mask for every layer: windowed where the whole model slides (Mistral's style).
            slides = window is not None and (not layer_types or set(layer_types) == {"sliding_attention"})
            kinds = ("sliding_attention",) if slides else ("full_attention",)
        additive = getattr(text_config, "_attn_implementation", None) == "eager"
        return cls(kinds, int(window) if window else None, as_dict and bool(layer_types), additive)

    def masks(self, positions: torch.Tensor, capacity: int, dtype: torch.dtype) -> Any:
        """The masks for query rows at ``positions`` over a cache of ``capacity`` positions."""
        kv = torch.arange(capacity, device=positions.device)
        seen = kv[None, :] <= positions[:, None]
        made = {}
        for kind in self.kinds:
            allowed = seen
            if kind == "sliding_attention" and self.window is not None:
                # transformers' sliding overlay: a row sees its own position and the window - 1 before it.
                allowed = seen & (kv[None, :] > positions[:, None] - self.window)
            mask = allowed[None, None]
            if self.additive:
                mask = torch.zeros(mask.shape, dtype=dtype, device=positions.device).masked_fill(
                    ~mask, torch.finfo(dtype).min
                )
            made[kind] = mask
        return made if self.as_dict else made[self.kinds[0]]


def _forward_takes_mask_dict(model: PreTrainedModel) -> bool:
    """Whether the model's decoder accepts a dict of masks per layer kind (Qwen2/3, Gemma 2/3 do;
    Llama, Mistral and Phi-3 take one 4-D mask)."""
    inner = getattr(model, "model", None)
    forward = getattr(type(inner), "forward", None) if inner is not None else None
    if forward is None:
        return False
    try:
        source = inspect.getsource(forward)
    except (OSError, TypeError):
        return False
    return "isinstance(causal_mask_mapping := attention_mask, dict)" in source


def cache_keyword(model: PreTrainedModel) -> str:
    """The name transformers gives the cache argument: ``cache`` from 5.24, ``past_key_values`` before."""
    parameters = inspect.signature(model.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


@dataclass
class _Graph:
    graph: Any
    logits: torch.Tensor


@dataclass
class StaticLM(CachedLM):
    """A model with a static, position-addressed KV cache; graphs per width on CUDA.

    ``graphs``: None means on CUDA, off elsewhere. ``capacity``: positions allocated at first.
    """

    model: PreTrainedModel
    """Always a transformers model (make_cached_lm gives specchat's own forwards a CachedLM)."""
    graphs: bool | None = None
    capacity: int = DEFAULT_CAPACITY
    graph_widths: int = GRAPH_WIDTHS
    capture_s: float = 0.0
    """Seconds spent capturing graphs (the probe reports it)."""
    graph_error: str | None = None
    """Why graphs were turned off, if a capture failed (decoding goes on eagerly)."""
    compile_mode: str | None = None
    """torch.compile's mode for the passes that graphs capture (None: the model's modules as they
    are). Inductor fuses a layer's small kernels (norms, rotary, activations, residual adds) into
    few; the CUDA graph around them is still this class's own. Prefills stay uncompiled."""
    _positions: PositionCache | None = field(default=None, repr=False)
    _graphs: dict[int, _Graph] = field(default_factory=dict, repr=False)
    _pool: Any = field(default=None, repr=False)
    _ids_buf: torch.Tensor | None = field(default=None, repr=False)
    _start_buf: torch.Tensor | None = field(default=None, repr=False)
    _steps: torch.Tensor | None = field(default=None, repr=False)
    _plan: MaskPlan | None = field(default=None, repr=False)
    _keyword: str = field(default="cache", repr=False)
    _compiled: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.graphs is None:
            self.graphs = self.device.type == "cuda"
        limit = self.max_positions
        if limit is not None:
            self.capacity = min(self.capacity, limit)
        self._plan = MaskPlan.of(self.model)
        self._keyword = cache_keyword(self.model)
        device = self.device
        self._ids_buf = torch.zeros(self.graph_widths, dtype=torch.long, device=device)
        self._start_buf = torch.zeros((), dtype=torch.long, device=device)
        self._steps = torch.arange(self.graph_widths, device=device)

    # ------------------------------------------------------------------ the CachedLM interface

    def reset(self) -> None:
        """Forget what is cached (the tensors and graphs stay: a new reply overwrites them)."""
        self.cached_ids = []
        if self._positions is not None:
            self._positions.length = 0

    @torch.inference_mode()
    def logits_after(
        self, ids: list[int], n_logits: int = 1, *, head_rows: int | None = None
    ) -> torch.Tensor:
        """Logits [n_logits, V] predicting the token after each of the last n_logits of ids.

        Rolling back is free: the pass starts at the longest cached prefix and overwrites what
        followed it. ``head_rows`` is for the native kernels only and is ignored here.
        """
        if n_logits < 1 or n_logits > len(ids):
            raise ValueError(f"cannot score {n_logits} positions of a {len(ids)}-token sequence")
        reuse = min(common_prefix_length(self.cached_ids, ids), len(ids) - n_logits)
        tokens = _to_device(ids[reuse:], self.device)
        logits = self._run(tokens, reuse, n_logits)[-n_logits:]
        self._known(list(ids))
        # A graph's output is overwritten by its next replay: callers may keep these rows.
        return logits.clone() if self.graphs else logits

    @torch.inference_mode()
    def logits_after_tokens(self, ids: list[int], tokens: torch.Tensor) -> torch.Tensor:
        """Logits [len(tokens) + 1, V] after ``ids``, then after each of ``tokens``.

        ``tokens`` stay on the device (this round's drafts: the host has not read them). Row 0
        predicts what follows ``ids``; row i what follows ``ids`` and the first i tokens. The
        cache holds all of them afterwards, though only ``ids`` count as known until
        :meth:`extend_known` is told the tokens.
        """
        if not ids:
            raise ValueError("logits_after_tokens needs at least one known id")
        reuse = min(common_prefix_length(self.cached_ids, ids), len(ids) - 1)
        if reuse < len(ids) - 1:
            self.logits_after(ids[:-1], 1)  # catch up on what the host added (a rare long tail)
            reuse = len(ids) - 1
        last = _to_device(ids[-1:], self.device)
        logits = self._run(torch.cat([last, tokens.to(torch.long)]), reuse, tokens.shape[0] + 1)
        self._known(list(ids))
        return logits

    @torch.inference_mode()
    def logits_of(self, tokens: torch.Tensor, start: int) -> torch.Tensor:
        """Logits [len(tokens), V] after feeding device ``tokens`` at positions ``start`` on.

        A draft step: the ids stay on the device and the known ids do not change (the caller
        tells :meth:`extend_known` once it has read them). The rows may be a graph's output,
        valid until this model's next pass.
        """
        return self._run(tokens.reshape(-1).to(torch.long), start, tokens.numel())

    def extend_known(self, ids: list[int]) -> None:
        """The tokens the last :meth:`logits_after_tokens` (or a draft) put in the cache, now read back."""
        self._known(self.cached_ids + list(ids))

    @torch.inference_mode()
    def capture(self, widths: list[int]) -> float:
        """Capture the graphs of these pass widths now (the first use would); returns seconds."""
        if not self.graphs:
            return 0.0
        if self._positions is None or not self.cached_ids:
            raise ValueError("capture after a prefill: the cache's tensors are made by the first pass")
        start = time.perf_counter()
        for width in widths:
            if width <= self.graph_widths and width not in self._graphs:
                tokens = torch.zeros(width, dtype=torch.long, device=self.device)
                self._graph_for(width, tokens, len(self.cached_ids))
        return time.perf_counter() - start

    # ------------------------------------------------------------------ passes

    def _known(self, ids: list[int]) -> None:
        self.cached_ids = ids
        if self._positions is not None:
            self._positions.length = len(ids)

    def _run(self, tokens: torch.Tensor, start: int, n_logits: int) -> torch.Tensor:
        width = tokens.shape[0]
        self._ensure_capacity(start + width)
        self.forward_calls += 1
        if self.graphs and width <= self.graph_widths and self._positions is not None:
            graph = self._graph_for(width, tokens, start)
            if graph is not None:
                assert self._ids_buf is not None and self._start_buf is not None
                self._ids_buf[:width].copy_(tokens)
                self._start_buf.fill_(start)
                graph.graph.replay()
                return graph.logits
        positions = torch.arange(start, start + width, device=self.device)
        # Only the graphs keep every row's logits: an eager prefill would otherwise hold V per token.
        if self.compile_mode is not None and width <= self.graph_widths:
            return self._forward(tokens, positions, width, compiled=True)[-n_logits:]
        return self._forward(tokens, positions, n_logits)

    def _forward(
        self, tokens: torch.Tensor, positions: torch.Tensor, n_logits: int, *, compiled: bool = False
    ) -> torch.Tensor:
        assert self._plan is not None
        if self._positions is None:
            layers = self.model.config.get_text_config().num_hidden_layers
            self._positions = PositionCache(layers, self.capacity)
        cache = self._positions
        cache.positions = positions
        masks = self._plan.masks(positions, cache.capacity, self.model.dtype)
        model = self._compiled_model() if compiled else self.model
        out = model(
            input_ids=tokens[None],
            position_ids=positions[None],
            attention_mask=masks,
            use_cache=True,
            logits_to_keep=n_logits,
            **{self._keyword: cache},
        )
        return out.logits[0]

    def _graph_for(self, width: int, tokens: torch.Tensor, start: int) -> _Graph | None:
        """The graph of passes ``width`` wide, captured on first use (None: graphs are off)."""
        if width in self._graphs:
            return self._graphs[width]
        began = time.perf_counter()
        try:
            graph = self._capture(width, tokens, start)
        except RuntimeError as err:  # a forward that cannot be captured: decode eagerly instead
            self.graphs = False
            self.graph_error = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
            torch.cuda.synchronize(self.device)
            return None
        self.capture_s += time.perf_counter() - began
        self._graphs[width] = graph
        return graph

    def _capture(self, width: int, tokens: torch.Tensor, start: int) -> _Graph:
        assert self._ids_buf is not None and self._start_buf is not None and self._steps is not None
        ids_buf, start_buf, steps = self._ids_buf, self._start_buf, self._steps
        ids_buf[:width].copy_(tokens)
        start_buf.fill_(start)

        compiled = self.compile_mode is not None

        def body() -> torch.Tensor:
            positions = start_buf + steps[:width]
            return self._forward(ids_buf[:width], positions, width, compiled=compiled)

        # The warm-up runs compute this very pass (same ids, same positions): the replay that
        # follows rewrites the same cache entries with the same values.
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                body()
        torch.cuda.current_stream(self.device).wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits = body()
        return _Graph(graph, logits)

    def _compiled_model(self) -> Any:
        if self._compiled is None:
            import torch._dynamo

            # One compiled graph per pass width (shapes are static); the default limit is 8.
            for name in ("recompile_limit", "cache_size_limit"):
                if hasattr(torch._dynamo.config, name):
                    setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 64))
            self._compiled = torch.compile(self.model, mode=self.compile_mode, dynamic=False)
        return self._compiled

    def _ensure_capacity(self, needed: int) -> None:
        if needed <= self.capacity:
            return
        limit = self.max_positions or needed
        capacity = self.capacity
        while capacity < needed:
            capacity *= 2
        self.capacity = max(needed, min(capacity, limit))
        if self._positions is not None:
            device_sync(self.device)
            self._positions = self._positions.grown(self.capacity)
            self._graphs.clear()  # they address the old tensors


def _to_device(ids: list[int], device: torch.device) -> torch.Tensor:
    """Host ids onto the device without waiting for it: through pinned memory, asynchronously.

    torch's pinned-memory allocator keeps a block until the copy that reads it has run, so the
    host never overwrites ids the device has yet to copy.
    """
    host = torch.tensor(ids, dtype=torch.long)
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def make_cached_lm(model: EngineModel, kv: str = "auto") -> CachedLM:
    """The cache a model decodes with: static (graphs on CUDA) or transformers' dynamic cache.

    ``auto``: static for transformers models on CUDA, where launches bound decoding, and for models
    with sliding-window layers anywhere; the dynamic cache for other transformers models on a CPU
    (that path is unchanged), and specchat's native kernels keep their own cache.
    """
    if kv not in KV_CHOICES:
        raise InvalidSettingError(f"unknown KV cache {kv!r}; use {', '.join(KV_CHOICES)}")
    if kv == "dynamic" or not is_transformers_model(model):
        return CachedLM(model)
    wanted = kv == "static" or model.device.type == "cuda" or has_sliding_layers(model)
    if not wanted:
        return CachedLM(model)
    # Opt-in until a GPU run shows fusion pays: SPECCHAT_COMPILE=default compiles the graphed passes.
    compile_mode = os.environ.get(COMPILE_ENV, "").strip() or None
    return StaticLM(model, compile_mode=compile_mode if model.device.type == "cuda" else None)


def has_sliding_layers(model: PreTrainedModel) -> bool:
    """Layers with a sliding window (Gemma 3): transformers' dynamic cache cannot roll them back
    once the window is full (it drops what a rollback would need), the static cache can."""
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return "sliding_attention" in (getattr(text, "layer_types", None) or ())


def is_transformers_model(model: object) -> TypeGuard[PreTrainedModel]:
    from transformers import PreTrainedModel

    return isinstance(model, PreTrainedModel)
