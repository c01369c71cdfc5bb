"""Keeps one loaded model and swaps it only when a job or the desired model (storage) asks for another."""

from __future__ import annotations

import gc
import logging

from storage import Store
from storage.records import ModelSpec

log = logging.getLogger(__name__)


class ModelUnavailable(RuntimeError):
    """No model could be loaded for a job; the message says why (it becomes the job's error)."""


class ModelHolder:
    def __init__(self, store: Store, worker_id: str, threads: int | None = None, adaptive: bool = True,
                 fast: bool = True):
        self.store, self.worker_id = store, worker_id
        self.threads = threads  # torch CPU threads asked for; None = the engine's advice per model
        self.adaptive = adaptive  # tokenswift.adaptive: the candidate batch per iteration, or plain steps
        self.fast = fast  # the CUDA fast path where the model and device have it
        self.options = None  # tokenswift.options.EngineOptions for the loaded model
        self.spec: ModelSpec | None = None
        self.model = None  # tokenswift.loading.LoadedModel
        self.failed: tuple[ModelSpec, str] | None = None  # last spec that failed, with its error

    def ensure(self, spec: ModelSpec | None, *, retry: bool = True):
        """The loaded model for `spec`, loading it if needed. retry=False: do not try again a spec that
        just failed (the idle loop would otherwise reload a broken checkpoint forever)."""
        if spec is None:
            raise ModelUnavailable("no model configured: start the worker with --model or choose one in the "
                                   "Model tab")
        if spec == self.spec and self.model is not None:
            return self.model
        if self.failed and self.failed[0] == spec and not retry:
            raise ModelUnavailable(self.failed[1])
        self.unload()
        return self._load(spec)

    def unload(self) -> None:
        if self.model is None:
            return
        cuda = self.model.device.type == "cuda"
        self.model, self.spec = None, None
        gc.collect()  # the old weights must be gone before the new ones arrive (GPU memory)
        if cuda:
            import torch

            torch.cuda.empty_cache()

    def _load(self, spec: ModelSpec):
        from tokenswift.loading import cpu_threads, load_model
        from tokenswift.options import device_defaults

        self.store.report_model(self.worker_id, spec, "loading")
        log.info("loading %s (heads=%s) on %s/%s", spec.model, spec.heads, spec.device, spec.dtype)
        try:
            model = load_model(spec.model, device=spec.device, dtype=spec.dtype, heads=spec.heads)
        except Exception as error:  # noqa: BLE001 - bad path, bad checkpoint, OOM: all reported the same way
            message = f"cannot load model {spec.model!r}: {type(error).__name__}: {error}"
            self.failed = (spec, message)
            self.store.report_model(self.worker_id, spec, "failed", load_error=message)
            log.error("%s", message)
            raise ModelUnavailable(message) from error
        if self.threads is None and (threads := cpu_threads(model)):
            import torch

            torch.set_num_threads(threads)
        self.options = device_defaults(model, self.adaptive, self.fast)
        self.model, self.spec, self.failed = model, spec, None
        self.store.report_model(self.worker_id, spec, "ready", memory_bytes=model.memory_bytes(),
                                max_context=model.max_context, param_count=param_count(model),
                                heads_info=heads_info(model, spec))
        return model


def param_count(model) -> int:
    """The model's own weights (draft heads apart), as model cards count them."""
    return sum(t.numel() for t in model.model.parameters())


def heads_info(model, spec: ModelSpec) -> str | None:
    """Which drafters' weights are loaded (heads, draft layer), in a line the model notice shows; None when
    there are none. A draft layer that could not be used is named with why: its drafts fall back to the heads."""
    parts = []
    if model.heads is not None:
        parts.append(f"{model.heads.gamma} draft heads from {spec.heads or 'the model folder'}")
    if model.draft_layer is not None:
        parts.append(f"a draft layer ({len(model.draft_layer.vocab):,}-token draft vocabulary)")
    elif model.draft_error:
        parts.append(f"the draft layer is unusable ({model.draft_error}); the layer drafter falls back to the "
                     "heads")
    return "; ".join(parts) or None
