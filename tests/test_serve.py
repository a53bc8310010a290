"""`ppdkit serve` (ppdkit/serving/server.py) as a user meets it: the real server in its own process on 127.0.0.1, talked to
with OpenAI's own client and plain HTTP; answers (streamed or not) are the decoder's `generate` text, and bad
requests get 4xx errors that say what is wrong."""

import http.client
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest
from mlflow import MlflowClient

from conftest import free_port, write_tiny_ppd_component
from ppdkit.registry.models import register_component
from ppdkit.registry.pyfunc import save_pyfunc

from ppdkit.runtime.decoder import Decoder
from ppdkit.serving.requests import ChatRequest, chat_ids

pytestmark = pytest.mark.integration  # the server runs in a process of its own (make test-fast leaves it out)

openai = pytest.importorskip("openai")

PROMPT = "Write a short story about a robot."


@contextmanager
def _serving(log, *args: str, env: dict | None = None):
    """`ppdkit serve ARGS` in its own process on a free port, answering /health: (its URL, its console log)."""
    port = free_port()
    with open(log, "w") as out:
        process = subprocess.Popen([sys.executable, "-m", "ppdkit.cli.main", "serve", *args, "--port", str(port)],
                                   stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1) as r:
                    if json.loads(r.read())["status"] == "ok":
                        break
            except OSError:
                if process.poll() is not None:
                    pytest.fail(f"ppdkit serve exited: {log.read_text()}")
                time.sleep(0.2)
        else:
            pytest.fail(f"ppdkit serve did not answer /health: {log.read_text()}")
        yield url, log
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with _serving(tmp_path_factory.mktemp("serve") / "server.log", "--base", "tiny-llama", "--method", "ar",
                  "--max-tokens", "32", "--max-request-bytes", "4000") as served:
        yield served


@pytest.fixture(scope="module")
def decoder():
    return Decoder.from_base("tiny-llama")


def _client(url: str):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def test_chat_answers_are_generates_text_streamed_or_not(server, decoder):
    url, log = server
    expected = decoder.generate(PROMPT, max_new_tokens=20, method="ar")
    client = _client(url)
    answer = client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": PROMPT}],
                                            max_tokens=20)
    assert answer.choices[0].message.content == expected.text
    assert answer.usage.completion_tokens == len(expected.tokens)
    assert answer.choices[0].finish_reason == ("length" if len(expected.tokens) == 20 else "stop")
    chunks = list(client.chat.completions.create(model="tiny-llama", max_tokens=20, stream=True,
                                                 messages=[{"role": "user", "content": PROMPT}]))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected.text
    assert len(chunks) > 3 and chunks[-1].choices[0].finish_reason == answer.choices[0].finish_reason
    # a drafter named in the request gives the same text (every method is lossless), and says what ran
    anpd = client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": PROMPT}],
                                          max_tokens=20, extra_body={"method": "anpd"})
    assert anpd.choices[0].message.content == expected.text and anpd.model_extra["ppdkit"]["method"] == "anpd"
    assert "HTTP" not in log.read_text()  # no access log lines on the console


def test_completions_read_the_prompt_as_it_is(server, decoder):
    url, _ = server
    ids = decoder.tokenizer("def add(a, b):", add_special_tokens=False)["input_ids"]
    expected = decoder.generate(ids, max_new_tokens=16, method="ar").text
    client = _client(url)
    assert client.completions.create(model="tiny-llama", prompt="def add(a, b):", max_tokens=16).choices[0].text \
        == expected
    streamed = client.completions.create(model="tiny-llama", prompt="def add(a, b):", max_tokens=16, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == expected


def test_sampled_answers_follow_the_seed(server):
    client = _client(server[0])

    def ask(seed: int) -> str:
        return client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": PROMPT}],
                                              max_tokens=16, temperature=1.0, seed=seed).choices[0].message.content

    assert ask(3) == ask(3)


def _messages(*messages: dict) -> list[dict]:
    return [m.model_dump() for m in ChatRequest.model_validate({"messages": list(messages)}).messages]


def test_content_parts_are_their_texts_joined_by_newlines():
    """OpenAI's SDK and LangChain send a message's content as a list of parts: the text parts' texts joined with
    newlines (as vLLM does) are the message, for any role; a string stays as it is."""
    parts = [{"type": "text", "text": "Hello"}, {"type": "text", "text": " world"}]
    assert _messages({"role": "user", "content": parts}) == _messages({"role": "user", "content": "Hello\n world"})
    assert _messages({"role": "user", "content": parts[:1]}) == [{"role": "user", "content": "Hello"}]
    assert _messages({"role": "system", "content": parts}, {"role": "user", "content": "Hi"},
                     {"role": "assistant", "content": parts}) == [{"role": "system", "content": "Hello\n world"},
                                                                   {"role": "user", "content": "Hi"},
                                                                   {"role": "assistant", "content": "Hello\n world"}]


