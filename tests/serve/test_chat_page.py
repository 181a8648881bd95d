"""The chat page at ``/`` in a real headless browser (Chromium driven by Selenium): a question
typed into the page streams an answer from the API into it, the same text the API gives; one
reply at a time, which Stop ends (and the server then cancels); the settings reach the request
and outlive a reload; the API's errors are shown; model text is rendered as markdown without
ever becoming markup.

``python -m tests.serve.test_chat_page docs/chat-page.png`` saves the screenshot of the docs
(a short exchange with the bundled SmolLM2 when it is installed, else with the tiny model)."""

from __future__ import annotations

import json
import re
import shutil
import sys
import time

import pytest

import clops.llm

from ..llm.tiny import make_model
from .conftest import start

webdriver = pytest.importorskip(
    "selenium.webdriver", reason="Selenium is not installed (pip install selenium)")

QUESTION = "w4 w5 w6"


def _new_browser(width: int = 1000, height: int = 800):
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    binary = shutil.which("chromium") or shutil.which("chromium-browser") or \
        shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    if not binary or not driver:
        pytest.skip("no Chromium and chromedriver on this machine (Debian: apt-get install "
                    "chromium chromium-driver)")
    opts = Options()
    opts.binary_location = binary
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              f"--window-size={width},{height}"):
        opts.add_argument(a)
    return webdriver.Chrome(service=Service(driver), options=opts)


@pytest.fixture(scope="module")
def browser():
    b = _new_browser()
    yield b
    b.quit()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    make_model(str(path), "llama")
    return clops.llm.load(str(path), progress=False, max_seq_len=512)


@pytest.fixture(scope="module")
def served(tiny_model):
    run = start(tiny_model, parallel=2, model_name="tiny")
    yield run
    run.stop()


# -- helpers -------------------------------------------------------------------------------------
def _by(css: str):
    from selenium.webdriver.common.by import By

    return By.CSS_SELECTOR, css


def _wait(browser, cond, timeout: float = 120.0):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser, timeout, poll_frequency=0.05).until(cond)


def _open(browser, url: str, record: bool = True) -> None:
    """The page afresh (no stored settings or key); ``record``: every request body the page
    sends is kept in ``window.sent`` (fetch wrapped, the request itself unchanged)."""
    browser.get(url + "/")
    browser.execute_script("localStorage.clear(); sessionStorage.clear();")
    browser.get(url + "/")
    if record:
        _record(browser)


def _record(browser) -> None:
    browser.execute_script("""
        window.sent = [];
        const real = window.fetch;
        window.fetch = (url, opts) => {
          if (opts && opts.body) window.sent.push(JSON.parse(opts.body));
          return real(url, opts);
        };""")


def _settings(browser, **values) -> None:
    """Types ``values`` (max_tokens, temperature, system) into the settings panel."""
    panel = browser.find_element(*_by("#settings"))
    if not panel.get_attribute("open"):
        browser.find_element(*_by("#settings summary")).click()
    for name, value in values.items():
        field = browser.find_element(*_by("#" + name.replace("_", "-")))
        field.clear()
        field.send_keys(str(value))


def _ask(browser, text: str, enter: bool = False) -> None:
    from selenium.webdriver.common.keys import Keys

    box = browser.find_element(*_by("#prompt"))
    box.send_keys(text)
    if enter:
        box.send_keys(Keys.ENTER)
    else:
        browser.find_element(*_by("#send")).click()


def _reply(browser, index: int = -1):
    """The ``index``th assistant message, once it is done."""
    _wait(browser, lambda b: len(b.find_elements(*_by(".msg.assistant"))) > (
        index if index >= 0 else -index - 1) and b.find_elements(*_by(".msg.assistant"))[
            index].get_attribute("data-done") == "1")
    return browser.find_elements(*_by(".msg.assistant"))[index]


def _fake_stream(browser, events: str) -> None:
    """The page's next requests answered in the page by a stream of ``events`` (server-sent
    events), cut into reads of 50 characters."""
    browser.execute_script("""
        const events = arguments[0];
        window.fetch = async () => new Response(new ReadableStream({
          start(c) {
            const enc = new TextEncoder();
            for (let i = 0; i < events.length; i += 50) {
              c.enqueue(enc.encode(events.slice(i, i + 50)));
            }
            c.close();
          }}), {status: 200, headers: {'Content-Type': 'text/event-stream'}});""", events)


