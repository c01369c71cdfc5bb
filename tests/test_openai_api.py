"""The OpenAI-compatible endpoint (/v1) with the official `openai` client and curl against a running app: uvicorn
serving ui.api's app over a SQLite store behind the login ann:secret, and a worker in this process running
stories260k in float64 with a ChatML template added, so texts can be checked against plain decoding. The app as
app.py mounts it: the last test, on the shared `python app.py`."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn
from conftest import need_shared
from openai import AuthenticationError, BadRequestError, NotFoundError, OpenAI
from speed import AR

from storage import open_store
from tokenswift.decode.generate import Generator
from tokenswift.settings import WRITING_DEFAULTS, DraftSettings
from tokenswift.text.detok import IncrementalDetokenizer
from ui.api.api import create_app
from ui.api.openai_api import BOOK_TITLE, StopCut
from ui.drafts.limits import Limits
from worker import WorkerConfig
from worker.loop import Worker

AUTH = ("ann", "secret")
# SmolLM2's ChatML, opening with the BOS as Llama's templates do (the app must not add a second one).
CHATML = ("{{ bos_token }}{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] "
          "+ '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
PROMPT = "Once upon a time, there was a little dog"
CHAT = [{"role": "system", "content": "You tell short stories."}, {"role": "user", "content": "A story about a cat."},
        {"role": "assistant", "content": "Tom the cat liked fish."}, {"role": "user", "content": "Go on."}]


class OpenAIApp:
    def __init__(self, url: str, store, model: Path):
        self.url, self.store, self.model = url, store, model
        self.client = OpenAI(base_url=f"{url}/v1", api_key=AUTH[1], max_retries=0, timeout=60)

    def draft(self, response) -> int:
        """The draft behind an answer: its id is in the answer's id (cmpl-N, chatcmpl-N)."""
        return int(response.id.rsplit("-", 1)[1])


@pytest.fixture(scope="module")
def openai_app(tmp_path_factory, stories_path):
    tmp = tmp_path_factory.mktemp("openai")
    model = tmp / "chat260k"
    shutil.copytree(stories_path, model)
    config_file = model / "tokenizer_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "chat_template": CHATML}))
    db = f"sqlite:///{tmp / 'studio.db'}"
    store = open_store(db)
    worker = Worker(open_store(db), WorkerConfig(db=db, model=str(model), device="cpu", dtype="float64", threads=1,
                                                 poll_s=0.02, flush_s=0.0, flush_tokens=4))
    working = threading.Thread(target=worker.serve, daemon=True)
    working.start()
    server = uvicorn.Server(uvicorn.Config(create_app(store, [AUTH], Limits(body_bytes=64 * 1024)), host="127.0.0.1",
                                           port=0, log_level="warning"))
    serving = threading.Thread(target=server.run, daemon=True)
    serving.start()
    deadline = time.monotonic() + 60
    while not (server.started and store.list_workers() and store.list_workers()[0].load_status == "ready"):
        assert time.monotonic() < deadline, "the app or its worker did not start"
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield OpenAIApp(f"http://127.0.0.1:{port}", store, model)
    finally:
        server.should_exit = True
        worker.stop_requested.set()
        serving.join(10)
        working.join(10)
        worker.store.close()
        store.close()


def test_models_lists_the_model_new_drafts_run_on(openai_app):
    """By its folder's or file's name: its full path named the server's folders to every client."""
    name = Path(openai_app.model).name
    assert [m.id for m in openai_app.client.models.list().data] == [name] and "/" not in name
    assert openai_app.client.completions.create(model="any", prompt=PROMPT, max_tokens=2, seed=1).model == name


