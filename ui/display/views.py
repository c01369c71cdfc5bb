"""Text the tabs show: status lines, the progress bar, worker and model summaries. Pure functions."""

from __future__ import annotations

import html

from storage.records import GenerationRecord, MetricPoint, ModelSpec, WorkerStatus, utcnow
from tokenswift.decode.metrics import same_text_caveat

WORKER_SILENT_S = 15.0  # a worker row older than this is shown as not running


def context_in_use(latest: MetricPoint | None) -> str:
    """What the model sees now: " · context: memory 180 + last 7,800 tokens" (memory = the writer's pinned text:
    Memory, World Info and Author's Note, left out when there is none; last = the newest story tokens, which a
    context shift trims)."""
    if latest is None or latest.context_recent is None:
        return ""
    memory = f"memory {latest.context_pinned:,} + " if latest.context_pinned else ""
    return f" · context: {memory}last {latest.context_recent:,} tokens"


def progress_line(record: GenerationRecord, words: int, latest: MetricPoint | None, ahead: int = 0,
                  worker_note: str = "") -> str:
    """One Markdown line: where the generation is, in tokens and words, with speed and ETA."""
    done, target = record.produced_tokens, record.target_tokens
    head = f"**Draft #{record.id}** · {done:,} / {target:,} tokens · {words:,} words{context_in_use(latest)}"
    speed = latest.tokens_per_s if latest and latest.tokens_per_s else None
    rate = f" · {speed:,.0f} tokens/s" if speed else ""
    status = record.status
    if status == "queued" and record.control == "recover":  # requeued when its worker stopped (storage.runs)
        return f"{dot('wait')} **Recovering after a restart — loading the model** — {head}{worker_note}"
    if status == "queued":
        wait = f"{ahead} job{'s' if ahead != 1 else ''} ahead" if ahead else "next in line"
        return f"{dot('wait')} **Queued** ({wait}) — {head}{worker_note}"
    silent_s = (utcnow() - record.heartbeat_at).total_seconds() if record.heartbeat_at else 0.0
    if status == "running" and silent_s > WORKER_SILENT_S:  # killed or stuck: the next worker requeues it
        return f"{dot('wait')} **Recovering — its worker stopped answering**; a restarted worker resumes it — {head}"
    if status == "running":
        if record.control == "pause":
            return f"{dot('wait')} **Pausing…** — {head}"
        if record.control == "cancel":
            return f"{dot('wait')} **Stopping…** — {head}"
        eta = f" · ETA {duration((target - done) / speed)}" if speed and done < target else ""
        return f"{dot('run')} **Writing** — {head}{rate}{eta}"
    if status == "paused" and record.error:  # the store refused a write (worker/job.py): say why
        return f"{dot('bad')} **Paused** — {head}: {html.escape(record.error)}"
    if status == "paused":
        then = "writes on from your edited text" if record.origin == "edit" else "continues the very same text"
        return f"{dot('wait')} **Paused** — {head}. *Resume* {then}{worker_note}."
    if record.origin == "edit" and status == "done" and record.finish_reason == "edit":  # saved, not written on
        return (f"{dot('ok')} **Your edit** — Draft #{record.id}, your revision of #{record.parent_id} "
                f"(kept as the model wrote it). *Continue* writes on from your text.")
    if status == "done":
        reason = why_ended(record) or "target reached"
        return f"{dot('ok')} **Done** ({reason}) — {head} in {duration(record.elapsed_s)}{rate}. *Continue* extends it."
    if status == "cancelled":
        return f"{dot('off')} **Stopped** — {head}. *Continue* writes on from here."
    if status == "failed":
        return f"{dot('bad')} **Failed** — {head}: {html.escape(record.error or 'unknown error')}"
    return f"{status} — {head}"


def why_ended(record: GenerationRecord) -> str:
    """Why a finished run stopped before its target, in words ("the model ended the text at 164 tokens");
    "" while it runs, or when it reached its target."""
    at = f"{record.produced_tokens:,} tokens"
    if record.status == "failed":
        return f"failed at {at}: {html.escape(record.error or 'unknown error')}"
    if record.status == "cancelled":
        return f"stopped by you at {at}"
    if record.status != "done" or record.produced_tokens >= record.target_tokens or record.finish_reason == "edit":
        return ""
    return {"eos": f"the model ended the text at {at}",
            "stop": f"a stop string ended it at {at}"}.get(record.finish_reason or "", f"ended at {at}")