def _api(run, body: dict, key: str | None = None) -> dict:
    import httpx

    headers = {"Authorization": "Bearer " + key} if key else {}
    return httpx.post(run.url + "/v1/chat/completions", json=body, headers=headers,
                      timeout=120).json()


def _metrics(run) -> dict[str, float]:
    import httpx

    text = httpx.get(run.url + "/metrics", timeout=30).text
    return {m[1]: float(m[2]) for m in re.finditer(r"^(clops_\w+) (\S+)$", text, re.M)}


# -- the tests -----------------------------------------------------------------------------------
def test_the_page_streams_the_apis_answer_within_its_settings(served, browser):
    _open(browser, served.url)
    assert browser.find_element(*_by("#max-tokens")).get_attribute("value") == "512"
    _settings(browser, max_tokens=9, temperature=0)
    _ask(browser, QUESTION, enter=True)
    out = _reply(browser)
    assert browser.find_element(*_by("#status")).text == ""
    assert out.get_attribute("data-state") == "done"
    sent = browser.execute_script("return window.sent")
    assert sent == [{"messages": [{"role": "user", "content": QUESTION}], "stream": True,
                     "max_tokens": 9, "temperature": 0}]
    want = _api(served, {"messages": [{"role": "user", "content": QUESTION}],
                         "temperature": 0, "max_tokens": 9})
    assert want["usage"]["completion_tokens"] == 9  # the tiny model's words: one a token
    assert out.text == want["choices"][0]["message"]["content"].strip()
    assert len(out.text.split()) == 9
    notes = " ".join(n.text for n in browser.find_elements(*_by(".turn .note")))
    assert "max tokens 9" in notes  # finish_reason "length" is told

    # the settings outlive a reload; a system prompt goes first, the temperature as set
    browser.refresh()
    _record(browser)
    assert browser.find_element(*_by("#max-tokens")).get_attribute("value") == "9"
    assert browser.find_element(*_by("#temperature")).get_attribute("value") == "0"
    _settings(browser, temperature=0.5, system="w9 w10")
    browser.refresh()
    _record(browser)
    _ask(browser, QUESTION)
    out = _reply(browser)
    assert out.get_attribute("data-state") == "done"
    sent = browser.execute_script("return window.sent")
    assert sent == [{"messages": [{"role": "system", "content": "w9 w10"},
                                  {"role": "user", "content": QUESTION}],
                     "stream": True, "max_tokens": 9, "temperature": 0.5}]
    assert 1 <= len(out.text.split()) <= 9


def test_one_reply_at_a_time_and_stop_cancels_it_on_the_server(served, browser):
    engine = served.server.runner.engine
    step = engine.step

    def slow_step():  # a reply that takes long enough to be stopped
        time.sleep(0.25)
        return step()

    full = _api(served, {"messages": [{"role": "user", "content": QUESTION}], "temperature": 0,
                         "max_tokens": 200})
    full_text = full["choices"][0]["message"]["content"].strip()
    assert full["usage"]["completion_tokens"] > 20
    before = _metrics(served)
    _open(browser, served.url)
    _settings(browser, max_tokens=200, temperature=0)
    engine.step = slow_step
    try:
        _ask(browser, QUESTION)
        _wait(browser, lambda b: b.find_element(*_by(".msg.assistant")).text.strip())
        send = browser.find_element(*_by("#send"))
        stop = browser.find_element(*_by("#stop"))
        assert not send.is_enabled()
        assert stop.is_displayed() and stop.is_enabled()
        _ask(browser, "w7 w8", enter=True)  # Enter sends nothing while a reply streams
        send.click()  # nor does the disabled button
        assert len(browser.find_elements(*_by(".msg.user"))) == 1
        assert len(browser.execute_script("return window.sent")) == 1
        stop.click()
        out = _reply(browser)
        assert out.get_attribute("data-state") == "stopped"
        assert "Stopped" in browser.find_element(*_by(".turn .note")).text
        assert browser.find_element(*_by("#status")).text == ""
        assert send.is_enabled() and not stop.is_displayed()
        # the server saw the client leave and freed its slot
        deadline = time.monotonic() + 60
        while True:
            now = _metrics(served)
            if (now["clops_client_disconnects_total"] ==
                    before["clops_client_disconnects_total"] + 1
                    and now["clops_requests_running"] == 0):
                break
            assert time.monotonic() < deadline, f"the server did not cancel the reply: {now}"
            time.sleep(0.1)
    finally:
        engine.step = step
    made = now["clops_generated_tokens_total"] - before["clops_generated_tokens_total"]
    assert made < full["usage"]["completion_tokens"]
    partial = out.text
    assert partial and full_text.startswith(partial) and partial != full_text

    # the stopped reply stays in the conversation; the question typed meanwhile goes now
    assert browser.find_element(*_by("#prompt")).get_attribute("value") == "w7 w8"
    browser.find_element(*_by("#send")).click()
    _reply(browser, 1)
    sent = browser.execute_script("return window.sent")
    assert sent[1]["messages"] == [{"role": "user", "content": QUESTION},
                                   {"role": "assistant", "content": sent[1]["messages"][1][
                                       "content"]},
                                   {"role": "user", "content": "w7 w8"}]
    assert sent[1]["messages"][1]["content"].strip() == partial