def test_a_completion_is_plain_decodings_text_whole_or_streamed_and_a_draft(openai_app, stories64):
    """Same seed, same text, streamed or not: the text TokenSwift wrote through the endpoint is plain decoding's for
    the draft's settings (the writing defaults, float64), and the draft is kept in the book of API requests."""
    whole = openai_app.client.completions.create(model="any", prompt=PROMPT, max_tokens=40, seed=11)
    chunks = list(openai_app.client.completions.create(model="any", prompt=PROMPT, max_tokens=40, seed=11, stream=True,
                                                   stream_options={"include_usage": True}))
    text = whole.choices[0].text
    assert text and "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert len([c for c in chunks if c.choices and c.choices[0].text]) > 1  # it came in pieces
    assert chunks[-2].choices[0].finish_reason == whole.choices[0].finish_reason
    assert chunks[-1].usage == whole.usage and not chunks[-1].choices

    gen = openai_app.store.get_generation(openai_app.draft(whole))
    assert gen.prompt_text == PROMPT and gen.status == "done" and gen.text == text
    assert openai_app.store.get_session(gen.session_id).title == BOOK_TITLE
    asked = DraftSettings.from_json(gen.settings_json)
    settings = asked.settings
    assert asked.mode == "tokenswift" and settings.seed == 11 and not settings.ban_eos  # the model may stop
    assert {k: getattr(settings, k) for k in WRITING_DEFAULTS if k != "ban_eos"} == {
        k: v for k, v in WRITING_DEFAULTS.items() if k != "ban_eos"}
    ids = openai_app.store.get_tokens(gen.id)
    plain = Generator(stories64, settings, ids.prompt_ids, options=AR).run()
    assert ids.generated_ids == plain
    detok = IncrementalDetokenizer(stories64.tokenizer, ids.prompt_ids)
    assert detok.push(plain) + detok.flush() == text
    reason = "length" if len(plain) == 40 else "stop"
    assert whole.choices[0].finish_reason == reason
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (len(ids.prompt_ids), len(plain))


def test_a_chat_runs_on_the_models_template_whole_or_streamed(openai_app):
    from tokenswift.model.hf_files import load_tokenizer

    whole = openai_app.client.chat.completions.create(model="any", messages=CHAT, max_tokens=24, seed=5)
    answer = whole.choices[0].message
    assert answer.role == "assistant" and answer.content and whole.object == "chat.completion"
    tokenizer = load_tokenizer(openai_app.model)
    expected = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True)
    expected = list(expected["input_ids"] if hasattr(expected, "keys") else expected)
    gen_id = openai_app.draft(whole)
    assert openai_app.store.get_tokens(gen_id).prompt_ids == expected  # the template's ids, one BOS
    assert openai_app.store.get_generation(gen_id).prompt_text.endswith("<|im_start|>user\nGo on.<|im_end|>\n"
                                                                    "<|im_start|>assistant\n")
    chunks = list(openai_app.client.chat.completions.create(model="any", messages=CHAT, max_tokens=24, seed=5,
                                                        stream=True))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].object == "chat.completion.chunk"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == answer.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason

    prefill = [*CHAT[:2], {"role": "assistant", "content": "Once"}]  # the answer starts with the prefill
    made = openai_app.client.chat.completions.create(model="any", messages=prefill, max_tokens=4, seed=5)
    assert openai_app.store.get_generation(openai_app.draft(made)).prompt_text.endswith("<|im_start|>assistant\nOnce")


def test_a_stop_string_ends_the_text_before_it(openai_app):
    free = openai_app.client.completions.create(model="any", prompt=PROMPT, max_tokens=40, seed=3).choices[0].text
    stop = " " + free.split()[4]
    before = free[:free.index(stop)]
    whole = openai_app.client.completions.create(model="any", prompt=PROMPT, max_tokens=40, seed=3, stop=[stop, "@@@"])
    assert (whole.choices[0].text, whole.choices[0].finish_reason) == (before, "stop")
    streamed = openai_app.client.completions.create(model="any", prompt=PROMPT, max_tokens=40, seed=3, stop=stop,
                                                stream=True)
    assert "".join(c.choices[0].text for c in streamed) == before
    assert openai_app.store.get_generation(openai_app.draft(whole)).text.startswith(before + stop)  # the draft keeps it


