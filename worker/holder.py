"""Keeps one loaded model and swaps it only when a job or the desired model (storage) asks for another."""

from __future__ import annotations

import gc
import logging

from storage import Store
from storage.home import gguf_cache
from storage.records import ModelSpec
from worker.job import sticky_device_error, sticky_text

log = logging.getLogger(__name__)


class ModelUnavailable(RuntimeError):
    """No model could be loaded for a job; the message says why (it becomes the job's error)."""


class DeviceLost(RuntimeError):
    """A sticky CUDA error while loading or self-testing a model: every later call into this process's device context
    fails, so no job is at fault (it goes back to the queue) and only a new worker process can go on."""


class ModelHolder:
    def __init__(self, store: Store, worker_id: str, threads: int | None = None, adaptive: bool = True,
                 fast: bool = True, spare_cores: int = 0):
        self.store, self.worker_id = store, worker_id
        self.threads = threads  # torch CPU threads asked for; None = the engine's advice per model
        self.spare_cores = spare_cores  # cores that advice leaves to other work on this machine
        self.adaptive = adaptive  # tokenswift.decode.adaptive: the candidate batch per iteration, or plain steps
        self.fast = fast  # the CUDA fast path where the model and device have it
        self.options = None  # tokenswift.decode.options.EngineOptions for the loaded model
        self.spec: ModelSpec | None = None
        self.model = None  # tokenswift.model.loading.LoadedModel
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

    def forget(self) -> None:
        """Drop the model without asking the device to free anything: after a sticky CUDA error every call into the
        device context raises, and the process is about to exit, which frees it all."""
        self.model, self.spec = None, None

    def _load(self, spec: ModelSpec):
        from tokenswift.decode.selftest import device_defaults
        from tokenswift.draft.model_drafter import attach_draft_model
        from tokenswift.model.loading import load_model

        self.store.report_model(self.worker_id, spec, "loading")
        log.info("loading %s (heads=%s) on %s/%s", spec.model, spec.heads, spec.device, spec.dtype)
        try:
            model = load_model(spec.model, device=spec.device, dtype=spec.dtype, heads=spec.heads,
                               cache_dir=gguf_cache(), threads=self.threads, spare_cores=self.spare_cores)
            model = attach_draft_model(model, spec.draft_model)  # a vocabulary of its own is refused by name
        except Exception as error:  # noqa: BLE001 - bad path, bad checkpoint, OOM: all reported the same way
            if sticky_device_error(error):
                raise DeviceLost(f"loading {spec.model!r}: {type(error).__name__}: {error}") from error
            raise self._failed(spec, f"{type(error).__name__}: {error}") from error
        self.options = usable(device_defaults(model, self.adaptive, self.fast))  # self-tests the fast path on CUDA
        log.info("decoding path: %s", self.options.path(model.config).describe())
        self.model, self.spec, self.failed = model, spec, None
        self._report_ready()
        return model

    def _failed(self, spec: ModelSpec, why: str) -> ModelUnavailable:
        message = f"cannot load model {spec.model!r}: {why}"
        self.failed = (spec, message)
        self.store.report_model(self.worker_id, spec, "failed", load_error=message)
        log.error("%s", message)
        return ModelUnavailable(message)

    def fall_back(self, failure: str) -> None:
        """The fast path failed mid-job: the next path down (self-tested) runs the requeued job and the rest."""
        from tokenswift.decode.selftest import fall_back

        self.options = usable(fall_back(self.model, self.options, failure))
        log.warning("fast path failed (%s); decoding path now: %s", failure,
                    self.options.path(self.model.config).describe())
        self._report_ready()

    def _report_ready(self) -> None:
        from tokenswift.draft.choice import drafters

        model = self.model
        self.store.report_model(self.worker_id, self.spec, "ready", memory_bytes=model.memory_bytes(),
                                max_context=model.max_context, param_count=param_count(model),
                                heads_info=heads_info(model, self.spec, self.options),
                                drafters=drafters(model).to_json())


def usable(options):
    """`options`, unless a self-test that chose them hit a sticky error: then every later call on the device would
    fail too, and a new process must start without the fast path (the app's supervisor does so)."""
    broke = next((why for why in options.choice.dropped if sticky_text(why)), None) if options.choice else None
    if broke is not None:
        raise DeviceLost(f"the fast path's self-test left the device unusable ({broke})")
    return options


def param_count(model) -> int:
    """The model's own weights (draft heads apart), as model cards count them. A q4 model's projections keep their
    weights packed in buffers (tokenswift.model.quant.QuantLinear), not parameters: each counts as the out x in
    weights it stands for (only the embedding was left, and a 135M model read "28.3M"). Its packed LM head is a copy
    of a weight still counted as a parameter (the embedding or lm_head): counted once, as the model card does."""
    from tokenswift.model.quant import QuantLinear

    net = model.model
    # Each block weight once, where the model first holds it: a K-quant file's tied head is its embedding's
    # blocks (no float parameter stands for it), a Q4_0/Q4_1 file's head a copy under quantized_head alone.
    packed = sum(m.out_features * m.in_features for name, m in net.named_modules()
                 if isinstance(m, QuantLinear) and name != "quantized_head")
    return sum(t.numel() for t in net.parameters()) + packed


def heads_info(model, spec: ModelSpec, options=None) -> str:
    """The model notice's line (the workers table's heads_info): which drafters' weights are loaded (heads, draft
    layer, draft model; else n-grams only, and how to train a draft layer) and, on a GPU, which path runs the passes
    and why no faster one does. A draft layer that could not be used is named with why: its drafts fall back to the
    heads. Its facts are the engine's (tokenswift.draft.choice.drafters), which the Model tab words too."""
    from tokenswift.draft.choice import drafters

    found, parts = drafters(model), []
    if found.heads:
        parts.append(f"{found.heads} draft heads from {spec.heads or 'the model folder'}")
    if found.layer_vocab is not None:
        parts.append(f"a draft layer ({found.layer_vocab:,}-token draft vocabulary)")
    elif found.layer_problem:
        parts.append(f"the draft layer is unusable ({found.layer_problem}); the layer drafter falls back to the "
                     "heads")
    if found.draft_model is not None:
        parts.append(f"a draft model ({found.draft_model}, {param_count(model.draft_model) / 1e6:,.1f}M parameters)")
    if not parts:
        parts.append("n-grams only (train a draft layer for it: `tokenswift draft-data`, then `train-draft`)")
    if options is not None and model.device.type == "cuda":
        parts.append(f"decoding path: {options.path(model.config).describe()}")
    return "; ".join(parts)