def test_the_apis_errors_are_shown(served, browser):
    long_system = "w1 " * 600  # more than the context of 512 tokens
    _open(browser, served.url)
    _settings(browser, max_tokens=8, temperature=0)
    browser.execute_script(
        "const s = document.getElementById('system'); s.value = arguments[0];"
        "s.dispatchEvent(new Event('input'));", long_system)
    _ask(browser, QUESTION)
    out = _reply(browser)
    assert out.get_attribute("data-state") == "error"
    want = _api(served, {"messages": [{"role": "system", "content": long_system.strip()},
                                      {"role": "user", "content": QUESTION}],
                         "temperature": 0, "max_tokens": 8})["error"]["message"]
    assert "context" in want
    shown = browser.find_element(*_by(".turn .error")).text
    assert want in shown and "400" in shown
    assert browser.find_element(*_by("#status")).text.startswith("error (400)")
    assert browser.find_element(*_by("#send")).is_enabled()
    # the question that failed is back in the box, and not part of the conversation
    assert browser.find_element(*_by("#prompt")).get_attribute("value") == QUESTION
    _settings(browser, system="")
    browser.find_element(*_by("#send")).click()
    assert _reply(browser, 1).get_attribute("data-state") == "done"
    assert browser.execute_script("return window.sent")[1]["messages"] == [
        {"role": "user", "content": QUESTION}]

    # an error event in the middle of a stream (the status line had gone out): shown too, the
    # text before it kept
    _fake_stream(browser, "data: " + json.dumps({"choices": [{"index": 0, "delta": {
        "content": "w1 w2"}, "finish_reason": None}]}) + "\n\ndata: " + json.dumps(
        {"error": {"message": "the engine thread has stopped", "type": "server_error",
                   "param": None, "code": "engine_down"}}) + "\n\n")
    _ask(browser, "w3")
    out = _reply(browser, 2)
    assert out.get_attribute("data-state") == "error" and out.text == "w1 w2"
    assert "the engine thread has stopped" in browser.find_elements(*_by(".turn .error"))[-1].text
    assert browser.find_element(*_by("#send")).is_enabled()


HOSTILE = ("Hi <img src=x onerror=\"window.pwned=1\"> and <script>window.pwned=2</script>\n"
           "[x](javascript:window.pwned=3) [y](data:text/html,hi) [ok](https://example.com/a)\n"
           "**bold** *it* `<b>code</b>`\n\n```html\n<img src=x onerror=\"window.pwned=4\">\n```\n"
           "- one\n- <svg onload=\"window.pwned=5\">\n")