def test_stop_cut_holds_back_what_may_become_a_stop_string():
    cut = StopCut(("END", "\n\n"))
    assert [cut.feed(piece) for piece in ("abc E", "N", "x\n", "\nmore")] == ["abc ", "", "ENx", ""]
    assert cut.stopped and cut.rest() == ""
    other = StopCut(("END",))
    assert other.feed("the EN") + other.rest() == "the EN" and not other.stopped


@pytest.mark.parametrize(("extra", "param"), [
    ({"temperature": -1}, "temperature"),
    ({"repetition_penalty": 0.5}, "repetition_penalty"),  # named as sent, checked by Settings as `penalty`
    ({"dry_penalty_last_n": 1}, "dry_penalty_last_n"),
    ({"top_p": "high"}, "top_p"),
    ({"n": 2}, "n"),
    ({"rep_pen": 1.2, "repetition_penalty": 1.3}, "rep_pen"),
    ({"stop": [""]}, "stop"),
])
def test_a_bad_value_is_refused_in_openais_shape_naming_the_field(openai_app, extra, param):
    with pytest.raises(BadRequestError) as refused:
        openai_app.client.completions.create(model="any", prompt=PROMPT, max_tokens=4, extra_body=extra)
    error = refused.value.response.json()["error"]
    assert refused.value.status_code == 400 and error["param"] == param and error["message"].startswith(f"{param}: ")
    assert error["type"] == "invalid_request_error"


def test_a_target_out_of_the_apps_range_is_refused_in_its_words(openai_app):
    """max_tokens below 1 or over 10,000,000: the app's range (ui.drafts.limits), not Settings' "1..2**63-1"."""
    for value in (-1, 0, 10**8):
        with pytest.raises(BadRequestError) as refused:
            openai_app.client.completions.create(model="any", prompt=PROMPT, max_tokens=value)
        error = refused.value.response.json()["error"]
        assert error["param"] == "max_tokens"
        assert error["message"].startswith("max_tokens: must be between 1 and 10,000,000 tokens")


def test_writers_fields_reach_the_draft_and_unknown_ones_are_ignored(openai_app):
    extra = {"min_p": 0.05, "top_k": 40, "repetition_penalty": 1.2, "rep_pen_range": 128, "dry_multiplier": 0.5,
             "dry_base": 2.0, "dry_allowed_length": 3, "dry_penalty_last_n": 64, "dry_sequence_breakers": '"\\n", ":"',
             "xtc_threshold": 0.2, "xtc_probability": 0.3, "ban_eos_token": True, "mirostat_mode": 2}
    made = openai_app.client.completions.create(model="any", prompt=PROMPT, max_tokens=4, temperature=0.7, top_p=0.9,
                                            seed=1, extra_body=extra)
    settings = DraftSettings.from_json(openai_app.store.get_generation(openai_app.draft(made)).settings_json).settings
    assert (settings.temperature, settings.top_p, settings.min_p, settings.top_k, settings.penalty,
            settings.penalty_window, settings.dry_multiplier, settings.dry_base, settings.dry_allowed_length,
            settings.dry_range, settings.dry_breakers, settings.xtc_threshold, settings.xtc_probability,
            settings.ban_eos) == (0.7, 0.9, 0.05, 40, 1.2, 128, 0.5, 2.0, 3, 64, ("\n", ":"), 0.2, 0.3, True)
    assert made.choices[0].finish_reason == "length" and made.usage.completion_tokens == 4  # EOS banned