def speed_words(record: GenerationRecord, points: list[MetricPoint]) -> str:
    """The speed of a draft in one line of the same shape at every update: how it compares with plain decoding
    "so far" while it runs, and the final figures once it stopped. Saved time counts only against plain steps
    timed in this very run (same machine, same threads): nothing is claimed before one was timed, and the ratio
    is taken over the draft's whole wall time (prefill and saving included), never over decoding alone."""
    if record.mode != "tokenswift":
        return "Plain decoding (AR mode): TokenSwift mode writes the very same text, faster where its guesses hold."
    running = record.status in ("queued", "running")
    # A resumed run times its first plain step a few seconds in: until then, its last measured figures stand.
    m = next((p for p in reversed(points) if p.ar_latency_s and p.elapsed_s and p.time_saved_s is not None), None)
    if m is None:
        return "TokenSwift: timing plain decoding on this machine to compare against…" if running else ""
    ratio, saved = (m.elapsed_s + m.time_saved_s) / m.elapsed_s, m.time_saved_s
    when = "so far" if running else "up to the pause" if record.status == "paused" \
        else f"on this draft ({m.tokens:,} tokens in {duration(m.elapsed_s)})"
    gain = f"**{duration(saved)} saved**" if saved >= 0.5 else f"{duration(-saved)} behind" if saved <= -0.5 \
        else "no time saved"
    line = f"TokenSwift {when}: **{ratio:.2f}×** plain decoding, {gain}."
    if ratio >= 1:
        return line
    if (m.plain_share or 0) >= 0.5:
        return f"{line} Plain steps are faster for this model here, so the engine takes them (same text)."
    return (f"{line} {100 * (m.alpha or 0):.0f}% of its guesses are accepted; it gains as the story repeats its "
            "names and phrases.")


def model_notice(worker: WorkerStatus | None) -> str:
    """What the loaded model is: name, size, trained context, device/dtype and its drafters."""
    if worker is None or worker.load_status != "ready":
        return "Model: shown once the worker has loaded one (see the banner above)."
    size = f" · {params(worker.param_count)} parameters" if worker.param_count else ""
    context = f" · trained for {worker.max_context:,} tokens of context" if worker.max_context else ""
    heads = (f"drafters: {html.escape(worker.heads_info)}" if worker.heads_info
             else "drafters: n-grams only (TokenSwift guesses from n-grams of the text so far)")
    caveat = same_text_caveat(worker.dtype, worker.device)
    exact = f" · ⚠ {caveat}" if caveat else ""
    return f"Model: **{short_name(worker.model)}**{size}{context} · {worker.device}/{worker.dtype} · {heads}{exact}"


def resume_caveat(worker: WorkerStatus | None) -> str:
    """Where a resume may not write the uninterrupted text (a GPU's 16-bit passes), the words that say so."""
    if worker is None or same_text_caveat(worker.dtype, worker.device) is None:
        return ""
    return (f" (in {worker.dtype} on {worker.device} the rebuilt cache rounds otherwise than the steps it replaces: "
            "at a near tie the text can part from what an uninterrupted run would write)")


