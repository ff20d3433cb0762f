"""Drives headless Chromium for the web UI's tests (crates/cli/tests/ui.rs).

    driver.py CHROMIUM CHROMEDRIVER PROFILE_DIR

Reads one JSON command a line on stdin, answers one JSON line on stdout:
{"ok": true, ...} or {"ok": false, "error": "..."}. The test holds the
logic; this only speaks WebDriver (Selenium) to the distribution's
chromedriver, never downloading a browser or a driver.
"""

import json
import os
import sys
import time

os.environ.setdefault("SE_AVOID_STATS", "true")
os.environ.setdefault("SE_OFFLINE", "true")

from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as EC  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


def start(chromium, chromedriver, profile):
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for a in (
        "--headless=new",
        "--no-sandbox",  # the tests run as root
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--window-size=1400,1000",
        "--user-data-dir=" + profile,
    ):
        opts.add_argument(a)
    return webdriver.Chrome(service=Service(executable_path=chromedriver), options=opts)


def text_of(d, css):
    return d.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.textContent : null;", css
    )


def run(d, c):
    op = c["op"]
    if op == "get":
        d.get(c["url"])
        return {"url": d.current_url, "title": d.title}
    if op == "url":
        return {"url": d.current_url}
    if op == "cookies":
        # What the browser keeps, HttpOnly ones too (a thief's view of the profile).
        return {"cookies": d.get_cookies()}
    if op == "wait":
        # Until the element exists (and holds `text`, when given).
        want = c.get("text")
        deadline = time.monotonic() + c.get("timeout", 40)
        seen = None
        while time.monotonic() < deadline:
            seen = text_of(d, c["css"])
            if seen is not None and (want is None or want in seen):
                return {"text": seen}
            time.sleep(0.1)
        raise TimeoutError(f"{c['css']} {'holding ' + repr(want) if want else 'present'}: last seen {seen!r}")
    if op == "wait_gone":
        deadline = time.monotonic() + c.get("timeout", 40)
        while time.monotonic() < deadline:
            if text_of(d, c["css"]) is None:
                return {}
            time.sleep(0.1)
        raise TimeoutError(f"{c['css']} is still there")
    if op == "text":
        return {"text": text_of(d, c["css"])}
    if op == "click":
        # The page redraws parts of itself as events arrive: an element
        # replaced between finding and clicking is found again.
        for _ in range(5):
            try:
                d.find_element(By.CSS_SELECTOR, c["css"]).click()
                return {}
            except StaleElementReferenceException:
                time.sleep(0.1)
        d.find_element(By.CSS_SELECTOR, c["css"]).click()
        return {}
    if op == "type":
        e = d.find_element(By.CSS_SELECTOR, c["css"])
        e.clear()
        e.send_keys(c["text"])
        return {}
    if op == "click_confirm":
        # A click that opens window.confirm, answered.
        d.find_element(By.CSS_SELECTOR, c["css"]).click()
        alert = WebDriverWait(d, c.get("timeout", 10)).until(EC.alert_is_present())
        asked = alert.text
        if c.get("accept", True):
            alert.accept()
        else:
            alert.dismiss()
        return {"asked": asked}
    if op == "js":
        return {"value": d.execute_script(c["script"], *c.get("args", []))}
    if op == "js_async":
        return {"value": d.execute_async_script(c["script"], *c.get("args", []))}
    if op == "screenshot":
        # The whole page: the window grown to the document's height first.
        h = d.execute_script("return Math.max(document.body.scrollHeight, 600);")
        d.set_window_size(1400, min(int(h) + 140, c.get("max_height", 2400)))
        time.sleep(0.3)
        d.save_screenshot(c["path"])
        d.set_window_size(1400, 1000)
        return {"path": c["path"]}
    if op == "quit":
        return {}
    raise ValueError(f"unknown op {op!r}")


def main():
    chromium, chromedriver, profile = sys.argv[1:4]
    try:
        d = start(chromium, chromedriver, profile)
    except Exception as e:  # the test names what failed
        print(json.dumps({"ok": False, "error": f"starting Chromium ({chromium}) with {chromedriver}: {type(e).__name__}: {e}"}), flush=True)
        return 1
    print(json.dumps({"ok": True, "version": d.capabilities.get("browserVersion")}), flush=True)
    try:
        for line in sys.stdin:
            c = json.loads(line)
            try:
                out = run(d, c)
                out["ok"] = True
            except (Exception, TimeoutException) as e:
                out = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            print(json.dumps(out), flush=True)
            if c["op"] == "quit":
                break
    finally:
        d.quit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