def test_the_login_is_the_apps_and_errors_keep_openais_shape(openai_app):
    wrong = OpenAI(base_url=f"{openai_app.url}/v1", api_key="guess", max_retries=0)
    with pytest.raises(AuthenticationError) as refused:
        wrong.models.list()
    assert refused.value.status_code == 401 and refused.value.response.json()["error"]["message"].startswith("wrong")
    assert httpx.get(f"{openai_app.url}/v1/models").json()["error"]["type"] == "invalid_request_error"  # no key: 401
    assert httpx.get(f"{openai_app.url}/v1/models", auth=AUTH).status_code == 200  # HTTP Basic, as for /api
    assert httpx.get(f"{openai_app.url}/api/health", headers={"Authorization": "Bearer secret"}).status_code == 200
    with pytest.raises(NotFoundError):
        openai_app.client.embeddings.create(model="any", input="x")
    big = httpx.post(f"{openai_app.url}/v1/completions", auth=AUTH, content=b"x" * 70_000)
    assert big.status_code == 413 and "limit" in big.json()["error"]["message"]
    broken = httpx.post(f"{openai_app.url}/v1/chat/completions", auth=AUTH, content=b"{")
    assert broken.status_code == 400 and broken.json()["error"]["code"] == "invalid_json"
    empty = httpx.post(f"{openai_app.url}/v1/chat/completions", auth=AUTH, json={"messages": []})
    assert empty.status_code == 400 and empty.json()["error"]["param"] == "messages"


def test_a_streaming_client_that_goes_away_cancels_its_draft(openai_app):
    stream = openai_app.client.completions.create(model="any", prompt=PROMPT, max_tokens=10**6, seed=2, stream=True,
                                              extra_body={"ignore_eos": True})
    first = next(chunk for chunk in stream if chunk.choices[0].text)
    gen_id = openai_app.draft(first)
    stream.close()
    deadline = time.monotonic() + 20
    while (gen := openai_app.store.get_generation(gen_id, with_text=False)).status != "cancelled":
        assert time.monotonic() < deadline, gen.status
        time.sleep(0.05)
    assert 0 < gen.produced_tokens < 10**6


def test_a_waiting_client_that_goes_away_cancels_its_draft(openai_app):
    before = max(g.id for g in openai_app.store.list_generations())
    body = {"model": "any", "prompt": PROMPT, "max_tokens": 10**6, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{openai_app.url}/v1/completions", auth=AUTH, json=body, timeout=1.5)
    deadline = time.monotonic() + 20
    while (gen := openai_app.store.list_generations()[0]).status != "cancelled":
        assert time.monotonic() < deadline, gen.status
        time.sleep(0.05)
    assert gen.id > before


def test_curl_streams_server_sent_events(openai_app):
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    body = json.dumps({"model": "any", "prompt": PROMPT, "max_tokens": 12, "seed": 4, "stream": True})
    done = subprocess.run(["curl", "-sSN", "--max-time", "60", "-H", "Authorization: Bearer secret", "-H",
                           "Content-Type: application/json", "-d", body, f"{openai_app.url}/v1/completions"],
                          capture_output=True, text=True, check=True)
    events = [line.removeprefix("data: ") for line in done.stdout.splitlines() if line]
    assert events[-1] == "[DONE]" and all(line.startswith("data: ") for line in done.stdout.splitlines() if line)
    chunks = [json.loads(event) for event in events[:-1]]
    assert {c["object"] for c in chunks} == {"text_completion"} and chunks[-1]["choices"][0]["finish_reason"]
    same = openai_app.client.completions.create(model="any", prompt=PROMPT, max_tokens=12, seed=4)
    assert "".join(c["choices"][0]["text"] for c in chunks) == same.choices[0].text


def test_the_app_serves_v1_behind_its_login(studio_app):
    """`python app.py` mounts /v1 beside /api, before the page; stories260k has no chat template: chat says so."""
    need_shared()
    client = OpenAI(base_url=f"{studio_app.url}/v1", api_key="secret", max_retries=0, timeout=120)
    assert len(client.models.list().data) == 1
    made = client.completions.create(model="any", prompt=PROMPT, max_tokens=6, seed=1)
    assert made.choices[0].text and made.usage.completion_tokens <= 6
    with pytest.raises(BadRequestError) as refused:
        client.chat.completions.create(model="any", messages=CHAT, max_tokens=4)
    assert refused.value.response.json()["error"]["code"] == "no_chat_template"