def params(count: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            return f"{count / scale:.3g}{unit}"
    return str(count)


def plain(markdown: str) -> str:
    """Toasts show text, not Markdown."""
    return markdown.replace("**", "").replace("`", "")


def dot(kind: str) -> str:
    """A coloured status dot (ok, run, wait, off, bad); plain ● where styles are stripped."""
    return f'<span class="ts-dot ts-{kind}">●</span>'


def progress_bar(record: GenerationRecord | None) -> str:
    fraction = 0.0
    if record is not None and record.target_tokens:
        fraction = min(1.0, record.produced_tokens / record.target_tokens)
    state = record.status if record else "idle"
    return (f'<div class="ts-progress ts-{html.escape(state)}" role="progressbar" aria-valuenow="{fraction * 100:.0f}"'
            f' aria-valuemin="0" aria-valuemax="100"><div style="width:{fraction * 100:.1f}%"></div></div>')


def duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds < 90:
        return f"{seconds} s"
    if seconds < 5400:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def size(n_bytes: int | None) -> str:
    if not n_bytes:
        return "–"
    for unit in ("B", "KB", "MB", "GB"):
        if n_bytes < 1024 or unit == "GB":
            return f"{n_bytes:,.0f} {unit}" if unit == "B" else f"{n_bytes:,.1f} {unit}"
        n_bytes /= 1024
    return ""


def live_worker(workers: list[WorkerStatus]) -> WorkerStatus | None:
    fresh = [w for w in workers if _alive(w)]
    return fresh[0] if fresh else None


def _alive(w: WorkerStatus) -> bool:
    return w.heartbeat_age_s < WORKER_SILENT_S and w.load_status != "stopped"


HOW_TO_POINT = "Choose one in the **Model** tab (**Default model** is the one the app ships with)."


def model_banner(workers: list[WorkerStatus], desired: ModelSpec | None, no_worker_hint: str) -> str:
    """The one-line model status under the title, and what to do when there is none. `desired`: the model
    chosen in the Model tab (Store.desired_model), which every worker loads between drafts."""
    w = live_worker(workers)
    if w is None:
        saved = f" Once one runs, it loads **{short_name(desired.model)}** (saved in the Model tab)." if desired else ""
        return f"{dot('bad')} **No worker is running.** {no_worker_hint}{saved}"
    name = short_name(w.model or (desired.model if desired else ""))
    if w.load_status == "ready":
        return f"{dot('ok')} **{name}** ready on {w.device}/{w.dtype} · context {w.max_context or 0:,} tokens"
    if w.load_status == "loading":
        return f"{dot('wait')} Loading **{name}** on {w.device}/{w.dtype}…"
    if w.load_status == "failed":
        return f"{dot('bad')} **{name} could not be loaded** (the reason is in the Model tab). {HOW_TO_POINT}"
    if desired is None:
        return f"{dot('bad')} **No model chosen yet.** {HOW_TO_POINT}"
    return f"{dot('wait')} Worker idle; it will load **{short_name(desired.model)}** before the next draft."


def model_details(workers: list[WorkerStatus], desired: ModelSpec | None, queue: int) -> str:
    """The Model tab's status table, from the worker-status rows, and the saved choice."""
    waiting = f"\nQueue: {queue} draft{'s' if queue != 1 else ''} waiting."
    if not workers:
        lines = ["No worker has reported yet.", waiting]
        if desired:
            lines.append(f"\nSaved choice: `{desired.model}` ({desired.device}/{desired.dtype}). The first worker to "
                         "start loads it, unless its own `--model` says otherwise.")
        return "\n".join(lines)
    rows = ["| Worker | Status | Model | Device | Memory | Context | Job | Heartbeat |", "|---" * 8 + "|"]
    for w in workers:
        status = w.load_status if _alive(w) else f"not running ({w.load_status})"
        rows.append(
            f"| {w.worker_id} (pid {w.pid}) | {status} | {html.escape(w.model or '–')} | "
            f"{w.device or '–'}/{w.dtype or '–'} | {size(w.memory_bytes)} | "
            f"{f'{w.max_context:,}' if w.max_context else '–'} | {w.current_job_id or '–'} | "
            f"{duration(w.heartbeat_age_s)} ago |")
    lines = ["\n".join(rows), waiting]
    for w in workers:
        if w.load_error:
            lines.append(f"\n**{w.worker_id}:** {html.escape(w.load_error)}")
    live = [w for w in workers if _alive(w)]
    if desired and not (live and all(w.model == desired.model and w.load_status == "ready" for w in live)):
        lines.append(f"\nSaved choice: `{desired.model}` ({desired.device}/{desired.dtype}); workers load it "
                     "between drafts.")
    return "\n".join(lines)


def short_name(model: str | None) -> str:
    if not model:
        return "–"
    parts = [p for p in model.replace("\\", "/").split("/") if p]
    return "/".join(parts[-2:]) if model.count("/") == 1 and not model.startswith((".", "/", "~")) else parts[-1]
