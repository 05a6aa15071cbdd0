"""The dashboard in a real browser (headless Chromium driven through chromedriver) while a real
training job runs on a real cluster and one of its daemons is killed: the job's graph, its
timeline and the recovery must appear, and update live, without reloading the page.
Screenshots go to OUT_DIR.

usage: dashboard_browser_test.py COPSE REPO OUT_DIR   (exit 77: skipped, with the reason)"""

import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from cluster import Cluster, training_job  # noqa: E402


def skip(why):
    print(f"skipped: {why}")
    sys.exit(77)


try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.common.exceptions import StaleElementReferenceException
except ImportError:
    skip("python3-selenium is not installed")
for exe in ("/usr/bin/chromium", "/usr/bin/chromedriver"):
    if not os.path.exists(exe):
        skip(f"{exe} is missing (Debian chromium and chromium-driver)")

copse, repo, out_dir = sys.argv[1:4]
os.makedirs(out_dir, exist_ok=True)


def wait_for(what, check, timeout=60, interval=0.1):
    """Polls check() until it returns something true. The dashboard re-renders its tables as
    updates arrive, so an element found a moment ago may be gone: that is a retry, not a failure."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            value = check()
        except StaleElementReferenceException:
            value = None
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def column_texts(driver, selector, column):
    """The text of one column in every row that matches selector, read in one script call so a
    re-render between finding the rows and reading them cannot split the answer."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]))"
        ".map(r => r.cells[arguments[1]] ? r.cells[arguments[1]].innerText : '')", selector, column)


def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    profile = tempfile.mkdtemp(prefix="copse-chromium-")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1400,1600", f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    try:
        return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts), profile
    except Exception as e:  # noqa: BLE001 - a browser that cannot start here is a skip, not a failure
        skip(f"Chromium did not start: {str(e).splitlines()[0]}")


with Cluster(copse, daemons=3, cpus=2) as cluster:
    driver, profile = browser()
    try:
        driver.set_page_load_timeout(30)
        # Without a credential the page asks for one.
        driver.get(f"http://{cluster.http}/")
        wait_for("the login form", lambda: driver.find_element(By.ID, "login").is_displayed())
        # The viewer token's link (what `copse dashboard` prints) logs in, read only.
        import subprocess
        link = subprocess.run([copse, "dashboard", "--state-dir", cluster.state], capture_output=True, text=True,
                              check=True, timeout=30).stdout.strip()
        assert link.startswith(f"http://{cluster.http}/#token="), link
        driver.get(link)
        wait_for("read-only access", lambda: driver.find_element(By.ID, "access").text == "read only")

        job = cluster.submit(training_job(repo, kill_after=500))
        driver.get(f"http://{cluster.http}/#/jobs/{job}")
        view = driver.find_element(By.ID, "job-view")
        stages = wait_for("the job's graph", lambda: driver.find_elements(By.CSS_SELECTOR, "#dag g.stage"))
        assert len(stages) == 9, f"{len(stages)} stages drawn"
        assert len(driver.find_elements(By.CSS_SELECTOR, "#dag path.edge")) >= 8
        timeline = driver.find_element(By.ID, "timeline")
        wait_for("spans on the timeline", lambda: int(timeline.get_attribute("data-spans") or 0) > 0)

        # Live: the completed count and the timeline grow with no reload.
        first = int(wait_for("a completed count", lambda: view.get_attribute("data-completed")))
        spans_before = int(timeline.get_attribute("data-spans"))
        later = wait_for("the count to grow", lambda: int(view.get_attribute("data-completed") or 0) > first and
                         int(view.get_attribute("data-completed")))
        wait_for("the timeline to grow", lambda: int(timeline.get_attribute("data-spans")) > spans_before)
        print(f"live: completed {first} -> {later}, timeline spans {spans_before} -> {timeline.get_attribute('data-spans')}")
        driver.save_screenshot(os.path.join(out_dir, "dashboard-running.png"))

        # The kill and the recovery show up: in the faults and recoveries tables and on the timeline.
        wait_for("the injected kill", lambda: any("kill_daemon_of" in r.text for r in
                                                   driver.find_elements(By.CSS_SELECTOR, "#faults tbody tr")), timeout=120)
        wait_for("a recovery row", lambda: driver.find_elements(By.CSS_SELECTOR, "#recoveries tbody tr"), timeout=120)
        wait_for("recoveries on the timeline", lambda: int(timeline.get_attribute("data-recoveries") or 0) > 0)
        wait_for("the job to complete", lambda: view.get_attribute("data-state") == "completed", timeout=240)
        wait_for("the final timeline", lambda: int(timeline.get_attribute("data-spans")) >= 1703, timeout=30)
        failed_spans = driver.execute_script(
            "return timeline.boxes.filter(b => b.outcome !== 'completed' && b.outcome !== 'running').length")
        assert failed_spans > 0, "the killed daemon's attempts are not drawn as failed"
        # The loss curve.
        wait_for("the loss curve to its last step", lambda: driver.find_element(By.CSS_SELECTOR, "#progress-chart svg")
                 .get_attribute("data-last-step") == "50", timeout=30)
        # A read-only viewer is not offered the cancel button.
        assert not driver.find_element(By.ID, "job-cancel").is_displayed()
        driver.save_screenshot(os.path.join(out_dir, "dashboard-recovered.png"))

        # A vertex's log opens from its row.
        wait_for("a vertex row to click", lambda: driver.find_element(By.CSS_SELECTOR, "#vertices tbody tr").click() or True)
        wait_for("a vertex log", lambda: driver.find_element(By.ID, "log-panel").is_displayed() and
                 driver.find_element(By.ID, "log").text)

        # The daemons: the killed one is lost, the others alive.
        driver.get(f"http://{cluster.http}/#/daemons")
        states = sorted(wait_for("the daemons table", lambda: column_texts(driver, "#daemons tbody tr", 1)))
        assert states.count("alive") == 2 and states.count("lost") == 1, states
        driver.save_screenshot(os.path.join(out_dir, "dashboard-daemons.png"))

        # The job list keeps the job, finished.
        driver.get(f"http://{cluster.http}/#/")
        wait_for("the job list", lambda: any("completed" in r.text for r in
                                            driver.find_elements(By.CSS_SELECTOR, "#jobs tbody tr")))
        print(f"dashboard test passed; screenshots in {out_dir}")
    except Exception:
        driver.save_screenshot(os.path.join(out_dir, "dashboard-failure.png"))
        print("job manager log:\n" + cluster.log("jm"))
        raise
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