def test_the_developer_role_is_the_system_role(decoder):
    """OpenAI's newer models take their system turn as `developer`: the same prompt ids as `system` (the tiny model's
    template would write `developer` into the prompt as it is)."""
    said = {"role": "user", "content": PROMPT}
    as_developer = ChatRequest.model_validate({"messages": [{"role": "developer", "content": "Be brief."}, said]})
    as_system = ChatRequest.model_validate({"messages": [{"role": "system", "content": "Be brief."}, said]})
    assert as_developer.messages == as_system.messages
    assert chat_ids(decoder, as_developer.messages) == chat_ids(decoder, as_system.messages)


def test_an_openai_client_sends_content_parts_and_the_developer_role_but_no_image(server):
    """End to end: the same answer as plain strings with a system turn; an image part gets a 400 naming it."""
    client = _client(server[0])

    def ask(messages: list[dict]) -> str:
        return client.chat.completions.create(model="tiny-llama", messages=messages,
                                              max_tokens=16).choices[0].message.content

    parts = [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Answer in English."}]
    assert ask([{"role": "developer", "content": parts}, {"role": "user", "content": [{"type": "text", "text": PROMPT}]}]
               ) == ask([{"role": "system", "content": "Be brief.\nAnswer in English."},
                         {"role": "user", "content": PROMPT}])
    with pytest.raises(openai.BadRequestError) as refused:
        ask([{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                          {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}])
    assert refused.value.status_code == 400 and "content part 1 is of type 'image_url'" in refused.value.message
    assert "serves text parts only" in refused.value.message


def _post(url: str, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.parametrize("body, status, says", [
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 33}, 400, "above this server's cap of 32"),
    ({"messages": [{"role": "user", "content": "hi"}], "method": "ppd"}, 400, "method 'ppd' is not served here"),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 2}, 400, "one choice per request"),
    ({"messages": [{"role": "user", "content": "hi"}], "stop": ["a", "b", "c", "d", "e"]}, 400, "up to 4"),
    ({"messages": []}, 400, "messages"),
    ({"prompt": "hi"}, 400, "messages: Field required"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, 400,
     "Input should be 'system', 'developer', 'user' or 'assistant'"),
    ({"messages": [{"role": "user", "content": "x" * 5000}]}, 413, "above this server's cap of 4000"),
    ({"messages": [{"role": "user", "content": "x" * 3000}], "stream": True}, 400, "more than this decoder's "
                                                                                   "max_length=2048"),
])
def test_bad_requests_get_clear_errors(server, body, status, says):
    url, _ = server
    code, answer = _post(f"{url}/v1/chat/completions", json.dumps(body).encode())
    assert code == status and says in answer["error"]["message"], answer


def test_stop_sequences_end_the_answer_before_them_streamed_or_not(server, decoder):
    url, _ = server
    full = decoder.generate(PROMPT, max_new_tokens=32, method="ar").text
    stop = full[12:15]  # a few characters from inside the answer; the answer ends before their first occurrence
    expected = full[:full.find(stop)]
    client = _client(url)
    for method in ("ar", "anpd"):
        answer = client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": PROMPT}],
                                                max_tokens=32, stop=["never in this text", stop],
                                                extra_body={"method": method})
        assert answer.choices[0].message.content == expected and answer.choices[0].finish_reason == "stop"
        assert answer.usage.completion_tokens < len(decoder.generate(PROMPT, max_new_tokens=32,
                                                                     method="ar").tokens)  # decoding ended too
        chunks = list(client.chat.completions.create(model="tiny-llama", max_tokens=32, stream=True, stop=stop,
                                                     messages=[{"role": "user", "content": PROMPT}],
                                                     extra_body={"method": method}))
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
        assert chunks[-1].choices[0].finish_reason == "stop"
    # a stop sequence that never comes holds nothing back for good
    kept = client.completions.create(model="tiny-llama", prompt="def add(a, b):", max_tokens=16, stream=True,
                                     stop="\u2603never")
    ids = decoder.tokenizer("def add(a, b):", add_special_tokens=False)["input_ids"]
    assert "".join(c.choices[0].text for c in kept) == decoder.generate(ids, max_new_tokens=16, method="ar").text


