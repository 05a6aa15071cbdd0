"""The job manager's HTTP API against a real cluster: who may read and who may act, every
endpoint's answer, the errors that name what was wrong, the live event stream and its bound.

usage: api_test.py COPSE REPO"""

import http.client
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from cluster import Cluster  # noqa: E402

copse, repo = sys.argv[1:3]


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def open_stream(cluster, path, token):
    host, port = cluster.http.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("GET", path, headers={"Authorization": "Bearer " + token})
    return conn, conn.getresponse()


def next_event(res, name, deadline_s=10):
    """The data of the next event called `name` on an SSE response."""
    deadline = time.time() + deadline_s
    event = None
    while time.time() < deadline:
        line = res.fp.readline().decode().rstrip("\n")
        if line.startswith("event: "):
            event = line[len("event: "):]
        elif line.startswith("data: ") and event == name:
            return json.loads(line[len("data: "):])
    raise AssertionError(f"no {name} event within {deadline_s} s")


with Cluster(copse, daemons=2, cpus=2) as cluster:
    link = subprocess.run([copse, "dashboard", "--state-dir", cluster.state], capture_output=True, text=True, check=True).stdout
    viewer = link.strip().split("token=", 1)[1]
    check(viewer != cluster.secret and len(viewer) == 64, "the viewer token is derived, not the secret")
    admin_link = subprocess.run([copse, "dashboard", "--admin", "--state-dir", cluster.state], capture_output=True, text=True,
                                check=True).stdout.strip()
    admin = admin_link.split("#token=", 1)[1]
    check(admin not in (cluster.secret, viewer), "the admin link carries a derived token, never the secret")

    # ---- who may read, who may act ---------------------------------------------------------
    status, body = cluster.request("/api/v1/jobs", token="")
    check(status == 401 and "log in" in body["error"], f"no credential: {status} {body}")
    status, _ = cluster.request("/api/v1/jobs", token="0" * 64)
    check(status == 401, f"a wrong token: {status}")
    check(cluster.request("/api/v1/jobs", token=viewer)[0] == 200, "the viewer token reads")
    check(cluster.get("/api/v1/whoami", token=viewer)["access"] == "viewer", "whoami: viewer")
    check(cluster.get("/api/v1/whoami")["access"] == "admin", "whoami: admin (the secret)")
    check(cluster.get("/api/v1/whoami", token=admin)["access"] == "admin", "whoami: admin (the admin token)")
    req = urllib.request.Request(f"http://{cluster.http}/api/v1/whoami", headers={"Authorization": "bearer " + viewer})
    with urllib.request.urlopen(req) as res:
        check(json.loads(res.read())["access"] == "viewer", "the scheme's case does not matter")
    status, page = cluster.request("/", token="", raw=True)
    check(status == 200 and "<title>copse</title>" in page, "the dashboard page is served to anyone (it holds no data)")
    check(cluster.request("/dashboard.js", token="", raw=True)[0] == 200, "the dashboard's script")

    # Logging in sets a session cookie a browser presents instead of the token.
    req = urllib.request.Request(f"http://{cluster.http}/api/v1/login", data=json.dumps({"token": viewer}).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as res:
        cookie = res.headers["Set-Cookie"]
    check("HttpOnly" in cookie and "SameSite=Strict" in cookie, f"the session cookie: {cookie}")
    req = urllib.request.Request(f"http://{cluster.http}/api/v1/whoami", headers={"Cookie": cookie.split(";")[0]})
    with urllib.request.urlopen(req) as res:
        check(json.loads(res.read())["access"] == "viewer", "the cookie logs in as viewer")
    status, body = cluster.request("/api/v1/login", method="POST", body={"token": "nope"}, token="")
    check(status == 401 and "wrong token" in body["error"], f"a wrong login: {status} {body}")

    # ---- a job, and every view of it --------------------------------------------------------
    job_file = json.load(open(os.path.join(repo, "examples/diamond.json")))
    job_file["faults"] = [{"delay": "sink", "ms": 4000}]
    job = cluster.submit(job_file)

    # The event stream sends the job's status as it changes.
    conn, res = open_stream(cluster, f"/api/v1/events?job={job}", viewer)
    check(res.status == 200 and res.getheader("Content-Type").startswith("text/event-stream"), "an event stream")
    first = next_event(res, "job")
    check(first["id"] == job and first["state"] == "running", f"the stream's first status: {first}")
    jobs_event = next_event(res, "jobs")
    check(any(j["id"] == job for j in jobs_event["jobs"]), "the stream's jobs table")
    conn.close()

    status = cluster.get(f"/api/v1/jobs/{job}", token=viewer)
    check([s["name"] for s in status["stages"]] == ["source", "left", "right", "sink"], "stages")
    check(["source", "left", "file"] in status["edges"] and ["right", "sink", "memory"] in status["edges"], status["edges"])
    page = cluster.get(f"/api/v1/jobs/{job}/vertices?stage=left&limit=2", token=viewer)
    check(page["total"] == 3 and [v["name"] for v in page["vertices"]] == ["left[0]", "left[1]"], page)
    page = cluster.get(f"/api/v1/jobs/{job}/vertices?stage=left&offset=2", token=viewer)
    check([v["name"] for v in page["vertices"]] == ["left[2]"], page)
    page = cluster.get(f"/api/v1/jobs/{job}/vertices?state=running", token=viewer)
    check([v["name"] for v in page["vertices"]] == ["sink[0]"] or page["total"] == 0, page)

    # Acting with a session cookie needs the header a page of another origin cannot send.
    req = urllib.request.Request(f"http://{cluster.http}/api/v1/login", data=json.dumps({"token": admin}).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as res:
        admin_cookie = res.headers["Set-Cookie"].split(";")[0]
    req = urllib.request.Request(f"http://{cluster.http}/api/v1/chaos", data=b'{"action": "stop"}', method="POST",
                                 headers={"Cookie": admin_cookie, "Content-Type": "text/plain"})
    try:
        urllib.request.urlopen(req)
        check(False, "a cookie POST without X-Copse-Request was accepted")
    except urllib.error.HTTPError as e:
        check(e.code == 403 and "X-Copse-Request" in json.loads(e.read())["error"], f"CSRF: {e.code}")

    # Acting needs the secret.
    status, body = cluster.request(f"/api/v1/jobs/{job}/cancel", method="POST", body={}, token=viewer)
    check(status == 403 and "secret" in body["error"], f"a viewer cancels: {status} {body}")
    status, body = cluster.request("/api/v1/chaos", method="POST", body={"action": "kill", "daemon": "nobody"})
    check(status == 400 and "nobody" in body["error"], f"chaos on no such daemon: {status} {body}")
    status, body = cluster.request("/api/v1/chaos", method="POST", body={"action": "cut", "daemon": "d0", "ms": 1e300})
    check(status == 400 and '"ms"' in body["error"], f"a number out of its range: {status} {body}")
    status, body = cluster.request("/api/v1/chaos", method="POST", body=["not", "an", "object"])
    check(status == 400 and "JSON object" in body["error"], f"a chaos body that is no object: {status} {body}")
    status, body = cluster.request(f"/api/v1/jobs/{job}/cancel", method="POST", body={})
    check(status == 200, f"the admin cancels: {status} {body}")
    check(cluster.wait_job(job)["state"] == "cancelled", "cancelled")
    status, body = cluster.request(f"/api/v1/jobs/{job}/cancel", method="POST", body={})
    check(status == 400 and "already cancelled" in body["error"], f"cancel twice: {status} {body}")

    # A job that completes: timeline, logs, a vertex's log, the trace, the outputs.
    job2 = cluster.submit(json.load(open(os.path.join(repo, "examples/diamond.json"))), "diamond.json")
    check(cluster.wait_job(job2)["state"] == "completed", "the second job completes")
    tl = cluster.get(f"/api/v1/jobs/{job2}/timeline?limit=2", token=viewer)
    check(len(tl["spans"]) == 2 and tl["total_spans"] == 7 and sorted(tl["daemons"]) == ["d0", "d1"], tl)
    check(all(s[3] == "completed" and s[2] >= s[1] for s in tl["spans"]), tl["spans"])
    logs = cluster.get(f"/api/v1/jobs/{job2}/logs?vertex=sink[0]", token=viewer)
    check(any("sink[0]" in line and "completed" in line for line in logs["lines"]), logs)
    vlog = cluster.get(f"/api/v1/jobs/{job2}/vertex_log?vertex=sink[0]", token=viewer)
    check(vlog["attempt"] == 1 and vlog["running"] is False, vlog)
    status, trace = cluster.request(f"/api/v1/jobs/{job2}/trace", token=viewer, raw=True)
    trace = json.loads(trace)
    check(status == 200 and sum(e.get("ph") == "X" for e in trace["traceEvents"]) == 7 and "otherData" in trace, trace)
    outputs = cluster.get(f"/api/v1/jobs/{job2}/outputs", token=viewer)
    check(outputs["outputs"][0]["path"] == "digest.txt", outputs)
    jobs = cluster.get("/api/v1/jobs", token=viewer)["jobs"]
    check([(j["id"], j["state"]) for j in jobs] == [(job, "cancelled"), (job2, "completed")], jobs)

    # ---- bad requests name what was wrong ----------------------------------------------------
    status, body = cluster.request("/api/v1/jobs/999", token=viewer)
    check(status == 404 and body["error"] == "no job 999", f"{status} {body}")
    status, body = cluster.request(f"/api/v1/jobs/{job2}/vertices?limit=0", token=viewer)
    check(status == 400 and "limit" in body["error"] and "[1, 1000]" in body["error"], f"{status} {body}")
    status, body = cluster.request(f"/api/v1/jobs/{job2}/vertices?offset=x", token=viewer)
    check(status == 400 and "offset" in body["error"], f"{status} {body}")
    status, body = cluster.request(f"/api/v1/jobs/{job2}/vertex_log", token=viewer)
    check(status == 400 and "vertex" in body["error"], f"{status} {body}")
    status, body = cluster.request(f"/api/v1/jobs/{job2}/logs?vertex=nosuch", token=viewer)
    check(status == 404 and "nosuch" in body["error"], f"{status} {body}")
    status, body = cluster.request("/api/v1/events?job=abc", token=viewer)
    check(status == 400 and "job" in body["error"], f"{status} {body}")

    # ---- history outlives the job manager: the views of finished jobs after a restart --------
    cluster.restart_jm()
    jobs = cluster.get("/api/v1/jobs", token=viewer)["jobs"]
    check([(j["id"], j["state"]) for j in jobs] == [(job, "cancelled"), (job2, "completed")], f"after a restart: {jobs}")
    tl = cluster.get(f"/api/v1/jobs/{job2}/timeline", token=viewer)
    check(len(tl["spans"]) == 7 and tl["state"] == "completed", f"a timeline after a restart: {tl}")
    check(cluster.get(f"/api/v1/jobs/{job2}", token=viewer)["stages"][3]["completed"] == 1, "a status after a restart")

    # ---- at most 8 streams at once; the job manager answers the rest -------------------------
    time.sleep(3)  # the stream closed above is noticed at its next write (a comment each second)
    streams = [open_stream(cluster, "/api/v1/events", viewer) for _ in range(8)]
    check(all(r.status == 200 for _, r in streams), "8 streams")
    conn, res = open_stream(cluster, "/api/v1/events", viewer)
    check(res.status == 503 and "too many" in json.loads(res.read())["error"], f"a 9th stream: {res.status}")
    conn.close()
    check(cluster.get("/api/v1/daemons", token=viewer)["daemons"][0]["alive"], "requests still served beside 8 streams")
    for c, _ in streams:
        c.close()
    print("HTTP API test passed")

# ---- a job the scheduler has forgotten (--finished-job-ttl-s 0) is served from its history ----
with Cluster(copse, daemons=1, extra_jm_flags=("--finished-job-ttl-s", "0")) as cluster:
    job = cluster.submit(json.load(open(os.path.join(repo, "examples/diamond.json"))))
    deadline = time.time() + 30
    while not any(j.get("forgotten") for j in cluster.get("/api/v1/jobs")["jobs"]):
        check(time.time() < deadline, "the job is never forgotten")
        time.sleep(0.1)
    status = cluster.get(f"/api/v1/jobs/{job}")
    check(status["forgotten"] and status["state"] == "completed" and len(status["edges"]) == 4, status)
    page = cluster.get(f"/api/v1/jobs/{job}/vertices?stage=left")
    check([(v["name"], v["state"]) for v in page["vertices"]] == [(f"left[{i}]", "completed") for i in range(3)], page)
    tl = cluster.get(f"/api/v1/jobs/{job}/timeline?limit=3")
    check(len(tl["spans"]) == 3 and tl["total_spans"] == 7, tl)
    check(cluster.get(f"/api/v1/jobs/{job}/progress")["points"] == [], "no progress figures")
    status, body = cluster.request(f"/api/v1/jobs/{job}/outputs")
    check(status == 400 and "released" in body["error"], f"{status} {body}")
    print("forgotten jobs: served from the history")
