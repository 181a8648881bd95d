"""The chat page at ``/`` in a real headless browser (Chromium driven by Selenium): a question
typed into the page streams an answer from the API into it, the same text the API gives."""

from __future__ import annotations

import shutil

import pytest

import clops.llm

from ..llm.tiny import make_model
from .conftest import start

webdriver = pytest.importorskip(
    "selenium.webdriver", reason="Selenium is not installed (pip install selenium)")


def _browser():
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
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        opts.add_argument(a)
    return webdriver.Chrome(service=Service(driver), options=opts)


def test_the_page_streams_the_apis_answer(tmp_path):
    import httpx
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    make_model(str(tmp_path), "llama")
    model = clops.llm.load(str(tmp_path), progress=False, max_seq_len=512)
    run = start(model, parallel=2, model_name="tiny")
    browser = _browser()
    try:
        browser.get(run.url + "/")
        box = browser.find_element(By.ID, "prompt")
        box.send_keys("w4 w5 w6")
        browser.find_element(By.ID, "send").click()
        WebDriverWait(browser, 120).until(
            lambda b: b.find_element(By.CSS_SELECTOR, ".assistant").get_attribute("data-done")
            == "1")
        shown = browser.find_element(By.CSS_SELECTOR, ".assistant").text
        assert browser.find_element(By.ID, "status").text == ""
        want = httpx.post(run.url + "/v1/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": "w4 w5 w6"}],
            "temperature": 0}).json()["choices"][0]["message"]["content"]
        assert shown == want.strip() and shown
    finally:
        browser.quit()
        run.stop()


def test_the_page_asks_for_the_key_of_a_server_that_wants_one(tmp_path):
    import httpx
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from clops.serve.limits import Limits

    make_model(str(tmp_path), "llama")
    model = clops.llm.load(str(tmp_path), progress=False, max_seq_len=512)
    run = start(model, parallel=2, model_name="tiny", limits=Limits(api_key="sesame"))
    browser = _browser()
    try:
        browser.get(run.url + "/")
        browser.find_element(By.ID, "prompt").send_keys("w4 w5 w6")
        browser.find_element(By.ID, "send").click()
        alert = WebDriverWait(browser, 60).until(lambda b: b.switch_to.alert)
        alert.send_keys("sesame")
        alert.accept()
        WebDriverWait(browser, 120).until(
            lambda b: b.find_element(By.CSS_SELECTOR, ".assistant").get_attribute("data-done")
            == "1")
        assert browser.find_element(By.ID, "status").text == ""
        want = httpx.post(run.url + "/v1/chat/completions", timeout=120,
                          headers={"Authorization": "Bearer sesame"}, json={
                              "messages": [{"role": "user", "content": "w4 w5 w6"}],
                              "temperature": 0}).json()["choices"][0]["message"]["content"]
        shown = browser.find_element(By.CSS_SELECTOR, ".assistant").text
        assert shown == want.strip() and shown
    finally:
        browser.quit()
        run.stop()