def test_concurrent_clients_each_get_their_own_answer(server, decoder):
    """Twelve clients at once, streamed or not, methods and stop sequences mixed: the server decodes them together
    (continuous batching), and each answer is the one its request gets alone."""
    url, _ = server
    prompts = [f"{PROMPT} Number {i}." for i in range(12)]
    full = {p: decoder.generate(p, max_new_tokens=32, method="ar").text for p in prompts}

    def ask(i: int) -> tuple[str, str]:
        prompt, method, stream = prompts[i], ("ar", "anpd", "self-draft")[i % 3], i % 2 == 0
        stop = full[prompt][10:13] if i % 4 == 1 else None
        body = dict(model="tiny-llama", messages=[{"role": "user", "content": prompt}], max_tokens=32, stop=stop,
                    extra_body={"method": method})
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in _client(url).chat.completions.create(
                stream=True, **body))
        else:
            text = _client(url).chat.completions.create(**body).choices[0].message.content
        return text, full[prompt][:full[prompt].find(stop)] if stop else full[prompt]

    with ThreadPoolExecutor(12) as pool:
        for got, expected in pool.map(ask, range(12)):
            assert got == expected


def _metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics") as r:
        return {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in r.read().decode().splitlines()
                if line.startswith("ppdkit_") and "by_method" not in line}


def test_health_and_metrics(server):
    url, _ = server
    _client(url).chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "hi"}],
                                         max_tokens=4)
    with urllib.request.urlopen(f"{url}/health") as r:
        health = json.loads(r.read())
    assert health["default_method"] == "ar" and "anpd" in health["methods"]
    values = _metrics(url)
    assert values["ppdkit_requests_total"] >= 1 and values["ppdkit_generated_tokens_total"] >= 4
    assert values["ppdkit_tokens_per_second"] > 0 and values["ppdkit_tokens_per_step"] >= 1


def test_a_registered_component_streams_its_answer_to_an_openai_client(tmp_path, monkeypatch):
    """A component registered as the register stage does (a pyfunc model around it, a version aliased challenger),
    served from its models:/ URI: the streamed answer is the decoder's own for that URI."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    component = write_tiny_ppd_component(tmp_path / "component")
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("serve", (tmp_path / "artifacts").as_uri())).info.run_id
    client.log_artifacts(run_id, str(save_pyfunc(component, tmp_path / "model")), "model")
    assert register_component(client, "ppdkit-served", run_id, {"method": "ept"}, artifact="model") == "1"
    model = "models:/ppdkit-served@challenger"
    expected = Decoder.from_pretrained(model, tree_size=8).generate(PROMPT, max_new_tokens=24, method="ppd")
    with _serving(tmp_path / "server.log", "--model", model, "--tree-size", "8", "--method", "ppd",
                  env={**os.environ, "MLFLOW_TRACKING_URI": uri}) as (url, _):
        chunks = list(_client(url).chat.completions.create(model=model, max_tokens=24, stream=True,
                                                           messages=[{"role": "user", "content": PROMPT}]))
    assert len(chunks) > 3 and "".join(c.choices[0].delta.content or "" for c in chunks) == expected.text


def test_a_client_that_leaves_a_stream_stops_its_decode(tmp_path):
    """SmolLM2 decodes slowly enough (hundreds of tokens/s) to see it: a client that reads the first chunk and hangs
    up leaves a decode that ends at its next steps, not at max_tokens; beyond the places in the batch and the queue,
    a request gets 503."""
    with _serving(tmp_path / "server.log", "--base", "smollm2-135m", "--method", "ar", "--max-batch", "1",
                  "--max-waiting", "1") as (url, _):
        body = {"model": "smollm2-135m", "max_tokens": 128, "messages": [{"role": "user", "content": PROMPT}]}
        whole = _client(url).chat.completions.create(**body)
        assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 128
        connection = http.client.HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1]), timeout=60)
        connection.request("POST", "/v1/chat/completions", json.dumps({**body, "stream": True}),
                           {"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200 and response.readline().startswith(b"data: ")  # the stream has begun
        connection.sock.shutdown(socket.SHUT_RDWR)
        connection.close()
        for _ in range(300):  # the left decode is counted once it has ended
            if (metrics := _metrics(url))["ppdkit_requests_total"] == 2:
                break
            time.sleep(0.1)
        left = metrics["ppdkit_generated_tokens_total"] - 128
        assert metrics["ppdkit_requests_total"] == 2 and 1 <= left < 64, metrics
        with ThreadPoolExecutor(3) as pool:  # one decoding, one waiting, one turned away
            codes = sorted(pool.map(lambda _: _post(f"{url}/v1/chat/completions", json.dumps(body).encode())[0],
                                    range(3)))
        assert codes == [200, 200, 503], codes