def test_model_text_is_markdown_and_never_markup(served, browser):
    _open(browser, served.url, record=False)
    # the renderer alone, on hostile and ordinary text
    shape = browser.execute_script("""
        const d = document.createElement('div');
        d.append(renderMarkdown(arguments[0]));
        document.body.append(d);
        const tags = [...d.querySelectorAll('*')].map((e) => e.tagName.toLowerCase());
        const links = [...d.querySelectorAll('a')].map((a) => [a.getAttribute('href'), a.rel,
                                                              a.textContent]);
        const code = [...d.querySelectorAll('pre code')].map((c) => c.textContent);
        d.remove();
        return {tags, links, code, text: d.textContent};""",
                                   HOSTILE + "\n# Title\n\n1. a\n2. b\n\nx_y_z __strong__")
    assert not {"img", "script", "svg", "iframe"} & set(shape["tags"])
    assert {"p", "strong", "em", "code", "pre", "ul", "ol", "li", "h3"} <= set(shape["tags"])
    assert shape["links"] == [["https://example.com/a", "noopener noreferrer", "ok"]]
    assert shape["code"] == ['<img src=x onerror="window.pwned=4">']
    assert "[x](javascript:window.pwned=3)" in shape["text"]
    assert "<script>window.pwned=2</script>" in shape["text"] and "x_y_z" in shape["text"]

    # one hostile reply streamed into the page (a stream made in the page: the tiny model
    # cannot say these words), its events cut across the stream's reads
    events = "".join(
        "data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": piece},
                                            "finish_reason": None}]}) + "\n\n"
        for piece in re.findall(r"[\s\S]{1,7}", HOSTILE)) + "data: [DONE]\n\n"
    _fake_stream(browser, events)
    _ask(browser, "say it")
    out = _reply(browser)
    assert out.get_attribute("data-state") == "done"
    found = browser.execute_script("""
        const log = document.getElementById('log');
        return {bad: log.querySelectorAll('img, script, svg, iframe').length,
                hrefs: [...log.querySelectorAll('a')].map((a) => a.href),
                strong: [...log.querySelectorAll('strong')].map((e) => e.textContent),
                pwned: window.pwned === undefined ? null : window.pwned};""")
    assert found == {"bad": 0, "hrefs": ["https://example.com/a"], "strong": ["bold"],
                     "pwned": None}
    assert '<img src=x onerror="window.pwned=1">' in out.text
    assert "[x](javascript:window.pwned=3)" in out.text


def test_the_page_asks_for_the_key_of_a_server_that_wants_one(tiny_model, browser):
    from clops.serve.limits import Limits

    run = start(tiny_model, parallel=2, model_name="tiny", limits=Limits(api_key="sesame"))
    try:
        _open(browser, run.url)
        # the default max tokens (512) leave no room in this context of 512 tokens: the page
        # asks again without max_tokens, which gives the reply the rest of the context
        _settings(browser, temperature=0)
        _ask(browser, QUESTION)
        # (alert_is_present: False until the prompt shows, where switch_to.alert would raise)
        from selenium.webdriver.support import expected_conditions

        alert = _wait(browser, expected_conditions.alert_is_present(), 60)
        alert.send_keys("sesame")
        alert.accept()
        out = _reply(browser)
        assert browser.find_element(*_by("#status")).text == ""
        want = _api(run, {"messages": [{"role": "user", "content": QUESTION}],
                          "temperature": 0}, key="sesame")["choices"][0]["message"]["content"]
        assert out.text == want.strip() and out.text
        sent = browser.execute_script("return window.sent")
        assert [s.get("max_tokens") for s in sent] == [512, 512, None]
    finally:
        run.stop()


# -- the screenshot of the docs ------------------------------------------------------------------
def screenshot(path: str) -> None:
    """A short exchange on the page, saved as a PNG at ``path``."""
    import tempfile

    try:
        model = clops.llm.load(None, progress=False, max_seq_len=2048)
        questions = ["What is the capital of France?",
                     "Write a Python function that returns the square of a number."]
        temperature = "0"
    except FileNotFoundError:
        tmp = tempfile.mkdtemp()
        make_model(tmp, "llama")
        model = clops.llm.load(tmp, progress=False, max_seq_len=512)
        questions, temperature = [QUESTION], "0"
    run = start(model, parallel=1, model_name="SmolLM2-135M-Instruct")
    browser = _new_browser(900, 600)
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": 900, "height": 600, "deviceScaleFactor": 1, "mobile": False})
    try:
        _open(browser, run.url, record=False)
        _settings(browser, max_tokens=120, temperature=temperature)
        browser.find_element(*_by("#settings summary")).click()  # closed again
        for i, q in enumerate(questions):
            _ask(browser, q)
            _reply(browser, i)
        browser.execute_script("const l = document.getElementById('log');"
                               "l.scrollTop = l.scrollHeight; window.scrollTo(0, 0);")
        browser.save_screenshot(path)
    finally:
        browser.quit()
        run.stop()


if __name__ == "__main__":
    screenshot(sys.argv[1] if len(sys.argv) > 1 else "docs/chat-page.png")
